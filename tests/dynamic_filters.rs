//! The dynamic filters of DataFusion's hash join: planted in the probe
//! side's Parquet scan where the hash join would plant one, fed with the
//! build side's key span, so that the scan skips what DataFusion's plan
//! skips; the parent's filters routed through the join as the hash join
//! routes them; and a GPU join's filter applied by a GPU join below to its
//! own input rows, and to the rows an aggregation below reads.

use std::path::Path;
use std::sync::Arc;

use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, collect, displayable};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu_join::exec::FilteredFromAboveExec;
use datafusion_gpu_join::replace_joins_as_planned;

use crate::common::{datafusion_context, gpu_context, gpu_joins, physical_plan_text, run, sorted_rows, test_options};

/// Rows of the probe table, sorted by key, in row groups of `GROUP_ROWS`.
const PROBE_ROWS: i64 = 65_536;
const GROUP_ROWS: usize = 1024;

/// Writes the probe table `s` (`k` from 0, a NULL key every 1,000th row;
/// `v`) as Parquet and the build table `r` (keys 5,000 to 5,999, a NULL
/// key, keys 60,000 to 60,100; `t` = 1 for three keys far apart).
async fn write_tables(dir: &Path) {
    let ctx = SessionContext::new();
    let path = dir.join("s.parquet");
    let copy = format!(
        "COPY (SELECT CASE WHEN value % 1000 = 999 THEN NULL ELSE value END AS k, value * 3 AS v \
         FROM generate_series(0, {}) ORDER BY value) TO '{}' STORED AS PARQUET \
         OPTIONS ('format.max_row_group_size' '{GROUP_ROWS}')",
        PROBE_ROWS - 1,
        path.display()
    );
    run(&ctx, &copy).await;
    let copy = format!(
        "COPY (SELECT k, w, CASE WHEN k IN (5003, 5500, 60050) THEN 1 ELSE 0 END AS t FROM ( \
         SELECT value AS k, value % 7 AS w FROM generate_series(5000, 5999) \
         UNION ALL SELECT NULL AS k, 1 AS w \
         UNION ALL SELECT value AS k, value % 5 AS w FROM generate_series(60000, 60100))) \
         TO '{}' STORED AS PARQUET",
        dir.join("r.parquet").display()
    );
    run(&ctx, &copy).await;
}

async fn register(ctx: &SessionContext, dir: &Path) {
    for table in ["s", "r"] {
        let sql = format!(
            "CREATE EXTERNAL TABLE {table} STORED AS PARQUET LOCATION '{}'",
            dir.join(format!("{table}.parquet")).display()
        );
        run(ctx, &sql).await;
    }
}

/// Partitioned joins (hash repartitions of both sides) where `partitioned`,
/// else a collected build side.
fn config(partitioned: bool) -> SessionConfig {
    let config = SessionConfig::new().with_target_partitions(4).with_batch_size(1000);
    match partitioned {
        true => config
            .set_usize("datafusion.optimizer.hash_join_single_partition_threshold", 0)
            .set_usize("datafusion.optimizer.hash_join_single_partition_threshold_rows", 0),
        false => config,
    }
}

/// A query's rows and the rows its scans of `s` handed on.
async fn rows_and_probe_scan(ctx: &SessionContext, sql: &str) -> (Vec<String>, usize, Arc<dyn ExecutionPlan>) {
    let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
    let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    let mut scanned = 0;
    scans_of_s(&plan, &mut scanned);
    (sorted_rows(&batches), scanned, plan)
}

fn scans_of_s(plan: &Arc<dyn ExecutionPlan>, rows: &mut usize) {
    let line = displayable(plan.as_ref()).one_line().to_string();
    if line.starts_with("DataSourceExec") && line.contains("s.parquet") {
        *rows += plan.metrics().and_then(|m| m.output_rows()).unwrap_or(0);
    }
    for child in plan.children() {
        scans_of_s(child, rows);
    }
}

