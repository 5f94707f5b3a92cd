//! Partial and final aggregations grouped on the backend
//! (`gpu_join.aggregate`), against DataFusion's on fresh random rows: every
//! aggregate the backend folds or merges, NULL keys and values, duplicates,
//! heavy skew, many groups, empty input, sums past 64 bits, chunks of a few
//! rows (a final aggregation merging many chunks), strings among the keys,
//! keys that do not pack (a partial aggregation's rows, and a final
//! aggregation's whole partition, left to DataFusion), single-phase
//! aggregations run in two, and a memory pool that grants the aggregations
//! less than they would hold.

use std::fmt;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanArray, Date32Array, Decimal128Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::resources_err;
use datafusion::datasource::MemTable;
use datafusion::error::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryPool, MemoryReservation};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::physical_plan::aggregates::AggregateOutputMode;
use datafusion::physical_plan::{ExecutionPlan, collect, displayable};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu_join::config::GpuJoinConfig;
use datafusion_gpu_join::exec::GpuAggregateExec;
use datafusion_gpu_join::{AggregateDecision, AggregatePlacement, GpuJoinContextExt, SessionStateBuilderExt};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::common::{datafusion_context, sorted_rows, test_backend_choice, test_options};

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
    sessions_in(batches, chunk_rows, 4, None)
}

