//! A query that DataFusion completes completes with the GPU join on, with
//! DataFusion's rows, however large its joins' outputs: keys all equal,
//! one key holding half the probe rows, build sides whose strings pass what
//! one Arrow array holds.
//!
//! On the CPU reference backend the tables are small and the join's limits
//! small with them ([`JoinLimits`]), so that the paths full-size joins take
//! run in CI: probe chunks joined in pieces, single probe rows whose
//! matches are more than a match call makes, output cut into several
//! batches. With `GPU_JOIN_TEST_BACKEND=cuda` the tables are full size and
//! the limits the join's own.

use std::sync::Arc;

use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu_join::config::BackendChoice;
use datafusion_gpu_join::testing::JoinLimits;

use crate::common::{
    datafusion_context, gpu_context, join_metrics, physical_plan_text, run, sorted_rows, test_backend_choice,
};

/// Table sizes and the limits the GPU session joins within.
struct Scale {
    /// Rows of each side whose keys are all equal.
    equal_rows: usize,
    /// Probe rows, half of them of one key, and build rows of that key.
    skewed_probe_rows: usize,
    skewed_build_rows: usize,
    /// Build rows and bytes per string of a build side whose strings pass
    /// what one output array holds.
    string_rows: usize,
    string_bytes: usize,
    limits: JoinLimits,
}

fn scale() -> Scale {
    match test_backend_choice() {
        BackendChoice::Cuda => Scale {
            equal_rows: 6000,
            skewed_probe_rows: 2_000_000,
            skewed_build_rows: 1000,
            string_rows: 1_100_000,
            string_bytes: 2000,
            limits: JoinLimits::default(),
        },
        _ => Scale {
            equal_rows: 300,
            skewed_probe_rows: 20_000,
            skewed_build_rows: 100,
            string_rows: 3000,
            string_bytes: 100,
            limits: JoinLimits { pairs: 5000, array_values: 50_000 },
        },
    }
}

fn config(limits: JoinLimits) -> SessionConfig {
    SessionConfig::new().with_target_partitions(4).with_extension(Arc::new(limits))
}

/// Runs each query in both sessions and compares the rows; the GPU session
/// must have planned a `GpuJoinExec` for it.
async fn assert_same_rows(gpu: &SessionContext, cpu: &SessionContext, queries: &[String]) {
    for query in queries {
        let plan = physical_plan_text(gpu, query).await;
        assert!(plan.contains("GpuJoinExec"), "{query}: no GPU join in\n{plan}");
        let expected = sorted_rows(&run(cpu, query).await);
        let actual = sorted_rows(&run(gpu, query).await);
        assert_eq!(actual, expected, "{query}");
    }
}

async fn sessions(statements: &[String], limits: JoinLimits) -> (SessionContext, SessionContext) {
    let (gpu, cpu) = (gpu_context(config(limits)), datafusion_context(config(limits)));
    for statement in statements {
        run(&gpu, statement).await;
        run(&cpu, statement).await;
    }
    (gpu, cpu)
}

/// Every join type DataFusion plans from SQL, with and without a join
/// filter, over two tables whose keys are all equal.
fn join_queries(left: &str, right: &str, filter: &str) -> Vec<String> {
    let on = format!("{left}.k = {right}.k{filter}");
    let sub = format!("{right}.k = {left}.k{filter}");
    vec![
        format!("select count(*), sum(p), sum(q) from {left} join {right} on {on}"),
        format!("select count(*), sum(p), count(q) from {left} left join {right} on {on}"),
        format!("select count(*), count(p), sum(q) from {left} right join {right} on {on}"),
        format!("select count(*), count(p), count(q) from {left} full join {right} on {on}"),
        format!("select count(*), sum(p) from {left} where exists (select 1 from {right} where {sub})"),
        format!("select count(*), sum(p) from {left} where not exists (select 1 from {right} where {sub})"),
        format!("select count(*), sum(p) from {left} where exists (select 1 from {right} where {sub}) or p < 3"),
        format!("select count(*) from {left} where k in (select k from {right})"),
        format!("select count(*) from {left} where k not in (select k from {right})"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn joins_of_all_equal_keys_complete_with_datafusions_rows() {
    let Scale { equal_rows, limits, .. } = scale();
    let statements = [
        format!("create table a as select 7 as k, value as p from generate_series(1, {equal_rows})"),
        format!("create table b as select 7 as k, value as q from generate_series(1, {equal_rows})"),
    ];
    let (gpu, cpu) = sessions(&statements, limits).await;
    for filter in ["", " and p < q"] {
        assert_same_rows(&gpu, &cpu, &join_queries("a", "b", filter)).await;
    }
    // More pairs than a match call makes: joined in pieces, on the device.
    let [retries, tables] =
        join_metrics(&gpu, &join_queries("a", "b", "")[1], ["out_of_memory_retries", "host_fallback_tables"]).await;
    assert!(retries.is_some_and(|r| r > 0), "the left join was not joined in pieces: {retries:?} retries");
    assert!(tables.is_none_or(|t| t == 0), "pieces went to DataFusion's operator: {tables:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn joins_with_one_key_holding_half_the_probe_rows_complete_with_datafusions_rows() {
    let Scale { skewed_probe_rows, skewed_build_rows, limits, .. } = scale();
    let statements = [
        format!(
            "create table f as select case when value % 2 = 0 then 7 else value end as k, value as p \
             from generate_series(1, {skewed_probe_rows})"
        ),
        format!("create table d as select 7 as k, value as q from generate_series(1, {skewed_build_rows})"),
    ];
    let (gpu, cpu) = sessions(&statements, limits).await;
    let queries: Vec<String> = ["", " and q < 50"]
        .iter()
        .flat_map(|filter| {
            [
                format!("select count(*), sum(p), sum(q) from f left join d on f.k = d.k{filter}"),
                format!("select count(*), sum(p) from f where not exists (select 1 from d where d.k = f.k{filter})"),
                format!("select count(*), sum(q) from d where exists (select 1 from f where f.k = d.k{filter})"),
            ]
        })
        .collect();
    assert_same_rows(&gpu, &cpu, &queries).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn build_sides_whose_strings_pass_one_array_complete_with_datafusions_rows() {
    let Scale { string_rows, string_bytes, limits, .. } = scale();
    let statements = [
        format!(
            "create table strings as select value as k, repeat('x', {string_bytes}) || value as s \
             from generate_series(1, {string_rows})"
        ),
        format!(
            "create table keys as select value * 3 % {string_rows} + 1 as k from generate_series(1, {string_rows})"
        ),
    ];
    let (gpu, cpu) = sessions(&statements, limits).await;
    for collect in ["true", "false"] {
        let setting = format!("set gpu_join.collect_build_side = {collect}");
        run(&gpu, &setting).await;
        let queries = [
            "select count(*), sum(length(s)), min(s), max(s) from strings join keys on strings.k = keys.k".to_string(),
            "select count(*), sum(length(s)) from keys left join strings on strings.k = keys.k".to_string(),
        ];
        assert_same_rows(&gpu, &cpu, &queries).await;
    }
}