/// Sessions with and without the GPU join; `partitioned`: both plan
/// `Partitioned` joins, which the GPU join keeps (rather than collecting
/// one build side), so that the filter waits for every partition's span.
async fn contexts(dir: &Path, partitioned: bool) -> (SessionContext, SessionContext) {
    let (gpu, datafusion) = (gpu_context(config(partitioned)), datafusion_context(config(partitioned)));
    if partitioned {
        run(&gpu, "SET gpu_join.collect_build_side = false").await;
    }
    register(&gpu, dir).await;
    register(&datafusion, dir).await;
    (gpu, datafusion)
}

async fn set_in_both(gpu: &SessionContext, datafusion: &SessionContext, setting: &str) {
    for ctx in [gpu, datafusion] {
        run(ctx, setting).await;
    }
}

/// The modes of the plan's GPU joins, as EXPLAIN shows them.
fn gpu_join_modes(plan: &Arc<dyn ExecutionPlan>) -> Vec<String> {
    let text = displayable(plan.as_ref()).indent(true).to_string();
    text.lines()
        .filter(|line| line.contains("GpuJoinExec"))
        .filter_map(|line| line.split("mode=").nth(1)?.split(',').next().map(str::to_string))
        .collect()
}

/// Joins whose unmatched probe rows are dropped: the build side's span
/// reaches the scan, which then hands on only the row groups it overlaps,
/// as DataFusion's plan does; in both partition modes, with a build side
/// that no probe row can match, and with three build keys far apart, whose
/// list lets the scan skip what lies between them.
#[tokio::test]
async fn the_probe_scan_skips_what_the_build_sides_span_rules_out() {
    let dir = tempfile::tempdir().unwrap();
    write_tables(dir.path()).await;
    // The most rows the scan may hand on: the row groups the build side's
    // keys fall in. `None`: the span of two key ranges far apart covers
    // what lies between them, and only the rows are compared.
    let queries = [
        ("inner", "SELECT s.k, s.v, r.w FROM s JOIN r ON s.k = r.k WHERE r.k < 6000", Some(2 * GROUP_ROWS)),
        (
            "left semi",
            "SELECT r.k, r.w FROM r WHERE r.k < 6000 AND EXISTS (SELECT 1 FROM s WHERE s.k = r.k)",
            Some(2 * GROUP_ROWS),
        ),
        ("empty build side", "SELECT s.k, r.w FROM s JOIN r ON s.k = r.k WHERE r.w > 100", Some(0)),
        ("listed keys", "SELECT s.k, s.v, r.w FROM s JOIN r ON s.k = r.k WHERE r.t = 1", Some(3 * GROUP_ROWS)),
        ("two spans", "SELECT count(*), sum(s.v), sum(r.w) FROM s JOIN r ON s.k = r.k", None),
    ];
    for partitioned in [false, true] {
        let (gpu, datafusion) = contexts(dir.path(), partitioned).await;
        for (name, sql, most) in queries {
            let what = format!("{name}, partitioned: {partitioned}");
            let (expected, datafusion_scanned, _) = rows_and_probe_scan(&datafusion, sql).await;
            let (rows, scanned, plan) = rows_and_probe_scan(&gpu, sql).await;
            assert_eq!(rows, expected, "{what}");
            let mode = if partitioned { "Partitioned" } else { "CollectLeft" };
            let modes = gpu_join_modes(&plan);
            assert!(!modes.is_empty() && modes.iter().all(|m| m == mode), "{what}: {modes:?}");
            let Some(most) = most else {
                continue;
            };
            assert!(scanned <= most, "{what}: the scan handed on {scanned} rows");
            assert!(scanned <= datafusion_scanned.max(most), "{what}: {scanned} against {datafusion_scanned}");
        }
    }
}

