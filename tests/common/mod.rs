//! Helpers shared by the suites.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::execution::SessionStateBuilder;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu_join::backend::{BackendHandle, Devices, cuda_backend};
use datafusion_gpu_join::config::{BackendChoice, DeviceList, GpuJoinConfig};
use datafusion_gpu_join::{GpuJoinExec, SessionStateBuilderExt};

/// The backend the suites run on: `GPU_JOIN_TEST_BACKEND` (cpu or cuda).
pub fn test_backend_choice() -> BackendChoice {
    match std::env::var("GPU_JOIN_TEST_BACKEND") {
        Ok(value) => value.parse().expect("GPU_JOIN_TEST_BACKEND must be cpu or cuda"),
        Err(_) => BackendChoice::Cpu,
    }
}

/// The session options the suites use: the test backend, every join on it.
pub fn test_options() -> GpuJoinConfig {
    let mut options = GpuJoinConfig::default();
    options.backend = test_backend_choice();
    options.min_rows = 0;
    options.min_build_rows = 0;
    options.aggregate_min_key_values = 0;
    options
}

/// The backend handle for plans built by hand.
pub fn test_backend() -> BackendHandle {
    let options = test_options();
    match options.backend {
        BackendChoice::Cuda => cuda_backend(&options).expect("the CUDA backend must be usable"),
        _ => BackendHandle::Cpu,
    }
}

/// `count` devices of the test backend, as `gpu_join.devices` lists them
/// ([`devices_setting`]).
pub fn test_devices(count: usize) -> Devices {
    let mut options = test_options();
    options.devices = devices_setting(count).parse::<DeviceList>().expect("a list of devices");
    match options.backend {
        BackendChoice::Cuda => Devices::cuda(&options).expect("the CUDA backend must be usable"),
        _ => Devices::cpu(&options),
    }
}

/// `gpu_join.devices` for `count` devices of the test backend: distinct
/// instances `0,1,…` on the CPU backend, the one GPU of a GPU machine
/// listed `count` times on CUDA.
pub fn devices_setting(count: usize) -> String {
    let ordinals: Vec<String> = match test_backend_choice() {
        BackendChoice::Cuda => vec!["0".to_string(); count],
        _ => (0..count).map(|ordinal| ordinal.to_string()).collect(),
    };
    ordinals.join(",")
}

/// A session with the GPU join on, running every join on the test backend.
pub fn gpu_context(config: SessionConfig) -> SessionContext {
    gpu_context_with(config, test_options())
}

/// A session with the GPU join on and these options.
pub fn gpu_context_with(config: SessionConfig, options: GpuJoinConfig) -> SessionContext {
    let config = config.with_option_extension(options);
    let state = SessionStateBuilder::new().with_default_features().with_config(config).with_gpu_join().build();
    SessionContext::new_with_state(state)
}

/// A plain DataFusion session: the reference.
pub fn datafusion_context(config: SessionConfig) -> SessionContext {
    SessionContext::new_with_state(SessionStateBuilder::new().with_default_features().with_config(config).build())
}

/// Every row as `a|b|c`, sorted: results compared as multisets.
pub fn sorted_rows(batches: &[RecordBatch]) -> Vec<String> {
    let options = FormatOptions::default().with_null("NULL");
    let mut rows = vec![];
    for batch in batches {
        let formatters: Vec<_> = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).expect("formattable column"))
            .collect();
        for row in 0..batch.num_rows() {
            rows.push(formatters.iter().map(|f| f.value(row).to_string()).collect::<Vec<_>>().join("|"));
        }
    }
    rows.sort();
    rows
}

/// Runs a query and returns its batches.
pub async fn run(ctx: &SessionContext, sql: &str) -> Vec<RecordBatch> {
    ctx.sql(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}")).collect().await.unwrap_or_else(|e| panic!("{sql}: {e}"))
}

pub fn total_rows(batches: &[RecordBatch]) -> usize {
    batches.iter().map(RecordBatch::num_rows).sum()
}

/// The physical plan of a query, as EXPLAIN shows it.
pub async fn physical_plan_text(ctx: &SessionContext, sql: &str) -> String {
    let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
    datafusion::physical_plan::displayable(plan.as_ref()).indent(true).to_string()
}

/// Every GPU join in a plan.
pub fn gpu_joins(plan: &Arc<dyn ExecutionPlan>) -> Vec<&GpuJoinExec> {
    let mut joins: Vec<&GpuJoinExec> = plan.children().into_iter().flat_map(gpu_joins).collect();
    joins.extend(plan.downcast_ref::<GpuJoinExec>());
    joins
}

/// Metrics of the query's first GPU join, by name, from EXPLAIN ANALYZE.
pub async fn join_metrics<const N: usize>(ctx: &SessionContext, query: &str, names: [&str; N]) -> [Option<usize>; N] {
    let text = sorted_rows(&run(ctx, &format!("explain analyze {query}")).await).join("\n");
    names.map(|name| {
        let at = text.find(&format!("{name}="))? + name.len() + 1;
        text[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    })
}
