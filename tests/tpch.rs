//! TPC-H at a small scale factor, from memory and from Parquet files: every
//! query through the GPU join gives DataFusion's rows.

use datafusion::prelude::{SessionConfig, SessionContext};
use gpu_join_workloads::{self as workloads, tpch};

use crate::common::{datafusion_context, gpu_context, gpu_context_with, sorted_rows, test_options};

const SCALE_FACTOR: f64 = 0.01;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_queries_match_datafusion() {
    let (gpu, reference) = sessions_over_memory();
    // Every join but those of Q15 (planned against its view) is counted.
    let joins_on_gpu = queries_match(&gpu, &reference, "GpuJoinExec").await;
    assert!(joins_on_gpu >= 50, "only {joins_on_gpu} joins ran on the GPU join");
}

/// The same with the aggregations grouped on the backend, a few thousand
/// rows at a time, so that partial aggregations emit groups chunk by chunk
/// and final ones merge their chunks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_queries_with_aggregations_on_the_backend_match_datafusion() {
    let config = SessionConfig::new().with_target_partitions(3).with_batch_size(1000);
    let mut options = test_options();
    options.aggregate = true;
    options.aggregate_chunk_rows = 5000;
    let (gpu, reference) = (gpu_context_with(config.clone(), options), datafusion_context(config));
    tpch::register_tables(&gpu, SCALE_FACTOR, 3).expect("tables");
    tpch::register_tables(&reference, SCALE_FACTOR, 3).expect("tables");
    // Q2, Q3, Q11, Q13, Q15, Q17, Q18 and Q20 group by numbers and dates.
    let aggregations_on_gpu = queries_match(&gpu, &reference, "GpuAggregateExec").await;
    assert!(aggregations_on_gpu >= 15, "only {aggregations_on_gpu} aggregations grouped on the backend");
}

/// The GPU session and DataFusion's, each over TPC-H's tables in memory.
fn sessions_over_memory() -> (SessionContext, SessionContext) {
    let config = SessionConfig::new().with_target_partitions(3).with_batch_size(1000);
    let (gpu, reference) = (gpu_context(config.clone()), datafusion_context(config));
    tpch::register_tables(&gpu, SCALE_FACTOR, 3).expect("tables");
    tpch::register_tables(&reference, SCALE_FACTOR, 3).expect("tables");
    (gpu, reference)
}

/// The same over tables whose batches the GPU session keeps in pinned
/// memory (as they are on the CPU backend), joined where they lie.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_queries_over_pinned_tables_match_datafusion() {
    let (gpu, reference) = sessions_over_memory();
    workloads::pin_tables(&gpu).await.expect("tables pinned");
    let joins_on_gpu = queries_match(&gpu, &reference, "GpuJoinExec").await;
    assert!(joins_on_gpu >= 50, "only {joins_on_gpu} joins ran on the GPU join");
}

/// The same from Parquet files, where the scans take the joins' dynamic
/// filters and the plans differ from those over memory (statistics from the
/// footers, scans split by byte ranges).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_queries_from_parquet_match_datafusion() {
    let dir = tempfile::tempdir().unwrap();
    let folder = tpch::write_parquet(dir.path(), SCALE_FACTOR, 3).expect("Parquet files");
    // A second call finds the tables written and keeps them.
    let written = std::fs::metadata(folder.join("lineitem/part-001.parquet")).unwrap().modified().unwrap();
    assert_eq!(tpch::write_parquet(dir.path(), SCALE_FACTOR, 3).unwrap(), folder);
    assert_eq!(std::fs::metadata(folder.join("lineitem/part-001.parquet")).unwrap().modified().unwrap(), written);
    let config = SessionConfig::new().with_target_partitions(3).with_batch_size(1000);
    let (gpu, reference) = (gpu_context(config.clone()), datafusion_context(config));
    tpch::register_parquet(&gpu, &folder).await.expect("tables");
    tpch::register_parquet(&reference, &folder).await.expect("tables");
    let joins_on_gpu = queries_match(&gpu, &reference, "GpuJoinExec").await;
    assert!(joins_on_gpu >= 50, "only {joins_on_gpu} joins ran on the GPU join");
}

/// Runs the 22 queries in both sessions and compares their rows; the
/// `operator`s in the GPU session's plans of their `SELECT`s.
async fn queries_match(gpu: &SessionContext, reference: &SessionContext, operator: &str) -> usize {
    let mut operators = 0;
    for query in 1..=22 {
        let expected = tpch::run_query(reference, query, SCALE_FACTOR).await.expect("DataFusion runs the query");
        let actual = tpch::run_query(gpu, query, SCALE_FACTOR).await.unwrap_or_else(|e| panic!("Q{query}: {e}"));
        assert!(!expected.is_empty() || query == 15, "Q{query} returned no batches");
        assert_eq!(sorted_rows(&actual), sorted_rows(&expected), "Q{query} differs from DataFusion");
        let select =
            tpch::statements(query, SCALE_FACTOR).unwrap().into_iter().find(|s| s.starts_with("select")).unwrap();
        if let Ok(df) = gpu.sql(&select).await {
            let plan = df.create_physical_plan().await.expect("plan");
            operators += datafusion::physical_plan::displayable(plan.as_ref())
                .indent(false)
                .to_string()
                .matches(operator)
                .count();
        }
    }
    operators
}

/// The CPU time by operator of a run counts each session's own join and
/// aggregation operators, and only its own: the GPU session's as
/// `GpuJoinExec` and `GpuAggregateExec`, DataFusion's as `HashJoinExec` and
/// `AggregateExec`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_counts_the_time_of_each_operator() {
    let (gpu, reference) = sessions_over_memory();
    let statements = tpch::statements(9, SCALE_FACTOR).unwrap();
    let time_of = |run: &workloads::Run, operator: &str| {
        run.operators.iter().find(|(name, _)| name == operator).map(|(_, time)| *time)
    };
    let on_gpu = workloads::run_statements_timed(&gpu, &statements).await.expect("Q9 runs");
    let alone = workloads::run_statements_timed(&reference, &statements).await.expect("Q9 runs");
    assert_eq!(sorted_rows(&on_gpu.rows), sorted_rows(&alone.rows));
    assert!(time_of(&on_gpu, "GpuJoinExec").is_some_and(|time| !time.is_zero()), "{:?}", on_gpu.operators);
    assert!(time_of(&on_gpu, "GpuAggregateExec").is_some_and(|time| !time.is_zero()), "{:?}", on_gpu.operators);
    assert_eq!(time_of(&on_gpu, "HashJoinExec"), None, "{:?}", on_gpu.operators);
    assert!(time_of(&alone, "HashJoinExec").is_some_and(|time| !time.is_zero()), "{:?}", alone.operators);
    assert!(time_of(&alone, "AggregateExec").is_some_and(|time| !time.is_zero()), "{:?}", alone.operators);
    assert_eq!(time_of(&alone, "GpuJoinExec"), None, "{:?}", alone.operators);
    assert_eq!(time_of(&alone, "GpuAggregateExec"), None, "{:?}", alone.operators);
    // The largest first.
    let times: Vec<_> = on_gpu.operators.iter().map(|(_, time)| *time).collect();
    assert!(times.windows(2).all(|pair| pair[0] >= pair[1]), "{:?}", on_gpu.operators);
}