/// Joins that keep unmatched probe rows plant no filter, and the scan reads
/// every row, as under DataFusion's plan.
#[tokio::test]
async fn joins_keeping_unmatched_probe_rows_plant_no_filter() {
    let dir = tempfile::tempdir().unwrap();
    write_tables(dir.path()).await;
    let (gpu, datafusion) = contexts(dir.path(), false).await;
    for sql in [
        "SELECT s.k, s.v, r.w FROM r RIGHT JOIN s ON s.k = r.k",
        "SELECT s.k, s.v, r.w FROM r FULL JOIN s ON s.k = r.k",
        "SELECT s.k, s.v FROM s WHERE NOT EXISTS (SELECT 1 FROM r WHERE s.k = r.k)",
    ] {
        let (expected, _, _) = rows_and_probe_scan(&datafusion, sql).await;
        let (rows, scanned, plan) = rows_and_probe_scan(&gpu, sql).await;
        assert_eq!(rows, expected, "{sql}");
        assert_eq!(scanned, PROBE_ROWS as usize, "{sql}");
        let text = displayable(plan.as_ref()).indent(true).to_string();
        assert!(!gpu_joins(&plan).is_empty() && !text.contains("DynamicFilter"), "{sql}: {text}");
    }
}

/// Under `IS NOT DISTINCT FROM` a NULL probe key matches the build side's
/// NULL: the filter lets NULL keys through.
#[tokio::test]
async fn null_keys_that_match_pass_the_filter() {
    let dir = tempfile::tempdir().unwrap();
    write_tables(dir.path()).await;
    let (gpu, datafusion) = contexts(dir.path(), false).await;
    let sql = "SELECT s.k, s.v, r.w FROM s JOIN r ON s.k IS NOT DISTINCT FROM r.k WHERE r.k < 6000 OR r.k IS NULL";
    let (expected, _, _) = rows_and_probe_scan(&datafusion, sql).await;
    let (rows, _, _) = rows_and_probe_scan(&gpu, sql).await;
    assert!(rows.iter().any(|row| row.starts_with("NULL|")), "{rows:?}");
    assert_eq!(rows, expected);
}

/// The scans below a GPU join carry the same predicates as under
/// DataFusion's plan: the join's own dynamic filter where the hash join
/// plants one, and a top-k's filter from above routed through the join.
#[tokio::test]
async fn scans_get_the_filters_of_datafusions_plan() {
    let dir = tempfile::tempdir().unwrap();
    write_tables(dir.path()).await;
    for partitioned in [false, true] {
        let (gpu, datafusion) = contexts(dir.path(), partitioned).await;
        for sql in [
            "SELECT s.k, s.v, r.w FROM s JOIN r ON s.k = r.k",
            "SELECT s.k, s.v, r.w FROM s JOIN r ON s.k = r.k ORDER BY s.v DESC LIMIT 5",
            "SELECT s.k, s.v, r.w FROM r LEFT JOIN s ON s.k = r.k ORDER BY r.w, s.v LIMIT 5",
        ] {
            let scans = |plan: &Arc<dyn ExecutionPlan>| {
                let text = displayable(plan.as_ref()).indent(true).to_string();
                text.lines().filter(|l| l.contains("DataSourceExec")).map(|l| l.trim().to_string()).collect::<Vec<_>>()
            };
            let (expected, _, datafusion_plan) = rows_and_probe_scan(&datafusion, sql).await;
            let (rows, _, plan) = rows_and_probe_scan(&gpu, sql).await;
            assert_eq!(rows, expected, "{sql}");
            assert!(!gpu_joins(&plan).is_empty(), "{sql}");
            let (ours, theirs) = (scans(&plan), scans(&datafusion_plan));
            let planted = |scans: &[String]| scans.iter().map(|s| s.matches("DynamicFilter").count()).sum::<usize>();
            assert_eq!(planted(&ours), planted(&theirs), "{sql}, partitioned: {partitioned}\n{ours:#?}\n{theirs:#?}");
        }
    }
}

