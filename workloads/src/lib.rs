//! Benchmark workloads run through a session: TPC-H ([`tpch`]) and TPC-DS
//! ([`tpcds`]), held in memory or read from Parquet files, with what both
//! need to run their queries and compare the rows of two sessions.

mod parquet;
pub mod tpcds;
pub mod tpch;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Float64Type, SchemaRef};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::catalog::{MemTable, SchemaProvider};
use datafusion::common::exec_datafusion_err;
use datafusion::error::Result;
use datafusion::physical_plan::metrics::MetricValue;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::SessionContext;
use datafusion_distributed::{DistributedMetricsFormat, rewrite_distributed_plan_with_metrics};

use datafusion_gpu_join::GpuJoinContextExt;

/// Registers a table generated in parts as an in-memory table with one
/// partition per part.
fn register_parts(ctx: &SessionContext, table: &str, parts: Vec<(SchemaRef, Vec<RecordBatch>)>) -> Result<()> {
    let schema =
        parts.first().map(|(s, _)| Arc::clone(s)).ok_or_else(|| exec_datafusion_err!("{table}: nothing generated"))?;
    let partitions: Vec<Vec<RecordBatch>> = parts.into_iter().map(|(_, batches)| batches).collect();
    ctx.register_table(table, Arc::new(MemTable::try_new(schema, partitions)?))?;
    Ok(())
}

/// Registers every table of `from`'s default schema in `to`, as the same
/// providers: two sessions compared then read one copy of the data, from
/// the same memory, rather than copies generated apart.
pub async fn share_tables(from: &SessionContext, to: &SessionContext) -> Result<()> {
    let schema = default_schema(from)?;
    for name in schema.table_names() {
        if let Some(table) = schema.table(&name).await? {
            to.register_table(name.as_str(), table)?;
        }
    }
    Ok(())
}

/// Registers every table of `ctx`'s default schema again, its batches kept
/// in pinned memory ([`GpuJoinContextExt::gpu_join_pin_batches`]), in the
/// partitions it had: for in-memory tables that are joined again and again.
/// Where the session would not join on a CUDA device, each is registered
/// again over the same batches. The copies and the pinned allocations run
/// on tokio's blocking pool, off the async workers.
pub async fn pin_tables(ctx: &SessionContext) -> Result<()> {
    for name in default_schema(ctx)?.table_names() {
        let table = ctx.table(name.as_str()).await?;
        let table_schema = Arc::clone(table.schema().inner());
        let (pinning, partitions) = (ctx.clone(), table.collect_partitioned().await?);
        let pinned = tokio::task::spawn_blocking(move || pinning.gpu_join_pin_batches(partitions))
            .await
            .map_err(|e| exec_datafusion_err!("pinning table {name}: {e}"))??;
        ctx.deregister_table(name.as_str())?;
        ctx.register_table(name.as_str(), Arc::new(MemTable::try_new(table_schema, pinned)?))?;
    }
    Ok(())
}

/// The schema `ctx` registers tables in by default.
fn default_schema(ctx: &SessionContext) -> Result<Arc<dyn SchemaProvider>> {
    let state = ctx.state();
    let defaults = &state.config().options().catalog;
    ctx.catalog(&defaults.default_catalog)
        .and_then(|catalog| catalog.schema(&defaults.default_schema))
        .ok_or_else(|| exec_datafusion_err!("no default schema {}", defaults.default_schema))
}

/// Whether a statement returns rows (a `SELECT`, or one led by `WITH`).
pub fn is_query(statement: &str) -> bool {
    let lower = statement.trim_start().to_ascii_lowercase();
    lower.starts_with("select") || lower.starts_with("with") || lower.starts_with('(')
}

/// Runs `statements` in order and returns the rows of every query among
/// them, one after another.
pub async fn run_statements(ctx: &SessionContext, statements: &[String]) -> Result<Vec<RecordBatch>> {
    Ok(run_statements_timed(ctx, statements).await?.rows)
}

/// One run of a query's statements.
pub struct Run {
    /// The rows of every query among the statements, one after another.
    pub rows: Vec<RecordBatch>,
    /// The time the statements took, planning included.
    pub elapsed: Duration,
    /// The part of the run spent planning (SQL to the physical plan, the
    /// session's optimizer rules included).
    pub planning: Duration,
    /// The CPU time of the whole process over `elapsed`, every thread's,
    /// user and system: divided by `elapsed`, the cores it kept busy, which
    /// tells a session that waits from one that computes. `None` where the
    /// system does not report it.
    pub process_cpu: Option<Duration>,
    /// The time each kind of operator of the executed plans was at work,
    /// summed over its partitions and its nodes, the largest first: a
    /// partition's thread waiting for a core counts, so on a busy host the
    /// entries add up to more than the process's CPU time.
    pub operators: Vec<(String, Duration)>,
    /// What the GPU joins of the executed plans did, summed over their
    /// partitions and nodes.
    pub gpu_joins: GpuWork,
    /// What the GPU aggregations did, likewise.
    pub gpu_aggregates: GpuWork,
}

/// One kind of GPU operator's work in a run (its joins' or its
/// aggregations'): where its time went, and what it moved over the bus.
#[derive(Debug, Default)]
pub struct GpuWork {
    /// The time of each timed part (`build_collect_time`,
    /// `materialize_time`, `group_time`, …).
    pub parts: BTreeMap<String, Duration>,
    pub bytes_to_device: usize,
    pub bytes_from_device: usize,
}