/// [`sessions`] over `partitions` partitions (of the table and of the
/// sessions' plans), the GPU session's memory pool `pool` where that is
/// given.
fn sessions_in(
    batches: &[RecordBatch],
    chunk_rows: usize,
    partitions: usize,
    pool: Option<Arc<dyn MemoryPool>>,
) -> [SessionContext; 2] {
    let config = || SessionConfig::new().with_target_partitions(partitions).with_batch_size(512);
    let mut options: GpuJoinConfig = test_options();
    options.aggregate = true;
    options.aggregate_chunk_rows = chunk_rows;
    let runtime = match pool {
        Some(pool) => RuntimeEnvBuilder::new().with_memory_pool(pool),
        None => RuntimeEnvBuilder::new(),
    };
    let gpu = SessionStateBuilder::new()
        .with_default_features()
        .with_config(config().with_option_extension(options))
        .with_runtime_env(runtime.build_arc().expect("a runtime"))
        .with_gpu_join()
        .build();
    let contexts = [SessionContext::new_with_state(gpu), datafusion_context(config())];
    let parts: Vec<Vec<RecordBatch>> =
        (0..partitions).map(|p| batches.iter().skip(p).step_by(partitions).cloned().collect()).collect();
    for ctx in &contexts {
        let table = MemTable::try_new(schema(), parts.clone()).expect("a table");
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

/// What a `GpuAggregateExec` of a plan did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ran {
    /// Whether it is a final aggregation.
    final_groups: bool,
    /// Input rows it grouped on the backend.
    on_backend: usize,
    /// Input rows it left to DataFusion's aggregation.
    on_datafusion: usize,
    /// Groups it emitted.
    groups: usize,
}

/// Runs `sql` in both sessions, checks that they give the same rows and
/// returns what each `GpuAggregateExec` of the plan did, partial ones
/// first.
async fn compare(contexts: &[SessionContext; 2], sql: &str) -> Vec<Ran> {
    let [gpu, datafusion] = contexts;
    let plan = gpu.sql(sql).await.expect(sql).create_physical_plan().await.expect(sql);
    let rows = collect(Arc::clone(&plan), gpu.task_ctx()).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    let expected = datafusion.sql(sql).await.expect(sql).collect().await.expect(sql);
    assert_eq!(sorted_rows(&rows), sorted_rows(&expected), "{sql}");
    let mut ran: Vec<Ran> = gpu_aggregates(&plan)
        .into_iter()
        .map(|aggregate| {
            let metrics = aggregate.metrics().expect("metrics");
            let metric = |name: &str| metrics.sum_by_name(name).map_or(0, |m| m.as_usize());
            Ran {
                final_groups: aggregate.aggregate().mode().output_mode() == AggregateOutputMode::Final,
                on_backend: metric("rows_on_backend"),
                on_datafusion: metric("rows_on_datafusion"),
                groups: metric("groups"),
            }
        })
        .collect();
    ran.sort_by_key(|r| r.final_groups);
    ran
}

/// Every aggregate the backend merges in a final aggregation.
const AGGREGATES: &str = "count(*), count(v), sum(v), min(v), max(v), sum(p), min(p), max(p), \
                          min(d), max(d), count(s), sum(w), min(g), max(g), sum(p * (1 - q))";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aggregations_grouped_on_the_backend_match_datafusion() {
    let mut rng = StdRng::from_os_rng();
    for (keys, rows, null_every, chunk_rows) in [
        (Keys::Duplicated, 20_000, 10, 1 << 23),
        (Keys::Duplicated, 20_000, 2, 777),
        (Keys::Skewed, 30_000, 20, 4096),
        (Keys::Distinct, 25_000, 1000, 1 << 23),
        (Keys::Distinct, 25_000, 5, 1000),
        (Keys::Duplicated, 3, 2, 1),
    ] {
        let batches = table(rows, keys, null_every, &mut rng);
        let contexts = sessions(&batches, chunk_rows);
        // Strings group by their codes in each chunk, beside other keys too.
        for group_by in ["k", "k, g", "g, b, d", "d", "s", "k, s", "arrow_cast(s, 'Utf8View'), g"] {
            let sql = format!("SELECT {group_by}, {AGGREGATES} FROM t GROUP BY {group_by}");
            let ran = compare(&contexts, &sql).await;
            let [partial, last] = ran.as_slice() else {
                panic!("{keys:?}: {sql}: not a partial and a final GpuAggregateExec: {ran:?}");
            };
            assert_eq!(
                (partial.on_backend, partial.on_datafusion),
                (rows, 0),
                "{keys:?}, chunks of {chunk_rows}: {sql}"
            );
            // The final aggregation merges every group the partial ones sent.
            assert_eq!((last.on_backend, last.on_datafusion), (partial.groups, 0), "{keys:?}: {sql}");
        }
        // An average's final value is a division, which DataFusion's final
        // aggregation makes from the partial states the backend folded.
        let sql = "SELECT k, avg(p), count(*) FROM t GROUP BY k";
        let ran = compare(&contexts, sql).await;
        assert_eq!(ran.iter().map(|r| (r.final_groups, r.on_backend)).collect::<Vec<_>>(), [(false, rows)], "{sql}");
        // DataFusion plans a distinct count as two groupings, both on the
        // backend.
        let distinct = "SELECT k, count(DISTINCT g) FROM t GROUP BY k";
        let ran = compare(&contexts, distinct).await;
        assert_eq!(ran.iter().filter(|r| r.on_datafusion == 0).count(), 4, "{keys:?}: {distinct}: {ran:?}");
        let having = "SELECT k, sum(v) FROM t WHERE g > 0 GROUP BY k HAVING count(*) > 1";
        let ran = compare(&contexts, having).await;
        assert!(ran.iter().all(|r| r.on_datafusion == 0), "{keys:?}: {having}: {ran:?}");
    }
}

/// A single-phase aggregation (rows in, final values out) runs as
/// DataFusion's two phases, each on the backend where it can be: over one
/// partition (`Single`), and over a join's output partitioned by the
/// grouping keys (`SinglePartitioned`). An average's final value is a
/// division, so only its partial phase goes there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn single_phase_aggregations_run_in_two_phases_on_the_backend() {
    let batches = table(10_000, Keys::Duplicated, 10, &mut StdRng::from_os_rng());
    let joined = "SELECT a.k, count(*), sum(b.v), min(a.d), max(b.p), count(b.s) \
                  FROM t a JOIN t b ON a.k = b.k GROUP BY a.k";
    let single = format!("SELECT k, {AGGREGATES} FROM t GROUP BY k");
    let average = "SELECT k, g, avg(p), count(*) FROM t GROUP BY k, g";
    for (partitions, sql, mode, merged) in
        [(4, joined, "SinglePartitioned", true), (1, single.as_str(), "Single", true), (1, average, "Single", false)]
    {
        let contexts = sessions_in(&batches, 4096, partitions, None);
        for ctx in &contexts {
            // The join partitioned by its keys, as DataFusion plans a large one.
            for threshold in ["", "_rows"] {
                let set = format!("SET datafusion.optimizer.hash_join_single_partition_threshold{threshold} = 0");
                ctx.sql(&set).await.expect(&set).collect().await.expect(&set);
            }
        }
        let planned = contexts[1].sql(sql).await.expect(sql).create_physical_plan().await.expect(sql);
        let datafusion_s = displayable(planned.as_ref()).indent(false).to_string();
        assert!(datafusion_s.contains(&format!("mode={mode},")), "{sql}: DataFusion plans no {mode}: {datafusion_s}");
        let ran = compare(&contexts, sql).await;
        let (partial, rest) = ran.split_first().unwrap_or_else(|| panic!("{sql}: no GpuAggregateExec"));
        assert!(!partial.final_groups && partial.on_datafusion == 0 && partial.on_backend > 0, "{sql}: {ran:?}");
        let merging: Vec<_> = rest.iter().map(|r| (r.final_groups, r.on_backend, r.on_datafusion)).collect();
        let expected: &[(bool, usize, usize)] = if merged { &[(true, partial.groups, 0)] } else { &[] };
        assert_eq!(merging, expected, "{sql}: {ran:?}");
    }
}