/// A build side's keys are measured against the list's byte limit once
/// gathered, as DataFusion's hash join measures them: not by the buffers
/// they arrive in, which a filter sizes for a whole batch and an
/// aggregation for all its groups.
#[tokio::test]
async fn few_keys_are_listed_whatever_buffers_they_arrive_in() {
    let dir = tempfile::tempdir().unwrap();
    write_tables(dir.path()).await;
    let (gpu, datafusion) = contexts(dir.path(), false).await;
    // Room for three keys, not for a batch's worth of buffer.
    set_in_both(&gpu, &datafusion, "SET datafusion.optimizer.hash_join_inlist_pushdown_max_size = 512").await;
    for sql in [
        "SELECT s.k, s.v, r.w FROM s JOIN r ON s.k = r.k WHERE r.t = 1",
        "SELECT s.k, s.v FROM s JOIN (SELECT k FROM r WHERE t = 1 GROUP BY k) g ON s.k = g.k",
    ] {
        probe_scan_hands_on_at_most(&gpu, &datafusion, sql, 3 * GROUP_ROWS, sql).await;
    }
}

/// Runs `sql` in both sessions: the same rows, a GPU join in the plan, and
/// a scan of `s` that handed on at most `most` rows, and no more than under
/// DataFusion's plan; `what` names the case.
async fn probe_scan_hands_on_at_most(
    gpu: &SessionContext,
    datafusion: &SessionContext,
    sql: &str,
    most: usize,
    what: &str,
) {
    let (expected, datafusion_scanned, _) = rows_and_probe_scan(datafusion, sql).await;
    let (rows, scanned, plan) = rows_and_probe_scan(gpu, sql).await;
    assert_eq!(rows, expected, "{what}");
    assert!(!gpu_joins(&plan).is_empty(), "{what}");
    assert!(scanned <= most, "{what}: the scan handed on {scanned} rows");
    assert!(scanned <= datafusion_scanned, "{what}: {scanned} against {datafusion_scanned}");
}

/// Where the scans filter rows as they decode them, a build side of more
/// keys than the hash join lists lets the probe scan hand on only the rows
/// whose keys are among the build side's, as the hash join's lookup into
/// its table does: not the thousands of rows between its two key ranges.
#[tokio::test]
async fn scans_that_filter_rows_hand_on_only_rows_with_build_keys() {
    let dir = tempfile::tempdir().unwrap();
    write_tables(dir.path()).await;
    for partitioned in [false, true] {
        let (gpu, datafusion) = contexts(dir.path(), partitioned).await;
        set_in_both(&gpu, &datafusion, "SET datafusion.execution.parquet.pushdown_filters = true").await;
        for sql in [
            "SELECT count(*), sum(s.v), sum(r.w) FROM s JOIN r ON s.k = r.k",
            "SELECT s.k, s.v, r.w FROM s JOIN r ON s.k = r.k WHERE r.k % 3 = 0",
            "SELECT r.k, r.w FROM r WHERE EXISTS (SELECT 1 FROM s WHERE s.k = r.k)",
            "SELECT count(*), sum(s.v) FROM s JOIN r ON CAST(s.k AS VARCHAR) = CAST(r.k AS VARCHAR)",
        ] {
            let what = format!("{sql}, partitioned: {partitioned}");
            // r holds 1,101 keys; the span between them covers 55,101 rows.
            probe_scan_hands_on_at_most(&gpu, &datafusion, sql, 1101, &what).await;
        }
    }
}