/// As [`run_statements`], with the time spent planning and in each kind of
/// operator. The operators of a distributed plan are its stages' on every
/// worker, as the workers report them once their tasks end; waiting for
/// those reports is not counted in the run's time.
pub async fn run_statements_timed(ctx: &SessionContext, statements: &[String]) -> Result<Run> {
    let (mut rows, mut elapsed, mut planning) = (vec![], Duration::ZERO, Duration::ZERO);
    let (mut operators, mut gpu_joins, mut gpu_aggregates) = (BTreeMap::new(), GpuWork::default(), GpuWork::default());
    let mut process_cpu = Some(Duration::ZERO);
    for statement in statements {
        let (start, cpu_start) = (Instant::now(), cpu_time());
        let frame = ctx.sql(statement).await?;
        let task = Arc::new(frame.task_ctx());
        let plan = frame.create_physical_plan().await?;
        planning += start.elapsed();
        let batches = collect(Arc::clone(&plan), task).await?;
        elapsed += start.elapsed();
        process_cpu = match (process_cpu, cpu_start, cpu_time()) {
            (Some(sum), Some(before), Some(after)) => Some(sum + after.saturating_sub(before)),
            _ => None,
        };
        let plan = rewrite_distributed_plan_with_metrics(plan, DistributedMetricsFormat::Aggregated).await?;
        add_operator_times(&plan, &mut operators, &mut gpu_joins, &mut gpu_aggregates);
        if is_query(statement) {
            rows.extend(batches);
        }
    }
    let mut operators: Vec<_> = operators.into_iter().collect();
    operators.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Ok(Run { rows, elapsed, planning, process_cpu, operators, gpu_joins, gpu_aggregates })
}

/// The CPU time this process has used so far, every thread's, user and
/// system; `None` where the system does not report it.
fn cpu_time() -> Option<Duration> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: `getrusage` fills the `rusage` it is given when it returns 0,
    // and only then is it read.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
            return None;
        }
        usage.assume_init()
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, 1000 * t.tv_usec as u32);
    Some(time(usage.ru_utime) + time(usage.ru_stime))
}

/// Adds the time each node of an executed plan was at work to its operator's
/// entry: the time of its own work, which for a scan of files is the time
/// its streams spent decoding (`time_elapsed_processing`: its
/// `elapsed_compute` counts only the polls), for a repartition the time it
/// spent hashing and splitting batches (`repartition_time`), and for the
/// other operators their `elapsed_compute`. A node's own time is meant to
/// leave out its children's, so the entries add up to about the plan's time
/// at work.
///
/// The stages of a distributed plan are the coordinator's copies, with the
/// joins it planned; a join whose metrics are a GPU join's (it moved bytes
/// to a device) ran as one on its worker, and is counted as one. A GPU
/// join's timed parts and the bytes it moved go to `gpu_joins` as well, a
/// GPU aggregation's to `gpu_aggregates`.
fn add_operator_times(
    plan: &Arc<dyn ExecutionPlan>,
    operators: &mut BTreeMap<String, Duration>,
    gpu_joins: &mut GpuWork,
    gpu_aggregates: &mut GpuWork,
) {
    if let Some(metrics) = plan.metrics() {
        let own_work = |name| metrics.sum_by_name(name).map(|value| value.as_usize());
        let nanos = own_work("time_elapsed_processing")
            .or_else(|| own_work("repartition_time"))
            .or_else(|| metrics.elapsed_compute())
            .unwrap_or(0);
        let name = match own_work("bytes_to_device") {
            Some(bytes_to_device) => {
                let (name, work) = match plan.name() {
                    "GpuAggregateExec" => ("GpuAggregateExec", &mut *gpu_aggregates),
                    _ => ("GpuJoinExec", &mut *gpu_joins),
                };
                work.bytes_to_device += bytes_to_device;
                work.bytes_from_device += own_work("bytes_from_device").unwrap_or(0);
                // Per-device shares (`device0_time`) repeat the totals.
                for value in metrics.iter().map(|metric| metric.value()) {
                    if let MetricValue::Time { name, time } = value
                        && !name.starts_with("device")
                    {
                        *work.parts.entry(name.to_string()).or_default() += Duration::from_nanos(time.value() as u64);
                    }
                }
                name
            }
            None => plan.name(),
        };
        *operators.entry(name.to_string()).or_default() += Duration::from_nanos(nanos as u64);
    }
    for child in plan.children() {
        add_operator_times(child, operators, gpu_joins, gpu_aggregates);
    }
}

/// Result rows as text cells, in order.
pub fn result_cells(batches: &[RecordBatch]) -> Result<Vec<Vec<String>>> {
    let options = FormatOptions::default().with_null("NULL");
    let mut rows = vec![];
    for batch in batches {
        let formatters = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        for row in 0..batch.num_rows() {
            rows.push(formatters.iter().map(|f| f.value(row).to_string()).collect());
        }
    }
    Ok(rows)
}

/// Result rows as text cells, sorted, with floating-point values to ten
/// significant digits: two plans that sum floats in another order agree
/// to about that many, and the queries' `ORDER BY` may leave ties in any
/// order.
pub fn comparable_rows(batches: &[RecordBatch]) -> Result<Vec<Vec<String>>> {
    let mut rows = result_cells(batches)?;
    let mut at = 0;
    for batch in batches {
        for (column, array) in batch.columns().iter().enumerate() {
            if !matches!(array.data_type(), DataType::Float16 | DataType::Float32 | DataType::Float64) {
                continue;
            }
            let values = cast(array, &DataType::Float64)?;
            let values = values.as_primitive::<Float64Type>();
            for row in (0..values.len()).filter(|&r| values.is_valid(r)) {
                rows[at + row][column] = format!("{:.9e}", values.value(row));
            }
        }
        at += batch.num_rows();
    }
    rows.sort();
    Ok(rows)
}