/// A partial aggregation whose chunks hardly reduce leaves the rest of its
/// input to DataFusion's, which stops grouping then as it would alone
/// (`skip_partial_aggregation_probe_*`); one whose chunks reduce keeps
/// grouping on the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partial_aggregation_that_hardly_reduces_leaves_its_rows_to_datafusion() {
    let rows = 40_000;
    for (keys, reduces) in [(Keys::Distinct, false), (Keys::Duplicated, true)] {
        let batches = table(rows, keys, 50, &mut StdRng::from_os_rng());
        let contexts = sessions(&batches, 1000);
        for ctx in &contexts {
            let set = "SET datafusion.execution.skip_partial_aggregation_probe_rows_threshold = 2500";
            ctx.sql(set).await.expect(set).collect().await.expect(set);
        }
        let sql = format!("SELECT k, {AGGREGATES} FROM t GROUP BY k");
        let ran = compare(&contexts, &sql).await;
        let partial = ran.first().unwrap_or_else(|| panic!("{keys:?}: no GpuAggregateExec: {ran:?}"));
        assert!(!partial.final_groups, "{keys:?}: {ran:?}");
        assert_eq!(partial.on_backend + partial.on_datafusion, rows, "{keys:?}: {ran:?}");
        match reduces {
            true => assert_eq!(partial.on_datafusion, 0, "{keys:?}: {ran:?}"),
            // Each of the four partitions groups chunks on the backend
            // until 2,500 of its rows are grouped, then leaves the rest.
            false => assert!(partial.on_backend >= 4 * 2500 && partial.on_datafusion >= rows / 4, "{keys:?}: {ran:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_that_do_not_pack_leave_the_rows_to_datafusion() {
    let batches = table(10_000, Keys::Distinct, 50, &mut StdRng::from_os_rng());
    let contexts = sessions(&batches, 3000);
    let sql = format!("SELECT wide, k, {AGGREGATES} FROM t GROUP BY wide, k");
    let ran = compare(&contexts, &sql).await;
    let [partial, last] = ran.as_slice() else {
        panic!("{sql}: not a partial and a final GpuAggregateExec: {ran:?}");
    };
    assert_eq!((partial.on_backend, partial.on_datafusion), (0, 10_000), "{sql}");
    assert_eq!((last.on_backend, last.on_datafusion), (0, partial.groups), "{sql}");
}

/// Keys that can take few values make few groups, which DataFusion's
/// aggregation folds in the CPU's caches: their rows stay there
/// (`gpu_join.aggregate_min_key_values`), while keys of more values group
/// on the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_of_few_values_leave_the_rows_to_datafusion() {
    let rows = 20_000;
    let batches = table(rows, Keys::Duplicated, 50, &mut StdRng::from_os_rng());
    let contexts = sessions(&batches, 3000);
    let set = "SET gpu_join.aggregate_min_key_values = 512";
    contexts[0].sql(set).await.expect(set).collect().await.expect(set);
    // `g` takes 7 values and NULL; `k` takes 600 and NULL.
    for (column, on_backend) in [("g", false), ("k", true)] {
        let sql = format!("SELECT {column}, {AGGREGATES} FROM t GROUP BY {column}");
        let ran = compare(&contexts, &sql).await;
        let partial = ran.first().unwrap_or_else(|| panic!("{sql}: no GpuAggregateExec: {ran:?}"));
        assert!(!partial.final_groups, "{sql}: {ran:?}");
        let expected = match on_backend {
            true => (rows, 0),
            false => (0, rows),
        };
        assert_eq!((partial.on_backend, partial.on_datafusion), expected, "{sql}: {ran:?}");
    }
}

/// A partition's first 262,144 rows decide, before its first chunk fills:
/// where their keys take few values, the whole input goes to DataFusion's
/// aggregation, even though the chunk they begin would span many more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_first_rows_of_few_key_values_leave_the_whole_input_to_datafusion() {
    let mut rng = StdRng::from_os_rng();
    // `k` takes 600 values and NULL in the first part, almost any of 2^32 in the second.
    let (few, many) = (table(270_000, Keys::Duplicated, 50, &mut rng), table(60_000, Keys::Distinct, 50, &mut rng));
    let rows = 330_000;
    for (first, on_backend) in [(&few, false), (&many, true)] {
        let rest = if on_backend { &few } else { &many };
        let batches: Vec<RecordBatch> = first.iter().chain(rest).cloned().collect();
        // One partition, its input one chunk.
        let contexts = sessions_in(&batches, 1 << 20, 1, None);
        let set = "SET gpu_join.aggregate_min_key_values = 65536";
        contexts[0].sql(set).await.expect(set).collect().await.expect(set);
        let sql = format!("SELECT k, {AGGREGATES} FROM t GROUP BY k");
        let ran = compare(&contexts, &sql).await;
        let partial = ran.first().unwrap_or_else(|| panic!("{sql}: no GpuAggregateExec: {ran:?}"));
        let expected = if on_backend { (rows, 0) } else { (0, rows) };
        assert_eq!((partial.on_backend, partial.on_datafusion), expected, "{sql}: {ran:?}");
    }
}