/// A plan DataFusion made, its joins swapped one for one (as a worker of a
/// distributed plan swaps them): the plan keeps its schema and partitions,
/// and each GPU join feeds the filter its hash join planted, so that the
/// scan skips what it skips under DataFusion's own plan.
#[tokio::test]
async fn joins_swapped_as_planned_feed_the_planted_filters() {
    let dir = tempfile::tempdir().unwrap();
    write_tables(dir.path()).await;
    let sql = "SELECT s.k, s.v, r.w FROM s JOIN r ON s.k = r.k WHERE r.k < 6000";
    for partitioned in [false, true] {
        let datafusion = datafusion_context(config(partitioned));
        register(&datafusion, dir.path()).await;
        let (expected, datafusion_scanned, _) = rows_and_probe_scan(&datafusion, sql).await;
        let planned = datafusion.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
        let (swapped, decisions) =
            replace_joins_as_planned(Arc::clone(&planned), &test_options(), &|_| false).expect("swapped");
        assert_eq!(decisions.len(), 1, "{decisions:?}");
        assert_eq!(swapped.schema(), planned.schema());
        assert_eq!(swapped.output_partitioning().partition_count(), planned.output_partitioning().partition_count());
        let text = displayable(swapped.as_ref()).indent(true).to_string();
        assert!(!text.contains("HashJoinExec:") && gpu_joins(&swapped).len() == 1, "{text}");
        let batches = collect(Arc::clone(&swapped), datafusion.task_ctx()).await.expect("the swapped plan runs");
        let mut scanned = 0;
        scans_of_s(&swapped, &mut scanned);
        assert_eq!(sorted_rows(&batches), expected, "partitioned: {partitioned}");
        assert!(scanned <= datafusion_scanned.max(2 * GROUP_ROWS), "{scanned} against {datafusion_scanned}");
    }
}

/// The keys of a semi join's build side: 50 of the 20,000 dimension keys.
const FIFTY_KEYS: &str = "SELECT value * 397 % 20000 AS k FROM generate_series(1, 50)";

/// A GPU session and DataFusion's, each with the tables of a join tree:
/// 100,000 facts `f` over 20,000 dimension rows `d` (five facts a key), and
/// the keys `s` of a semi join above them, made by `keys`.
async fn facts_dimensions_and_keys(keys: &str, partitioned: bool) -> (SessionContext, SessionContext) {
    let (gpu, datafusion) = (gpu_context(config(partitioned)), datafusion_context(config(partitioned)));
    for ctx in [&gpu, &datafusion] {
        run(ctx, "CREATE TABLE f AS SELECT value % 20000 AS k, value AS v FROM generate_series(0, 99999)").await;
        run(ctx, "CREATE TABLE d AS SELECT value AS k, value * 7 AS x FROM generate_series(0, 19999)").await;
        run(ctx, &format!("CREATE TABLE s AS {keys}")).await;
    }
    (gpu, datafusion)
}

/// A tree of GPU joins: a semi join whose build side is 50 keys, above a
/// join of 100,000 facts with 20,000 dimension rows. With
/// `gpu_join.filters_from_above`, the semi join's filter passes through the
/// join below on its way to the scans, and that join drops the dimension
/// rows none of the 50 keys matches before it joins them; in both
/// partition modes, with DataFusion's rows, as with a build side of no rows
/// or of NULL keys and keys no row has. Without it the join below applies
/// nothing.
#[tokio::test]
async fn a_join_below_drops_the_rows_the_join_above_cannot_match() {
    let build_sides = [
        (FIFTY_KEYS, 250, 19_950),
        ("SELECT value AS k FROM generate_series(1, 50) WHERE value < 0", 0, 20_000),
        ("SELECT CASE WHEN value % 2 = 0 THEN NULL ELSE value + 30000 END AS k FROM generate_series(1, 9)", 0, 20_000),
    ];
    for (semi_build, rows, dropped) in build_sides {
        for partitioned in [false, true] {
            let (gpu, datafusion) = facts_dimensions_and_keys(semi_build, partitioned).await;
            let sql = "SELECT f.v, d.x FROM f JOIN d ON f.k = d.k WHERE d.k IN (SELECT k FROM s)";
            let case = format!("{semi_build}, partitioned: {partitioned}");
            run(&gpu, "SET gpu_join.filters_from_above = false").await;
            let off = physical_plan_text(&gpu, sql).await;
            assert!(!off.contains("filters_from_above"), "{case}, filters_from_above off:\n{off}");
            run(&gpu, "SET gpu_join.filters_from_above = true").await;
            let expected = sorted_rows(&run(&datafusion, sql).await);
            let plan = gpu.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
            let batches = collect(Arc::clone(&plan), gpu.task_ctx()).await.unwrap();
            assert_eq!(sorted_rows(&batches), expected, "{case}");
            assert_eq!(expected.len(), rows, "{case}");
            let text = displayable(plan.as_ref()).indent(true).to_string();
            assert!(text.contains("filters_from_above=[build: 1"), "{case}\n{text}");
            let filtered = filtered_by_gpu_joins(&plan);
            assert!(filtered >= dropped, "only {filtered} rows were filtered ({case})\n{text}");
        }
    }
}

