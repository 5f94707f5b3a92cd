//! Partial aggregations grouped on the backend (`gpu_join.aggregate`),
//! against DataFusion's on fresh random rows: every aggregate the backend
//! folds, NULL keys and values, duplicates, heavy skew, many groups, empty
//! input, sums past 64 bits, chunks of a few rows, and keys that do not
//! pack (left to DataFusion chunk by chunk).

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanArray, Date32Array, Decimal128Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu_join::config::GpuJoinConfig;
use datafusion_gpu_join::exec::GpuAggregateExec;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::common::{datafusion_context, gpu_context_with, sorted_rows, test_options};

/// How the keys of a table are drawn.
#[derive(Debug, Clone, Copy)]
enum Keys {
    /// A few hundred keys, each many times.
    Duplicated,
    /// Nine rows in ten on one key.
    Skewed,
    /// Almost every row a key of its own.
    Distinct,
}

fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("g", DataType::Int32, true),
        Field::new("b", DataType::Boolean, true),
        Field::new("d", DataType::Date32, true),
        Field::new("v", DataType::Int64, true),
        Field::new("p", DataType::Decimal128(15, 2), true),
        Field::new("q", DataType::Decimal128(15, 2), false),
        Field::new("w", DataType::Decimal128(38, 0), true),
        Field::new("wide", DataType::Int64, false),
        Field::new("s", DataType::Utf8, true),
    ]))
}

/// `rows` random rows in batches of at most 1,000, a NULL in about one
/// value in `null_every` of the nullable columns.
fn table(rows: usize, keys: Keys, null_every: u32, rng: &mut StdRng) -> Vec<RecordBatch> {
    let mut batches = vec![];
    let mut left = rows;
    while left > 0 {
        let n = left.min(1000 - rng.random_range(0..200));
        left -= n;
        let mut null = || rng.random_ratio(1, null_every);
        let nulls: Vec<[bool; 8]> = (0..n).map(|_| std::array::from_fn(|_| null())).collect();
        let key = |rng: &mut StdRng| -> i64 {
            match keys {
                Keys::Duplicated => rng.random_range(-300..300),
                Keys::Skewed if rng.random_ratio(9, 10) => 7,
                Keys::Skewed => rng.random_range(0..10_000),
                Keys::Distinct => rng.random_range(0..i64::from(u32::MAX)),
            }
        };
        let k: Int64Array = nulls.iter().map(|z| (!z[0]).then(|| key(rng))).collect();
        let g: Int32Array = nulls.iter().map(|z| (!z[1]).then(|| rng.random_range(-3..4))).collect();
        let b: BooleanArray = nulls.iter().map(|z| (!z[2]).then(|| rng.random_bool(0.5))).collect();
        let d: Date32Array = nulls.iter().map(|z| (!z[3]).then(|| rng.random_range(8000..12000))).collect();
        let v: Int64Array = nulls.iter().map(|z| (!z[4]).then(|| rng.random_range(i64::MIN..i64::MAX))).collect();
        let p: Decimal128Array =
            nulls.iter().map(|z| (!z[5]).then(|| rng.random_range(-10i128.pow(13)..10i128.pow(13)))).collect();
        let q: Decimal128Array = (0..n).map(|_| Some(rng.random_range(0..100))).collect();
        let w: Decimal128Array =
            nulls.iter().map(|z| (!z[6]).then(|| rng.random_range(-(1i128 << 100)..1i128 << 100))).collect();
        let wide: Int64Array = (0..n).map(|_| Some(rng.random_range(i64::MIN..i64::MAX))).collect();
        let s: StringArray = nulls.iter().map(|z| (!z[7]).then(|| format!("s{}", rng.random_range(0..50)))).collect();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(k),
            Arc::new(g),
            Arc::new(b),
            Arc::new(d),
            Arc::new(v),
            Arc::new(p.with_precision_and_scale(15, 2).expect("decimal")),
            Arc::new(q.with_precision_and_scale(15, 2).expect("decimal")),
            Arc::new(w.with_precision_and_scale(38, 0).expect("decimal")),
            Arc::new(wide),
            Arc::new(s),
        ];
        batches.push(RecordBatch::try_new(schema(), columns).expect("a batch"));
    }
    batches
}

/// The GPU session with aggregations on the backend, grouping `chunk_rows`
/// rows at once, and DataFusion's, over `batches` in four partitions.
fn sessions(batches: &[RecordBatch], chunk_rows: usize) -> [SessionContext; 2] {
    let config = || SessionConfig::new().with_target_partitions(4).with_batch_size(512);
    let mut options: GpuJoinConfig = test_options();
    options.aggregate = true;
    options.aggregate_chunk_rows = chunk_rows;
    let contexts = [gpu_context_with(config(), options), datafusion_context(config())];
    let partitions: Vec<Vec<RecordBatch>> =
        (0..4).map(|p| batches.iter().skip(p).step_by(4).cloned().collect()).collect();
    for ctx in &contexts {
        let table = MemTable::try_new(schema(), partitions.clone()).expect("a table");
        ctx.register_table("t", Arc::new(table)).expect("registered");
    }
    contexts
}