/// A final aggregation whose later chunks do not pack hands the groups it
/// merged so far to DataFusion's aggregation with the rest of its input.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_final_aggregation_that_cannot_merge_a_chunk_leaves_its_groups_to_datafusion() {
    let mut batches = table(20_000, Keys::Duplicated, 20, &mut StdRng::from_os_rng());
    // Rows whose key packs only with the 64 bits of `wide` to itself: the
    // groups of `k, d` over them do not pack once `d` spans every date.
    let far = table(4, Keys::Distinct, 1000, &mut StdRng::from_os_rng());
    batches.extend(far.into_iter().map(|batch| {
        let mut columns = batch.columns().to_vec();
        columns[0] = Arc::new(Int64Array::from(
            vec![Some(i64::MIN), Some(i64::MAX), None, Some(0)][..batch.num_rows()].to_vec(),
        ));
        RecordBatch::try_new(schema(), columns).expect("a batch")
    }));
    let contexts = sessions(&batches, 2000);
    let sql = format!("SELECT k, d, {AGGREGATES} FROM t GROUP BY k, d");
    let ran = compare(&contexts, &sql).await;
    let [_, last] = ran.as_slice() else {
        panic!("{sql}: not a partial and a final GpuAggregateExec: {ran:?}");
    };
    assert!(last.on_datafusion > 0, "{sql}: {ran:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aggregations_the_backend_cannot_fold_stay_datafusion_s() {
    let batches = table(5_000, Keys::Duplicated, 10, &mut StdRng::from_os_rng());
    let contexts = sessions(&batches, 1 << 23);
    // The partial aggregations stay; the final ones above them merge on
    // the backend where they can: a filtered sum's states are sums.
    for (sql, merged) in [
        ("SELECT CAST(g AS DOUBLE) f, sum(v) FROM t GROUP BY f", false),
        ("SELECT k, sum(v) FILTER (WHERE g > 0) FROM t GROUP BY k", true),
        ("SELECT k, max(s) FROM t GROUP BY k", false),
        ("SELECT k, bit_and(v) FROM t GROUP BY k", false),
        ("SELECT k, min(w) FROM t GROUP BY k", false),
        ("SELECT k, avg(w) FROM t GROUP BY k", false),
        ("SELECT sum(v), count(*) FROM t", false),
        // A rollup's final aggregation groups by its grouping id too.
        ("SELECT k, g, sum(v) FROM t GROUP BY ROLLUP (k, g)", true),
    ] {
        let ran = compare(&contexts, sql).await;
        let expected: &[(bool, usize)] = if merged { &[(true, 0)] } else { &[] };
        assert_eq!(ran.iter().map(|r| (r.final_groups, r.on_datafusion)).collect::<Vec<_>>(), expected, "{sql}");
    }
    let empty = sessions(&[], 1 << 23);
    let sql = format!("SELECT k, {AGGREGATES} FROM t GROUP BY k");
    let ran = compare(&empty, &sql).await;
    assert_eq!(
        ran.iter().map(|r| (r.on_backend, r.on_datafusion, r.groups)).collect::<Vec<_>>(),
        [(0, 0, 0); 2],
        "{sql}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_aggregation_s_placement_is_reported_with_its_reason() {
    let batches = table(2_000, Keys::Duplicated, 10, &mut StdRng::from_os_rng());
    let [gpu, _] = sessions(&batches, 1 << 23);
    let placements =
        |decisions: Vec<AggregateDecision>| -> Vec<String> { decisions.iter().map(ToString::to_string).collect() };
    let backend = test_backend_choice();
    let on_backend = gpu.gpu_aggregate_decisions("SELECT k, sum(v) FROM t GROUP BY k").await.expect("planned");
    assert_eq!(placements(on_backend), [format!("Partial {backend}"), format!("FinalPartitioned {backend}")]);
    let float_keys =
        gpu.gpu_aggregate_decisions("SELECT CAST(g AS DOUBLE) f, sum(v) FROM t GROUP BY f").await.expect("planned");
    assert_eq!(
        placements(float_keys),
        ["Partial: grouping column of type Float64", "FinalPartitioned: grouping column of type Float64"]
    );
    let string_keys = gpu.gpu_aggregate_decisions("SELECT s, sum(v) FROM t GROUP BY s").await.expect("planned");
    assert_eq!(placements(string_keys), [format!("Partial {backend}"), format!("FinalPartitioned {backend}")]);
    let average = gpu.gpu_aggregate_decisions("SELECT k, avg(p) FROM t GROUP BY k").await.expect("planned");
    assert_eq!(
        placements(average),
        [
            format!("Partial {backend}"),
            "FinalPartitioned: aggregate avg(t.p): a final value that is not its state".into()
        ]
    );
    // Off, every aggregation says so.
    gpu.sql("SET gpu_join.aggregate = false").await.expect("set").collect().await.expect("set");
    let off = gpu.gpu_aggregate_decisions("SELECT k, sum(v) FROM t GROUP BY k").await.expect("planned");
    assert!(
        off.iter().all(|d| d.placement == AggregatePlacement::NotOnGpu("gpu_join.aggregate is false".into())),
        "{off:?}"
    );
    assert_eq!(off.len(), 2);
}

/// A memory pool that grants what is asked, except to a `GpuAggregateExec`
/// past `cap` bytes: the aggregations' limits, with DataFusion's operators
/// never short.
#[derive(Debug)]
struct AggregationsCapped {
    granted: GreedyMemoryPool,
    cap: usize,
}

impl fmt::Display for AggregationsCapped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}, aggregations capped at {} bytes", self.granted, self.cap)
    }
}