/// Rows the plan's GPU joins dropped with the filters from above.
fn filtered_by_gpu_joins(plan: &Arc<dyn ExecutionPlan>) -> usize {
    gpu_joins(plan)
        .iter()
        .filter_map(|join| join.metrics()?.sum_by_name("rows_filtered_from_above"))
        .map(|rows| rows.as_usize())
        .sum()
}

/// An input the plan bounds below `gpu_join.min_rows` is joined whole,
/// without waiting for the build sides above: the 20,000 rows of `d`, under
/// a join of 120,000 rows on the GPU join, drop none, where with
/// `min_rows = 0` the semi join's 50 keys drop all but 50 of them. Both
/// give DataFusion's rows, in both partition modes.
#[tokio::test]
async fn an_input_below_min_rows_does_not_wait_for_the_joins_above() {
    for partitioned in [false, true] {
        let (gpu, datafusion) = facts_dimensions_and_keys(FIFTY_KEYS, partitioned).await;
        let sql = "SELECT f.v, d.x FROM f JOIN d ON f.k = d.k WHERE d.k IN (SELECT k FROM s)";
        let expected = sorted_rows(&run(&datafusion, sql).await);
        for (min_rows, dropped) in [(0, 19_950), (50_000, 0)] {
            run(&gpu, &format!("SET gpu_join.min_rows = {min_rows}")).await;
            let case = format!("min_rows {min_rows}, partitioned: {partitioned}");
            let plan = gpu.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
            let batches = collect(Arc::clone(&plan), gpu.task_ctx()).await.unwrap();
            assert_eq!(sorted_rows(&batches), expected, "{case}");
            let text = displayable(plan.as_ref()).indent(true).to_string();
            assert!(text.contains("filters_from_above=[build: 1"), "{case}\n{text}");
            let filtered = filtered_by_gpu_joins(&plan);
            match dropped {
                0 => assert_eq!(filtered, 0, "{case}\n{text}"),
                _ => assert!(filtered >= dropped, "only {filtered} rows were filtered ({case})\n{text}"),
            }
        }
    }
}