/// Every `GpuAggregateExec` of a plan.
fn gpu_aggregates(plan: &Arc<dyn ExecutionPlan>) -> Vec<&GpuAggregateExec> {
    let mut found: Vec<&GpuAggregateExec> = plan.children().into_iter().flat_map(gpu_aggregates).collect();
    found.extend(plan.downcast_ref::<GpuAggregateExec>());
    found
}

/// Runs `sql` in both sessions, checks that they give the same rows and
/// returns the rows that the plan's `GpuAggregateExec`s grouped on the
/// backend and left to DataFusion, and the number of such nodes.
async fn compare(contexts: &[SessionContext; 2], sql: &str) -> (usize, usize, usize) {
    let [gpu, datafusion] = contexts;
    let plan = gpu.sql(sql).await.expect(sql).create_physical_plan().await.expect(sql);
    let rows = collect(Arc::clone(&plan), gpu.task_ctx()).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    let expected = datafusion.sql(sql).await.expect(sql).collect().await.expect(sql);
    assert_eq!(sorted_rows(&rows), sorted_rows(&expected), "{sql}");
    let aggregates = gpu_aggregates(&plan);
    let metric = |name: &str| -> usize {
        aggregates.iter().filter_map(|a| a.metrics()?.sum_by_name(name)).map(|m| m.as_usize()).sum()
    };
    (metric("rows_on_backend"), metric("rows_on_datafusion"), aggregates.len())
}

const AGGREGATES: &str = "count(*), count(v), sum(v), min(v), max(v), sum(p), avg(p), min(p), max(p), \
                          min(d), max(d), count(s), sum(w), min(g), max(g), sum(p * (1 - q))";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partial_aggregations_grouped_on_the_backend_match_datafusion() {
    let mut rng = StdRng::from_os_rng();
    for (keys, rows, null_every, chunk_rows) in [
        (Keys::Duplicated, 20_000, 10, 1 << 23),
        (Keys::Duplicated, 20_000, 2, 777),
        (Keys::Skewed, 30_000, 20, 4096),
        (Keys::Distinct, 25_000, 1000, 1 << 23),
        (Keys::Duplicated, 3, 2, 1),
    ] {
        let batches = table(rows, keys, null_every, &mut rng);
        let contexts = sessions(&batches, chunk_rows);
        for group_by in ["k", "k, g", "g, b, d", "d"] {
            let sql = format!("SELECT {group_by}, {AGGREGATES} FROM t GROUP BY {group_by}");
            let (on_backend, on_datafusion, nodes) = compare(&contexts, &sql).await;
            assert_eq!(nodes, 1, "{keys:?}: {sql}");
            assert_eq!((on_backend, on_datafusion), (rows, 0), "{keys:?}, chunks of {chunk_rows}: {sql}");
        }
        let having = "SELECT k, sum(v) FROM t WHERE g > 0 GROUP BY k HAVING count(*) > 1";
        let (on_backend, _, _) = compare(&contexts, having).await;
        assert!(on_backend > 0 || rows < 10, "{keys:?}: {having}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_that_do_not_pack_are_grouped_by_datafusion_chunk_by_chunk() {
    let batches = table(10_000, Keys::Distinct, 50, &mut StdRng::from_os_rng());
    let contexts = sessions(&batches, 3000);
    let sql = format!("SELECT wide, k, {AGGREGATES} FROM t GROUP BY wide, k");
    assert_eq!(compare(&contexts, &sql).await, (0, 10_000, 1), "{sql}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aggregations_the_backend_cannot_fold_stay_datafusion_s() {
    let batches = table(5_000, Keys::Duplicated, 10, &mut StdRng::from_os_rng());
    let contexts = sessions(&batches, 1 << 23);
    for sql in [
        "SELECT s, sum(v) FROM t GROUP BY s",
        "SELECT k, sum(v) FILTER (WHERE g > 0) FROM t GROUP BY k",
        "SELECT k, max(s) FROM t GROUP BY k",
        "SELECT k, bit_and(v) FROM t GROUP BY k",
        "SELECT k, min(w) FROM t GROUP BY k",
        "SELECT k, avg(w) FROM t GROUP BY k",
        "SELECT sum(v), count(*) FROM t",
        "SELECT k, g, sum(v) FROM t GROUP BY ROLLUP (k, g)",
    ] {
        assert_eq!(compare(&contexts, sql).await, (0, 0, 0), "{sql}");
    }
    let empty = sessions(&[], 1 << 23);
    let sql = format!("SELECT k, {AGGREGATES} FROM t GROUP BY k");
    assert_eq!(compare(&empty, &sql).await, (0, 0, 1), "{sql}");
}