impl MemoryPool for AggregationsCapped {
    fn name(&self) -> &str {
        "aggregations capped"
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.granted.grow(reservation, additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.granted.shrink(reservation, shrink);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        if reservation.consumer().name().starts_with("GpuAggregateExec") && reservation.size() + additional > self.cap {
            return resources_err!("{} is capped at {} bytes", reservation.consumer().name(), self.cap);
        }
        self.granted.try_grow(reservation, additional)
    }

    fn reserved(&self) -> usize {
        self.granted.reserved()
    }
}

/// The rows an aggregation holds are counted in the session's memory pool.
/// Where the pool grants less than a partition's rows, partial aggregations
/// group the chunks they hold sooner, so they send more groups on, and a
/// final aggregation leaves its groups and the rest of its input to
/// DataFusion's aggregation; the rows are DataFusion's, and the pool is
/// empty again once they are out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aggregations_hold_their_rows_in_the_sessions_memory_pool() {
    let capped = || -> Arc<dyn MemoryPool> {
        Arc::new(AggregationsCapped { granted: GreedyMemoryPool::new(usize::MAX), cap: 64 << 10 })
    };
    let mut rng = StdRng::from_os_rng();
    let sql = format!("SELECT k, {AGGREGATES} FROM t GROUP BY k");
    let duplicated = table(40_000, Keys::Duplicated, 20, &mut rng);
    let unbounded = compare(&sessions(&duplicated, 1 << 23), &sql).await;
    let bounded_sessions = sessions_in(&duplicated, 1 << 23, 4, Some(capped()));
    let bounded = compare(&bounded_sessions, &sql).await;
    let ([partial, _], [bounded_partial, _]) = (unbounded.as_slice(), bounded.as_slice()) else {
        panic!("{sql}: not a partial and a final GpuAggregateExec: {unbounded:?}, {bounded:?}");
    };
    assert_eq!(bounded_partial.on_backend, 40_000, "{sql}");
    assert!(bounded_partial.groups > partial.groups, "{sql}: {bounded_partial:?} against {partial:?}");
    // Groups of a key each outgrow the pool in the final aggregation.
    let distinct = table(40_000, Keys::Distinct, 20, &mut rng);
    let contexts = sessions_in(&distinct, 1 << 23, 4, Some(capped()));
    let ran = compare(&contexts, &sql).await;
    let [_, last] = ran.as_slice() else {
        panic!("{sql}: not a partial and a final GpuAggregateExec: {ran:?}");
    };
    assert!(last.on_datafusion > 0, "{sql}: {ran:?}");
    for ctx in [&bounded_sessions[0], &contexts[0]] {
        assert_eq!(ctx.runtime_env().memory_pool.reserved(), 0);
    }
}