/// The probe rows of a partition whose join goes to DataFusion's operator
/// are joined unchecked. Planned with every join on the GPU join, `f ⋈ d`
/// under a semi join of 50 keys on `f.k` drops all but 250 of `f`'s 100,000
/// rows where it joins them on the device, and none where `min_build_rows`,
/// read at run time, sends its partitions to DataFusion's operator. Both
/// give DataFusion's rows, in both partition modes.
#[tokio::test]
async fn probe_rows_joined_on_datafusion_are_not_checked() {
    for partitioned in [false, true] {
        let (gpu, datafusion) = facts_dimensions_and_keys(FIFTY_KEYS, partitioned).await;
        let sql = "SELECT f.v, d.x FROM f JOIN d ON f.k = d.k WHERE f.k IN (SELECT k FROM s)";
        let expected = sorted_rows(&run(&datafusion, sql).await);
        assert_eq!(expected.len(), 250);
        for (min_build_rows, on_device) in [(0, true), (1_000_000, false)] {
            let case = format!("min_build_rows {min_build_rows}, partitioned: {partitioned}");
            run(&gpu, "SET gpu_join.min_build_rows = 0").await;
            let plan = gpu.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
            run(&gpu, &format!("SET gpu_join.min_build_rows = {min_build_rows}")).await;
            let batches = collect(Arc::clone(&plan), gpu.task_ctx()).await.unwrap();
            assert_eq!(sorted_rows(&batches), expected, "{case}");
            let text = displayable(plan.as_ref()).indent(true).to_string();
            assert!(text.contains("filters_from_above=[build: 0, probe: 1]"), "{case}\n{text}");
            let filtered = filtered_by_gpu_joins(&plan);
            match on_device {
                true => assert!(filtered >= 99_750, "only {filtered} rows were filtered ({case})\n{text}"),
                false => {
                    let joins: Vec<&str> = text.lines().filter(|line| line.contains("GpuJoinExec")).collect();
                    let on_datafusion = joins.len() == 2 && joins.iter().all(|l| l.contains("algorithm=DataFusion"));
                    assert!(on_datafusion, "{case}: not both joins on DataFusion's operator\n{text}");
                    assert_eq!(filtered, 0, "{case}\n{text}");
                }
            }
        }
    }
}

/// Where scans filter rows as they decode them, the filter of a semi join
/// of 500 keys, more than the hash join lists, holds the set of their
/// values, and the join below drops the dimension rows none of them matches
/// by that set alone; in both partition modes, with DataFusion's rows.
#[tokio::test]
async fn a_join_below_drops_rows_by_the_key_set_of_the_filter_above() {
    let keys = "SELECT value * 37 % 20000 AS k FROM generate_series(1, 500)";
    for partitioned in [false, true] {
        let (gpu, datafusion) = facts_dimensions_and_keys(keys, partitioned).await;
        set_in_both(&gpu, &datafusion, "SET datafusion.execution.parquet.pushdown_filters = true").await;
        let sql = "SELECT f.v, d.x FROM f JOIN d ON f.k = d.k WHERE d.k IN (SELECT k FROM s)";
        let expected = sorted_rows(&run(&datafusion, sql).await);
        let plan = gpu.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
        let batches = collect(Arc::clone(&plan), gpu.task_ctx()).await.unwrap();
        assert_eq!(sorted_rows(&batches), expected, "partitioned: {partitioned}");
        assert_eq!(expected.len(), 2_500, "partitioned: {partitioned}");
        let filtered = filtered_by_gpu_joins(&plan);
        assert!(filtered >= 19_500, "only {filtered} rows were filtered (partitioned: {partitioned})");
    }
}

/// A hash join's filter from above is checked too, as it stands, without
/// waiting for it: with the semi join of 50 keys left to DataFusion's hash
/// join (`min_build_rows` above its 50 build rows), the GPU join `f ⋈ d`
/// below it drops all but 250 of `f`'s 100,000 rows, with DataFusion's
/// rows, in both partition modes.
#[tokio::test]
async fn a_hash_join_above_cuts_the_rows_of_a_gpu_join_below() {
    for partitioned in [false, true] {
        let (gpu, datafusion) = facts_dimensions_and_keys(FIFTY_KEYS, partitioned).await;
        run(&gpu, "SET gpu_join.min_build_rows = 1000").await;
        let sql = "SELECT f.v, d.x FROM f JOIN d ON f.k = d.k WHERE f.k IN (SELECT k FROM s)";
        let case = format!("partitioned: {partitioned}");
        let expected = sorted_rows(&run(&datafusion, sql).await);
        let plan = gpu.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
        let batches = collect(Arc::clone(&plan), gpu.task_ctx()).await.unwrap();
        assert_eq!(sorted_rows(&batches), expected, "{case}");
        let text = displayable(plan.as_ref()).indent(true).to_string();
        assert!(text.contains("HashJoinExec") && text.contains("probe: 1]"), "{case}\n{text}");
        let filtered = filtered_by_gpu_joins(&plan);
        assert!(filtered >= 99_750, "only {filtered} rows were filtered ({case})\n{text}");
    }
}

/// With `gpu_join.filters_from_above`, a GPU join's filter that DataFusion
/// passes through an aggregation, as it does one over grouping columns
/// only, is applied to the rows the aggregation reads: of 100,000 facts in
/// 20,000 groups, it reads only the 250 of the 50 groups the join above can
/// match. For an inner join on one and on two grouping columns and a semi
/// join, in both partition modes, with DataFusion's rows; a join on an
/// aggregated column gets no filter through, and an anti join plants none.
#[tokio::test]
async fn an_aggregation_below_reads_only_the_groups_the_join_above_can_match() {
    let grouped = "(SELECT k, j, sum(v) AS total, count(*) AS n FROM f GROUP BY k, j) a";
    let queries = [
        (format!("SELECT s.k, a.total FROM s JOIN {grouped} ON s.k = a.k"), 50, 99_750),
        (format!("SELECT s.k, a.total FROM s JOIN {grouped} ON s.k = a.k AND s.j = a.j"), 50, 99_750),
        (format!("SELECT a.k, a.total FROM {grouped} WHERE a.k IN (SELECT k FROM s)"), 50, 99_750),
        (format!("SELECT s.k, a.k FROM s JOIN {grouped} ON s.k + 1 = a.n"), 0, 0),
        (format!("SELECT a.k FROM {grouped} WHERE NOT EXISTS (SELECT 1 FROM s WHERE s.k = a.k)"), 19_950, 0),
    ];
    for partitioned in [false, true] {
        let (gpu, datafusion) = (gpu_context(config(partitioned)), datafusion_context(config(partitioned)));
        for ctx in [&gpu, &datafusion] {
            let facts = "SELECT value % 20000 AS k, value % 20000 % 7 AS j, value AS v FROM generate_series(0, 99999)";
            run(ctx, &format!("CREATE TABLE f AS {facts}")).await;
            let keys = "SELECT value * 397 % 20000 AS k, value * 397 % 20000 % 7 AS j FROM generate_series(1, 50)";
            run(ctx, &format!("CREATE TABLE s AS {keys}")).await;
        }
        for (sql, rows, dropped) in &queries {
            let case = format!("{sql}, partitioned: {partitioned}");
            run(&gpu, "SET gpu_join.filters_from_above = false").await;
            let off = physical_plan_text(&gpu, sql).await;
            assert!(!off.contains("FilteredFromAboveExec"), "{case}, filters_from_above off:\n{off}");
            run(&gpu, "SET gpu_join.filters_from_above = true").await;
            let expected = sorted_rows(&run(&datafusion, sql).await);
            let plan = gpu.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
            let batches = collect(Arc::clone(&plan), gpu.task_ctx()).await.unwrap();
            assert_eq!(sorted_rows(&batches), expected, "{case}");
            assert_eq!(expected.len(), *rows, "{case}");
            let text = displayable(plan.as_ref()).indent(true).to_string();
            assert!(text.contains("FilteredFromAboveExec"), "{case}\n{text}");
            let filtered = filtered_under_aggregations(&plan);
            match dropped {
                0 => assert_eq!(filtered, 0, "{case}\n{text}"),
                _ => assert!(filtered >= *dropped, "only {filtered} rows were filtered ({case})\n{text}"),
            }
        }
    }
}

/// The rows the plan's `FilteredFromAboveExec` nodes dropped.
fn filtered_under_aggregations(plan: &Arc<dyn ExecutionPlan>) -> usize {
    let own = match plan.downcast_ref::<FilteredFromAboveExec>() {
        Some(node) => {
            node.metrics().and_then(|m| m.sum_by_name("rows_filtered_from_above")).map_or(0, |r| r.as_usize())
        }
        None => 0,
    };
    own + plan.children().into_iter().map(filtered_under_aggregations).sum::<usize>()
}
