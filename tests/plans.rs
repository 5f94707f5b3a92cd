//! Planning: where the rule sits, which joins it replaces, the reasons it
//! gives for the others, what EXPLAIN ANALYZE shows, and behaviour without a
//! CUDA driver.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use arrow::array::{Array, ArrayRef, AsArray, Int32Array, Int64Array, RecordBatch, StringArray, StringViewArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::catalog::TableProvider;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::common::JoinType;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::MemTable;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::DataFusionError;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream, Statistics, collect,
    displayable,
};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu_join::algorithms::choice::PlanStatistics;
use datafusion_gpu_join::backend::cuda_backend;
use datafusion_gpu_join::config::{BackendChoice, GpuJoinConfig, ProbeOrderChoice};
use datafusion_gpu_join::exec::ReplacedOperator;
use datafusion_gpu_join::{GpuJoinContextExt, GpuJoinExec, GpuJoinRule, NotOnGpu, Placement, SessionStateBuilderExt};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};

use crate::common::{
    datafusion_context, gpu_context, gpu_joins, physical_plan_text, run, sorted_rows, test_backend, test_options,
    total_rows,
};

async fn context_with_tables(config: SessionConfig) -> SessionContext {
    let ctx = gpu_context(config);
    for sql in [
        "CREATE TABLE l (k INT, x INT, s VARCHAR) AS VALUES (1, 10, 'a'), (2, 20, 'b'), (2, 21, 'bb'), (NULL, 40, 'n'), (5, 50, 'e')",
        "CREATE TABLE r (k INT, y INT, t VARCHAR) AS VALUES (2, 200, 'B'), (3, 300, 'C'), (5, 500, 'E'), (NULL, 0, 'N')",
    ] {
        run(&ctx, sql).await;
    }
    ctx
}

/// DataFusion's `CollectLeft` hash join of two inputs on their column `k`
/// (the first), without a filter.
fn collect_left_join_on_k(
    build: Arc<dyn ExecutionPlan>,
    probe: Arc<dyn ExecutionPlan>,
    join_type: JoinType,
) -> HashJoinExec {
    HashJoinExec::try_new(
        build,
        probe,
        vec![(Arc::new(Column::new("k", 0)), Arc::new(Column::new("k", 0)))],
        None,
        &join_type,
        None,
        PartitionMode::CollectLeft,
        datafusion::common::NullEquality::NullEqualsNothing,
        false,
    )
    .unwrap()
}

#[test]
fn rule_sits_right_before_filter_pushdown_post_once() {
    let state = SessionStateBuilder::new().with_default_features().with_gpu_join().with_gpu_join().build();
    let names: Vec<&str> = state.physical_optimizers().iter().map(|r| r.name()).collect();
    let position = names.iter().position(|n| *n == GpuJoinRule::NAME).expect("rule registered");
    assert_eq!(names[position + 1], "FilterPushdown(Post)", "{names:?}");
    assert_eq!(names.iter().filter(|n| **n == GpuJoinRule::NAME).count(), 1, "{names:?}");
    assert!(state.config().options().extensions.get::<GpuJoinConfig>().is_some());
}

#[tokio::test]
async fn every_join_type_is_planned_on_the_gpu_join() {
    let ctx = context_with_tables(SessionConfig::new().with_target_partitions(2)).await;
    run(&ctx, "CREATE TABLE big (k INT, z INT) AS SELECT i % 7, i FROM generate_series(1, 40) t(i)").await;
    // The planner builds on the smaller side, so each query runs both ways,
    // in CollectLeft mode and then in Partitioned mode.
    let mut types = BTreeSet::new();
    for (a, b, settings) in
        [("l", "big", &[][..]), ("big", "l", &[]), ("l", "big", &PARTITIONED), ("big", "l", &PARTITIONED)]
    {
        for setting in settings {
            run(&ctx, setting).await;
        }
        let mut queries: Vec<String> = [
            "JOIN",
            "LEFT JOIN",
            "RIGHT JOIN",
            "FULL JOIN",
            "LEFT SEMI JOIN",
            "RIGHT SEMI JOIN",
            "LEFT ANTI JOIN",
            "RIGHT ANTI JOIN",
        ]
        .iter()
        .map(|join| format!("SELECT * FROM {a} {join} {b} ON {a}.k = {b}.k"))
        .collect();
        queries.push(format!("SELECT * FROM {a} WHERE EXISTS (SELECT 1 FROM {b} WHERE {a}.k = {b}.k) OR {a}.k > 3"));
        for sql in queries {
            for decision in ctx.gpu_join_decisions(&sql).await.expect("plans") {
                assert!(matches!(decision.placement, Placement::Gpu { .. }), "{sql}: {decision}");
                types.insert(format!("{:?}", decision.join_type));
            }
        }
    }
    assert_eq!(types.len(), 10, "join types planned: {types:?}");
}

/// RightMark comes from swapping a LeftMark join whose build side is the
/// larger one; build such a join by hand and check it runs and matches.
#[tokio::test]
async fn right_mark_join_runs_like_hash_join() {
    let schema =
        Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true), Field::new("v", DataType::Utf8, true)]));
    let side = |keys: Vec<Option<i64>>| {
        let n = keys.len();
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from(keys)),
                Arc::new(StringArray::from_iter((0..n).map(|i| Some(format!("v{i}"))))),
            ],
        )
        .unwrap();
        MemorySourceConfig::try_new_exec(&[vec![batch]], Arc::clone(&schema), None).unwrap() as Arc<dyn ExecutionPlan>
    };
    let join = || {
        collect_left_join_on_k(
            side(vec![Some(1), Some(2), None, Some(2)]),
            side(vec![Some(2), Some(3), None, Some(1), Some(7)]),
            JoinType::RightMark,
        )
    };
    let task = SessionContext::new().task_ctx();
    let expected = collect(Arc::new(join()), Arc::clone(&task)).await.unwrap();
    let gpu = GpuJoinExec::try_new(&join(), test_backend(), &test_options(), ReplacedOperator::HashJoin).unwrap();
    let actual = collect(Arc::new(gpu), task).await.unwrap();
    assert_eq!(sorted_rows(&actual), sorted_rows(&expected));
    assert_eq!(sorted_rows(&actual), ["1|v3|true", "2|v0|true", "3|v1|false", "7|v4|false", "NULL|v2|false"]);
}

/// A plan node that computes its input's statistics and counts how often.
#[derive(Debug)]
struct CountedStatistics {
    input: Arc<dyn ExecutionPlan>,
    computed: Arc<AtomicUsize>,
}

impl DisplayAs for CountedStatistics {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "CountedStatistics")
    }
}

impl ExecutionPlan for CountedStatistics {
    fn name(&self) -> &str {
        "CountedStatistics"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> datafusion::error::Result<TreeNodeRecursion>,
    ) -> datafusion::error::Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        _: Vec<Arc<dyn ExecutionPlan>>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> datafusion::error::Result<SendableRecordBatchStream> {
        self.input.execute(partition, context)
    }

    fn statistics_from_inputs(
        &self,
        _: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> datafusion::error::Result<Arc<Statistics>> {
        self.computed.fetch_add(1, Ordering::SeqCst);
        StatisticsContext::new().compute(self.input.as_ref(), args)
    }
}

/// Each join the rule weighs asks for both its inputs' statistics, and the
/// probe input of every join of a star holds the fact table: the rule
/// computes each node's statistics once for the whole plan, not once per
/// join above it (an in-memory table's are a pass over all its arrays).
#[test]
fn the_rule_computes_each_inputs_statistics_once() {
    let table = |keys: Vec<Option<i64>>| {
        MemorySourceConfig::try_new_exec(&[vec![numbered_batch(keys)]], numbered_schema(), None).unwrap()
    };
    let computed = Arc::new(AtomicUsize::new(0));
    let fact = CountedStatistics { input: table((0..50).map(Some).collect()), computed: Arc::clone(&computed) };
    let mut plan: Arc<dyn ExecutionPlan> = Arc::new(fact);
    for dimension in 0..4 {
        let build = table((dimension..dimension + 10).map(Some).collect());
        plan = Arc::new(collect_left_join_on_k(build, plan, JoinType::Inner));
    }
    let config = SessionConfig::new().with_option_extension(test_options());
    let planned = GpuJoinRule.optimize(plan, config.options()).unwrap();
    assert_eq!(gpu_joins(&planned).len(), 4, "{}", displayable(planned.as_ref()).indent(true));
    assert_eq!(computed.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn joins_left_on_datafusion_say_why() {
    let ctx = context_with_tables(SessionConfig::new()).await;
    // A list key is not a supported key type.
    let decisions = ctx
        .gpu_join_decisions(
            "SELECT * FROM (SELECT make_array(k) AS a FROM l) x JOIN (SELECT make_array(k) AS a FROM r) y ON x.a = y.a",
        )
        .await
        .unwrap();
    assert_eq!(decisions.len(), 1);
    assert!(
        matches!(&decisions[0].placement, Placement::NotOnGpu(NotOnGpu::UnsupportedKeyType(DataType::List(_)))),
        "{}",
        decisions[0]
    );
    assert!(decisions[0].to_string().contains("stays on DataFusion: unsupported key type List"), "{}", decisions[0]);

    run(&ctx, "SET gpu_join.min_rows = 100").await;
    let decisions = ctx.gpu_join_decisions("SELECT * FROM l JOIN r ON l.k = r.k").await.unwrap();
    assert_eq!(decisions[0].placement, Placement::NotOnGpu(NotOnGpu::BelowMinRows { rows: 9, min_rows: 100 }));

    run(&ctx, "SET gpu_join.enabled = false").await;
    let decisions = ctx.gpu_join_decisions("SELECT * FROM l JOIN r ON l.k = r.k").await.unwrap();
    assert_eq!(decisions[0].placement, Placement::NotOnGpu(NotOnGpu::Disabled));
    assert!(physical_plan_text(&ctx, "SELECT * FROM l JOIN r ON l.k = r.k").await.contains("HashJoinExec"));
}

#[tokio::test]
async fn explain_analyze_shows_rows_bytes_phases_and_memory() {
    let ctx = context_with_tables(SessionConfig::new()).await;
    let text = explain_analyze(&ctx, "SELECT l.s, r.t FROM l JOIN r ON l.k = r.k").await;
    let line = text.lines().find(|l| l.contains("GpuJoinExec")).unwrap_or_else(|| panic!("{text}"));
    for metric in [
        "output_rows=3",
        "build_rows=4",
        "probe_rows=5",
        "output_batches=1",
        "bytes_to_device=",
        "bytes_from_device=",
        "transform_time=",
        "match_time=",
        "materialize_time=",
        "build_collect_time=",
        "build_prepare_time=",
        "probe_staging_time=",
        "admission_wait_time=",
        "peak_device_memory=",
    ] {
        assert!(line.contains(metric), "{metric} missing from {line}");
    }
}

/// EXPLAIN shows the strategy the settings or fixed rules give, or `auto`
/// where the build side's keys (dense enough for a directory join or not)
/// or the device's cost model choose per build side; EXPLAIN ANALYZE then
/// shows what ran and why.
#[tokio::test]
async fn explain_shows_the_strategy_and_explain_analyze_the_reason() {
    let ctx = context_with_tables(SessionConfig::new()).await;
    let sql = "SELECT l.s, r.t FROM l JOIN r ON l.k = r.k";
    let planned = physical_plan_text(&ctx, sql).await;
    let analyzed = explain_analyze(&ctx, sql).await;
    let line = analyzed.lines().find(|l| l.contains("GpuJoinExec")).unwrap_or_else(|| panic!("{analyzed}"));
    assert!(planned.contains("algorithm=auto"), "{planned}");
    assert!(!line.contains("algorithm=auto") && line.contains("chosen=["), "{line}");
    match test_options().backend {
        BackendChoice::Cuda => {
            assert!(line.contains("estimated ") && line.contains("4 build rows, 5 probe rows"), "{line}");
        }
        // Keys 2 to 5 of the build side (r) take 4 codes: a directory join,
        // by the fixed rule.
        _ => assert!(line.contains("algorithm=DIR-UM") && line.contains("fixed rule; 4 key codes"), "{line}"),
    }
    run(&ctx, "SET gpu_join.algorithm = 'hash'").await;
    if test_options().backend != BackendChoice::Cuda {
        assert!(physical_plan_text(&ctx, sql).await.contains("algorithm=PHJ-UM"));
    }
    run(&ctx, "SET gpu_join.algorithm = 'sort_merge'").await;
    run(&ctx, "SET gpu_join.materialization = 'transformed'").await;
    assert!(physical_plan_text(&ctx, sql).await.contains("algorithm=SMJ-OM"));
}

/// A join the plan's statistics sent to the device, whose build side turns
/// out smaller than they said, is joined by DataFusion's operator once the
/// build side is collected; EXPLAIN ANALYZE says so and why. In both
/// partition modes, for a join that emits build rows too.
#[tokio::test]
async fn a_build_side_smaller_than_estimated_is_left_to_datafusion() {
    for (join, settings, mode) in [
        ("JOIN", &[][..], "CollectLeft"),
        ("LEFT JOIN", &[], "CollectLeft"),
        ("JOIN", &PARTITIONED[..], "Partitioned"),
        ("LEFT JOIN", &PARTITIONED, "Partitioned"),
    ] {
        let (ctx, reference) = four_partition_sessions(settings, &FACTS_AND_PARTS).await;
        // 40 rows pass the filter; statistics cannot tell how many. Grouping
        // by the key keeps a `Partitioned` join partitioned.
        let sql = format!(
            "SELECT b.k, count(*), sum(p.w) FROM (SELECT k, z FROM f WHERE z % 100 = 0) b {join} p ON b.k = p.k \
             GROUP BY b.k"
        );
        let plan = ctx.sql(&sql).await.unwrap().create_physical_plan().await.unwrap();
        let gpu_join = gpu_joins(&plan).pop().expect("a GPU join");
        let statistics = PlanStatistics::default();
        let rows = |plan| statistics.of(plan).and_then(|s| s.num_rows.get_value().copied()).expect("estimated rows");
        let estimated = rows(gpu_join.left()) + rows(gpu_join.right());
        assert!(40 + 2000 < estimated, "the statistics must overestimate the build side for this test: {estimated}");

        run(&ctx, &format!("SET gpu_join.min_rows = {estimated}")).await;
        let planned = physical_plan_text(&ctx, &sql).await;
        assert!(planned.contains(&format!("mode={mode}")), "the plan passes min_rows, in {mode} mode: {planned}");
        let analyzed = explain_analyze(&ctx, &sql).await;
        let line = analyzed.lines().find(|l| l.contains("GpuJoinExec")).unwrap_or_else(|| panic!("{analyzed}"));
        assert!(line.contains("algorithm=DataFusion"), "{line}");
        let reason = match mode {
            "CollectLeft" => format!(
                "DataFusion: 40 build rows as collected make about 2040 rows to join, below gpu_join.min_rows = \
                 {estimated}"
            ),
            _ => format!("rows to join, below gpu_join.min_rows = {estimated}"),
        };
        assert!(line.contains(&reason), "{line}");
        let expected = sorted_rows(&run(&reference, &sql).await);
        // The time of DataFusion's operator counts as the join's.
        let plan = ctx.sql(&sql).await.unwrap().create_physical_plan().await.unwrap();
        assert_eq!(
            sorted_rows(&collect(Arc::clone(&plan), ctx.task_ctx()).await.unwrap()),
            expected,
            "{join} in {mode}"
        );
        let compute = gpu_joins(&plan).pop().and_then(|join| join.metrics()?.elapsed_compute()).unwrap_or(0);
        assert!(compute > 1000, "DataFusion's operator's time is not the join's: {compute} ns ({join} in {mode} mode)");

        // At its observed size the device joins it. Each partition scales
        // its own rows to the whole join, so with 7 keys over 4 partitions
        // some judge it smaller than it is: there, only 0 keeps it whole.
        let observed = if mode == "CollectLeft" { 40 + 2000 } else { 0 };
        run(&ctx, &format!("SET gpu_join.min_rows = {observed}")).await;
        let analyzed = explain_analyze(&ctx, &sql).await;
        let line = analyzed.lines().find(|l| l.contains("GpuJoinExec")).unwrap_or_else(|| panic!("{analyzed}"));
        assert!(!line.contains("DataFusion"), "{line}");
        assert_eq!(sorted_rows(&run(&ctx, &sql).await), expected, "{join} in {mode} mode");
    }
}

/// A build side above a join, which DataFusion's statistics put at the
/// smaller input's size (here 5 rows for 4,000), is not judged by that
/// guess: the plan keeps the GPU join, and the rows as collected send it to
/// the device. A build side whose rows the plan bounds (a filtered table)
/// is still left to DataFusion at planning when even its bound is small.
#[tokio::test]
async fn a_build_side_above_a_join_is_judged_by_its_rows_as_collected() {
    let config = || SessionConfig::new().with_target_partitions(4);
    let (ctx, reference) = (gpu_context(config()), datafusion_context(config()));
    create_warehouse_facts([&ctx, &reference]).await;
    let sql = "SELECT b.name, d.label, b.q FROM (SELECT w.name, f.ik, f.q FROM w JOIN f ON w.wk = f.wk) b \
               JOIN d ON b.ik = d.ik";
    let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
    let joins = gpu_joins(&plan);
    assert_eq!(joins.len(), 2, "{}", displayable(plan.as_ref()).indent(true));
    let statistics = PlanStatistics::default();
    let upper = joins[1];
    let build_estimate = statistics.of(upper.left()).and_then(|s| s.num_rows.get_value().copied());
    assert!(
        build_estimate.is_some_and(|rows| rows < 100),
        "the statistics must underestimate the join below for this test: {build_estimate:?}, {}",
        displayable(plan.as_ref()).indent(true)
    );
    assert_eq!(statistics.row_bound(upper.left()), None, "no bound above a join");
    assert_eq!(statistics.row_bound(upper.right()), Some(50));

    run(&ctx, "SET gpu_join.min_rows = 1000").await;
    let analyzed = explain_analyze(&ctx, sql).await;
    let line = analyzed.lines().find(|l| l.contains("GpuJoinExec")).unwrap_or_else(|| panic!("{analyzed}"));
    assert!(line.contains("build_rows=4.00 K") && !line.contains("algorithm=DataFusion"), "{line}");
    assert_eq!(sorted_rows(&run(&ctx, sql).await), sorted_rows(&run(&reference, sql).await));

    // Bounded build sides: 5 + 50 rows at most, and the probe side's 4,000
    // estimated, stay on DataFusion at planning below 4,055.
    let decisions = ctx.gpu_join_decisions(sql).await.unwrap();
    assert_eq!(decisions.len(), 2);
    run(&ctx, "SET gpu_join.min_rows = 4056").await;
    let decisions = ctx.gpu_join_decisions(sql).await.unwrap();
    let below = decisions.iter().filter(|d| matches!(d.placement, Placement::NotOnGpu(NotOnGpu::BelowMinRows { .. })));
    assert_eq!(below.count(), 1, "{decisions:?}");
}

/// Five warehouses (`w`), 4,000 facts (`f`) and 50 items (`d`) in each
/// context: a fact table joined with a dimension so small that
/// DataFusion's statistics put the join at the dimension's rows.
async fn create_warehouse_facts(contexts: [&SessionContext; 2]) {
    for context in contexts {
        run(context, "CREATE TABLE w (wk INT, name VARCHAR) AS SELECT i, 'w' || i FROM generate_series(0, 4) t(i)")
            .await;
        run(
            context,
            "CREATE TABLE f (wk INT, ik INT, q INT) AS SELECT i % 5, i % 50, i FROM generate_series(1, 4000) t(i)",
        )
        .await;
        run(context, "CREATE TABLE d (ik INT, label VARCHAR) AS SELECT i, 'i' || i FROM generate_series(0, 49) t(i)")
            .await;
    }
}

/// A join whose build side lies above a join, whose estimate says the join
/// is small, is left to be judged by its rows as collected, and keeps the
/// shape DataFusion planned: should its build side go to DataFusion's
/// operator, that operator then runs its `Partitioned` plan, partitions in
/// parallel. A join the statistics call large is collected into one build
/// side, as before.
#[tokio::test]
async fn a_join_sized_at_run_time_keeps_datafusions_partitions() {
    let config = || {
        let mut config = SessionConfig::new().with_target_partitions(4);
        let optimizer = &mut config.options_mut().optimizer;
        optimizer.hash_join_single_partition_threshold = 0;
        optimizer.hash_join_single_partition_threshold_rows = 0;
        config
    };
    let (ctx, reference) = (gpu_context(config()), datafusion_context(config()));
    create_warehouse_facts([&ctx, &reference]).await;
    let sql = "SELECT b.name, d.label, b.q FROM (SELECT w.name, f.ik, f.q FROM w JOIN f ON w.wk = f.wk) b \
               LEFT JOIN d ON b.ik = d.ik";
    run(&ctx, "SET gpu_join.min_rows = 1000").await;
    let modes = |sql: &'static str| async {
        let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
        let text = displayable(plan.as_ref()).indent(true).to_string();
        (gpu_joins(&plan).iter().map(|join| (join.join_type(), join.partition_mode())).collect::<Vec<_>>(), text)
    };
    let (large, text) = modes("SELECT w.name, f.q FROM w JOIN f ON w.wk = f.wk").await;
    assert_eq!(large, [(JoinType::Inner, PartitionMode::CollectLeft)], "{text}");
    let (joins, text) = modes(sql).await;
    assert_eq!(joins.last(), Some(&(JoinType::Left, PartitionMode::Partitioned)), "{text}");
    // The left join repartitions the join below it by its own key, so
    // nothing relies on that join's partitions: it collects `w`'s 5 rows
    // as its one build side, which DataFusion's operator joins, and `f`
    // is not repartitioned for it.
    run(&ctx, "SET gpu_join.min_build_rows = 1000000").await;
    let analyzed = explain_analyze(&ctx, sql).await;
    // Each partition's 12 or so probe rows build the hash table.
    assert_eq!(analyzed.matches("algorithm=DataFusion (sides swapped), mode=Partitioned").count(), 1, "{analyzed}");
    assert_eq!(analyzed.matches("mode=CollectLeft, join_type=Inner").count(), 1, "{analyzed}");
    assert_eq!(analyzed.matches("RepartitionExec: partitioning=Hash").count(), 2, "{analyzed}");
    assert_eq!(sorted_rows(&run(&ctx, sql).await), sorted_rows(&run(&reference, sql).await));
}

/// The most rows a plan can give adds up a union's inputs, and counts an
/// aggregate over grouping sets once per set for each row it reads: a
/// rollup gives more rows than it reads, which a bound of its input's rows
/// would leave a join above it to DataFusion for.
#[tokio::test]
async fn row_bounds_add_up_unions_and_count_grouping_sets() {
    let ctx = datafusion_context(SessionConfig::new().with_target_partitions(3));
    run(&ctx, "CREATE TABLE a (k INT, g INT) AS SELECT i, i % 3 FROM generate_series(1, 100) t(i)").await;
    run(&ctx, "CREATE TABLE b (k INT, g INT) AS SELECT i, i % 7 FROM generate_series(1, 40) t(i)").await;
    let statistics = PlanStatistics::default();
    for (sql, bound) in [
        ("SELECT k FROM a UNION ALL SELECT k FROM b", 140),
        ("SELECT k, g FROM a WHERE g = 1 UNION ALL SELECT k, g FROM b UNION ALL SELECT k, g FROM a", 240),
        ("SELECT k, g, count(*) FROM a GROUP BY ROLLUP (k, g)", 100 * 3),
        ("SELECT g, count(*) FROM a GROUP BY CUBE (k, g)", 100 * 4),
    ] {
        let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
        let rows = total_rows(&collect(Arc::clone(&plan), ctx.task_ctx()).await.unwrap());
        let found = statistics.row_bound(&plan);
        assert!(found.is_some_and(|found| found >= rows), "{sql}: {found:?} for {rows} rows");
        assert!(found.is_some_and(|found| found <= bound), "{sql}: {found:?}, expected at most {bound}");
    }
}

/// DataFusion's settings that plan equi-joins `Partitioned` however small,
/// each side where the query puts it.
const PARTITIONED: [&str; 3] = [
    "SET datafusion.optimizer.hash_join_single_partition_threshold = 0",
    "SET datafusion.optimizer.hash_join_single_partition_threshold_rows = 0",
    "SET datafusion.optimizer.join_reordering = false",
];

/// 4,000 facts (`f`) over 7 keys, 40 of them passing `z % 100 = 0`, and
/// 2,000 parts (`p`) over 11 keys.
const FACTS_AND_PARTS: [&str; 2] = [
    "CREATE TABLE f (k INT, z INT) AS SELECT i % 7, i FROM generate_series(1, 4000) t(i)",
    "CREATE TABLE p (k INT, w INT) AS SELECT i % 11, i FROM generate_series(1, 2000) t(i)",
];

/// A GPU session and DataFusion's, of 4 partitions, each given `settings`
/// and then `tables`.
async fn four_partition_sessions(settings: &[&str], tables: &[&str]) -> (SessionContext, SessionContext) {
    let config = || SessionConfig::new().with_target_partitions(4);
    let (ctx, reference) = (gpu_context(config()), datafusion_context(config()));
    for context in [&ctx, &reference] {
        for sql in settings.iter().chain(tables) {
            run(context, sql).await;
        }
    }
    (ctx, reference)
}

/// A build side (a partition's, in `Partitioned` mode) with fewer rows than
/// `gpu_join.min_build_rows` as collected is joined by DataFusion's
/// operator, and EXPLAIN ANALYZE says why; at the limit the device joins it.
#[tokio::test]
async fn a_small_build_side_is_left_to_datafusion() {
    let sql = "SELECT b.k, count(*), sum(p.w) FROM (SELECT k, z FROM f WHERE z % 100 = 0) b JOIN p ON b.k = p.k \
               GROUP BY b.k";
    for (settings, mode) in [(&PARTITIONED[..], "Partitioned"), (&[][..], "CollectLeft")] {
        let (ctx, reference) = four_partition_sessions(settings, &FACTS_AND_PARTS).await;
        let expected = sorted_rows(&run(&reference, sql).await);
        // 40 build rows in all; each of the 4 partitions has fewer.
        for (min_build_rows, on_datafusion) in [(41, true), (40, mode == "Partitioned"), (0, false)] {
            run(&ctx, &format!("SET gpu_join.min_build_rows = {min_build_rows}")).await;
            let analyzed = explain_analyze(&ctx, sql).await;
            let line = analyzed.lines().find(|l| l.contains("GpuJoinExec")).unwrap_or_else(|| panic!("{analyzed}"));
            assert!(line.contains(&format!("mode={mode}")), "{line}");
            let reason = format!("build rows as collected, below gpu_join.min_build_rows = {min_build_rows}");
            assert_eq!(line.contains(&reason), on_datafusion, "{line}");
            assert_eq!(line.contains("algorithm=DataFusion"), on_datafusion, "{line}");
            assert_eq!(sorted_rows(&run(&ctx, sql).await), expected, "{mode}, min_build_rows = {min_build_rows}");
        }
    }
}

/// Joins on one key, one above the other: DataFusion partitions each by the
/// key and the upper one takes the lower one's output as it is partitioned.
/// Nothing relies on the upper join's partitioning, so it collects its build
/// side; the lower one then needn't keep its partitions for it and collects
/// its build side too: no input of either is hash-repartitioned. The rows
/// are DataFusion's, the semi and anti joins' filters included.
#[tokio::test]
async fn joins_on_one_key_over_each_other_all_collect_their_build_sides() {
    let tables = [
        "CREATE TABLE a (k INT, x INT) AS SELECT i % 300, i FROM generate_series(1, 3000) t(i)",
        "CREATE TABLE b (k INT, y INT) AS SELECT CASE WHEN i % 97 = 0 THEN NULL ELSE i % 400 END, i % 7 \
         FROM generate_series(1, 2500) t(i)",
        "CREATE TABLE c (k INT, z INT) AS SELECT i % 250, i % 5 FROM generate_series(1, 2000) t(i)",
    ];
    let (ctx, reference) = four_partition_sessions(&PARTITIONED, &tables).await;
    for sql in [
        "SELECT a.k, a.x, b.y, c.z FROM a JOIN b ON a.k = b.k JOIN c ON b.k = c.k",
        "SELECT a.k, a.x FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k = a.k AND b.y <> a.x % 7) \
         AND NOT EXISTS (SELECT 1 FROM c WHERE c.k = a.k AND c.z <> a.x % 5)",
    ] {
        let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
        let text = displayable(plan.as_ref()).indent(true).to_string();
        let modes: Vec<_> = gpu_joins(&plan).iter().map(|join| join.partition_mode()).collect();
        assert_eq!(modes, [PartitionMode::CollectLeft; 2], "{text}");
        assert!(!text.contains("partitioning=Hash"), "{text}");
        assert_eq!(sorted_rows(&run(&ctx, sql).await), sorted_rows(&run(&reference, sql).await), "{sql}");
    }
    // Where DataFusion's own operator joins, the plan is DataFusion's.
    run(&ctx, "SET gpu_join.enabled = false").await;
    let plan = ctx.sql("SELECT a.x, c.z FROM a JOIN b ON a.k = b.k JOIN c ON b.k = c.k").await.unwrap();
    let text = displayable(plan.create_physical_plan().await.unwrap().as_ref()).indent(true).to_string();
    assert_eq!(text.matches("HashJoinExec: mode=Partitioned").count(), 2, "{text}");
}

/// `many`: 4,000 rows over 500 keys, every 50th key null; `few`: 60 rows,
/// some keys matching twice, some not at all, one null.
const MANY_AND_FEW: [&str; 2] = [
    "CREATE TABLE many (k INT, v INT) AS \
     SELECT CASE WHEN i % 50 = 0 THEN NULL ELSE i % 500 END, i FROM generate_series(1, 4000) t(i)",
    "CREATE TABLE few (k INT, w INT) AS \
     SELECT CASE WHEN i = 7 THEN NULL ELSE (i * 13) % 600 END, i FROM generate_series(1, 60) t(i)",
];

/// Runs each query of `swapped` and `kept` with `gpu_join.build_smaller_side`
/// on and off: each gives DataFusion's rows, its join runs in `mode`, and
/// EXPLAIN ANALYZE shows DataFusion's operator with the sides swapped for
/// `swapped` while the setting is on, and as planned otherwise; `NOT IN`,
/// always planned `CollectLeft`, is only checked for not being swapped.
async fn check_swapped_sides(
    ctx: &SessionContext,
    reference: &SessionContext,
    mode: &str,
    swapped: &[&str],
    kept: &[&str],
) {
    for build_smaller_side in [true, false] {
        run(ctx, &format!("SET gpu_join.build_smaller_side = {build_smaller_side}")).await;
        for (sql, swaps) in swapped.iter().map(|s| (s, build_smaller_side)).chain(kept.iter().map(|s| (s, false))) {
            let analyzed = explain_analyze(ctx, sql).await;
            let line = analyzed.lines().find(|l| l.contains("GpuJoinExec")).unwrap_or_else(|| panic!("{analyzed}"));
            if !sql.contains("NOT IN") {
                assert!(line.contains(&format!("mode={mode}")) && line.contains("algorithm=DataFusion"), "{line}");
            }
            assert_eq!(line.contains("algorithm=DataFusion (sides swapped)"), swaps, "{sql}: {line}");
            assert_eq!(line.contains("built the hash table"), swaps, "{sql}: {line}");
            let expected = sorted_rows(&run(reference, sql).await);
            assert!(!expected.is_empty(), "{sql}");
            let rows = sorted_rows(&run(ctx, sql).await);
            assert_eq!(rows, expected, "{sql}, build_smaller_side = {build_smaller_side}");
        }
    }
}

/// A partition's build side left to DataFusion's operator whose probe
/// partition has fewer than half its rows is joined with the sides swapped:
/// the probe rows build the hash table. Every join type DataFusion swaps
/// gives DataFusion's rows, over keys with nulls and duplicates and with a
/// filter; `NOT IN` is not swapped, nor is a probe partition larger than
/// that (its rows read first go to the operator ahead of the rest), nor any
/// with `build_smaller_side = false`. EXPLAIN ANALYZE says which.
#[tokio::test]
async fn a_partitions_smaller_probe_side_builds_the_hash_table() {
    let (ctx, reference) = four_partition_sessions(&PARTITIONED, &MANY_AND_FEW).await;
    // Each partition's build side (about 1,000 rows) goes to DataFusion's
    // operator; the 4,000 the build side may have at most keep it replaced.
    for setting in ["SET gpu_join.collect_build_side = false", "SET gpu_join.min_build_rows = 2000"] {
        run(&ctx, setting).await;
    }
    let swapped = [
        "SELECT many.v, few.w FROM many JOIN few ON many.k = few.k",
        "SELECT many.v, few.w FROM many LEFT JOIN few ON many.k = few.k",
        "SELECT many.v, few.w FROM many RIGHT JOIN few ON many.k = few.k",
        "SELECT many.v, few.w FROM many FULL JOIN few ON many.k = few.k",
        "SELECT many.v, few.w FROM many JOIN few ON many.k = few.k AND many.v > few.w * 40",
        "SELECT many.v, few.w FROM many LEFT JOIN few ON many.k = few.k AND many.v > few.w * 40",
        "SELECT v FROM many WHERE EXISTS (SELECT 1 FROM few WHERE few.k = many.k)",
        "SELECT v FROM many WHERE NOT EXISTS (SELECT 1 FROM few WHERE few.k = many.k)",
    ];
    let kept = [
        "SELECT v FROM many WHERE k NOT IN (SELECT k FROM few WHERE w <> 7)",
        "SELECT m.v, n.v FROM (SELECT * FROM many WHERE v % 100 < 3) m JOIN many n ON m.k = n.k",
        "SELECT m.v, n.v FROM (SELECT * FROM many WHERE v % 100 < 3) m LEFT JOIN many n ON m.k = n.k",
    ];
    check_swapped_sides(&ctx, &reference, "Partitioned", &swapped, &kept).await;
}

/// In `CollectLeft` mode each probe partition swaps sides on its own, where
/// its rows, as many again in every partition, are fewer than half the
/// build side's: it builds a table of its rows and the whole build side
/// streams through it. Only for join types whose probe partitions join
/// independently: a left join, which emits the build side's unmatched rows
/// once for every partition, is joined as planned.
#[tokio::test]
async fn a_probe_partition_smaller_than_a_shared_build_side_builds_the_hash_table() {
    let (ctx, reference) =
        four_partition_sessions(&["SET datafusion.optimizer.join_reordering = false"], &MANY_AND_FEW).await;
    // 2,000 build rows go to DataFusion's operator; the 4,000 the filter may
    // pass keep the join replaced. Each partition has about 15 probe rows.
    run(&ctx, "SET gpu_join.min_build_rows = 3000").await;
    let many = "(SELECT * FROM many WHERE v % 2 = 0) m";
    let swapped = [
        format!("SELECT m.v, few.w FROM {many} JOIN few ON m.k = few.k"),
        format!("SELECT m.v, few.w FROM {many} RIGHT JOIN few ON m.k = few.k"),
        format!("SELECT m.v, few.w FROM {many} JOIN few ON m.k = few.k AND m.v > few.w * 40"),
    ];
    let kept = [format!("SELECT m.v, few.w FROM {many} LEFT JOIN few ON m.k = few.k")];
    let (swapped, kept): (Vec<&str>, Vec<&str>) =
        (swapped.iter().map(String::as_str).collect(), kept.iter().map(String::as_str).collect());
    check_swapped_sides(&ctx, &reference, "CollectLeft", &swapped, &kept).await;
}

/// In `CollectLeft` mode a probe partition of more than 1,024 rows, up to
/// a batch, also swaps sides where the cores can stream the shared build
/// side for every partition at once (no more than two partitions a core):
/// here four probe partitions of 1,500 rows against 20,000 build rows,
/// which allow 2,500 rows a partition.
#[tokio::test]
async fn a_probe_partition_of_up_to_a_batch_swaps_where_the_cores_can_stream_the_build_side() {
    let big = "CREATE TABLE big (k INT, v INT) AS SELECT i % 3000, i FROM generate_series(1, 40000) t(i)";
    let (ctx, reference) = four_partition_sessions(&["SET datafusion.optimizer.join_reordering = false"], &[big]).await;
    let schema =
        Arc::new(Schema::new(vec![Field::new("k", DataType::Int32, false), Field::new("w", DataType::Int32, false)]));
    let partition = |p: i32| {
        let rows = (p * 1500)..((p + 1) * 1500);
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int32Array::from_iter_values(rows.clone().map(|i| (i * 7) % 5000))),
            Arc::new(Int32Array::from_iter_values(rows)),
        ];
        vec![RecordBatch::try_new(Arc::clone(&schema), columns).unwrap()]
    };
    let mid = MemTable::try_new(Arc::clone(&schema), (0..4).map(partition).collect()).unwrap();
    let mid = Arc::new(mid);
    for context in [&ctx, &reference] {
        context.register_table("mid", Arc::clone(&mid) as Arc<dyn TableProvider>).unwrap();
    }
    // 20,000 build rows go to DataFusion's operator; the 40,000 the filter
    // may pass keep the join replaced.
    run(&ctx, "SET gpu_join.min_build_rows = 30000").await;
    let sql = "SELECT m.v, mid.w FROM (SELECT * FROM big WHERE v % 2 = 0) m JOIN mid ON m.k = mid.k";
    let analyzed = explain_analyze(&ctx, sql).await;
    let line = analyzed.lines().find(|l| l.contains("GpuJoinExec")).unwrap_or_else(|| panic!("{analyzed}"));
    assert!(line.contains("mode=CollectLeft") && line.contains("probe_rows=6.00 K"), "{line}");
    // The cores as the join counts them.
    let cores = rayon::current_num_threads();
    let swaps = 4 <= 2 * cores;
    assert_eq!(line.contains("algorithm=DataFusion (sides swapped),"), swaps, "{line}");
    assert_eq!(line.contains("a probe partition of 1500 rows built the hash table"), swaps, "{line}");
    assert_eq!(sorted_rows(&run(&ctx, sql).await), sorted_rows(&run(&reference, sql).await));
}

/// A join whose build side can have fewer rows than `min_build_rows` at
/// most is not replaced where the GPU join would keep DataFusion's shape
/// (here `CollectLeft`): DataFusion's operator would join it as collected
/// anyway. Planned `Partitioned`, it is replaced: its build side goes to
/// DataFusion's operator as one, and the probe side keeps its partitions
/// instead of being hash-repartitioned.
#[tokio::test]
async fn a_build_side_that_cannot_reach_min_build_rows_is_not_replaced() {
    let sql = "SELECT s.k, t.v FROM s JOIN t ON s.k = t.k";
    let tables = [
        "CREATE TABLE s (k INT) AS SELECT i FROM generate_series(1, 100) t(i)",
        "CREATE TABLE t (k INT, v INT) AS SELECT i % 300, i FROM generate_series(1, 5000) t(i)",
    ];
    for (settings, mode) in [(&[][..], PartitionMode::CollectLeft), (&PARTITIONED[..], PartitionMode::Partitioned)] {
        let (ctx, reference) = four_partition_sessions(settings, &tables).await;
        let expected = sorted_rows(&run(&reference, sql).await);
        for min_build_rows in [101, 100] {
            run(&ctx, &format!("SET gpu_join.min_build_rows = {min_build_rows}")).await;
            let decisions = ctx.gpu_join_decisions(sql).await.unwrap();
            let kept = Placement::NotOnGpu(NotOnGpu::BelowMinBuildRows { rows: 100, min_build_rows });
            let replaced = min_build_rows == 100 || mode == PartitionMode::Partitioned;
            assert_eq!(decisions[0].placement != kept, replaced, "{mode:?}, {min_build_rows}: {}", decisions[0]);
            let analyzed = explain_analyze(&ctx, sql).await;
            assert_eq!(analyzed.contains("GpuJoinExec"), replaced, "{analyzed}");
            let left_to_datafusion = min_build_rows > 100;
            assert_eq!(analyzed.contains("algorithm=DataFusion"), replaced && left_to_datafusion, "{analyzed}");
            assert!(!analyzed.contains("RepartitionExec: partitioning=Hash") || !replaced, "{analyzed}");
            assert_eq!(sorted_rows(&run(&ctx, sql).await), expected, "{mode:?}, min_build_rows = {min_build_rows}");
        }
    }
}

/// With no CUDA driver, `auto` leaves plans exactly as DataFusion made them
/// and `cuda` fails with an error that says what to do. On a machine with a
/// usable device, `auto` plans on it instead.
#[tokio::test]
async fn without_a_cuda_driver_auto_keeps_plans_and_cuda_is_an_error() {
    let sql = "SELECT l.s, r.t FROM l JOIN r ON l.k = r.k";
    let mut options = GpuJoinConfig::default();
    options.min_rows = 0;
    options.min_build_rows = 0;
    options.aggregate = true;
    let plain = SessionContext::new_with_state(SessionStateBuilder::new().with_default_features().build());
    let auto = SessionContext::new_with_state(
        SessionStateBuilder::new()
            .with_default_features()
            .with_config(SessionConfig::new().with_option_extension(options.clone()))
            .with_gpu_join()
            .build(),
    );
    for ctx in [&plain, &auto] {
        run(ctx, "CREATE TABLE l (k INT, s VARCHAR) AS VALUES (1, 'a'), (2, 'b')").await;
        run(ctx, "CREATE TABLE r (k INT, t VARCHAR) AS VALUES (2, 'B')").await;
    }
    match cuda_backend(&options) {
        Err(why) => {
            assert_eq!(physical_plan_text(&auto, sql).await, physical_plan_text(&plain, sql).await);
            let decisions = auto.gpu_join_decisions(sql).await.unwrap();
            assert_eq!(decisions[0].placement, Placement::NotOnGpu(NotOnGpu::NoDevice(why)));
            assert_eq!(sorted_rows(&run(&auto, sql).await), ["b|B"]);
            run(&auto, "SET gpu_join.backend = 'cuda'").await;
            // Only a plan with an operator for the device needs one.
            assert_eq!(sorted_rows(&run(&auto, "SELECT s FROM l WHERE k = 2").await), ["b"]);
            for sql in [sql, "SELECT k, count(*) FROM l GROUP BY k"] {
                let error = auto.sql(sql).await.unwrap().collect().await.unwrap_err().to_string();
                assert!(error.contains("gpu_join.backend is 'cuda' but no CUDA device is usable"), "{sql}: {error}");
                assert!(error.contains("Set gpu_join.backend = 'auto'"), "{sql}: {error}");
            }
        }
        Ok(_) => {
            assert_eq!(
                test_options().backend,
                BackendChoice::Cuda,
                "a usable device, yet the suite runs on the CPU backend"
            );
            assert!(physical_plan_text(&auto, sql).await.contains("GpuJoinExec: backend=cuda"));
            assert_eq!(sorted_rows(&run(&auto, sql).await), ["b|B"]);
        }
    }
}

/// The probe side arrives ordered: matches leave in probe order for every
/// join type for which HashJoinExec promises it, across many chunks.
#[tokio::test]
async fn probe_order_is_kept_across_chunks() {
    let schema =
        Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true), Field::new("p", DataType::Int64, false)]));
    let rows = 3000i64;
    let probe_batches: Vec<RecordBatch> = (0..rows)
        .step_by(100)
        .map(|start| {
            let keys: Int64Array = (start..start + 100).map(|i| (i % 11 != 0).then_some(i % 37)).collect();
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![Arc::new(keys), Arc::new(Int64Array::from_iter_values(start..start + 100))],
            )
            .unwrap()
        })
        .collect();
    let build = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Int64Array::from_iter_values((0..30).map(|i| i % 20))),
            Arc::new(Int64Array::from_iter_values(0..30)),
        ],
    )
    .unwrap();
    for join_type in [JoinType::Inner, JoinType::Right, JoinType::RightSemi, JoinType::RightAnti, JoinType::RightMark] {
        let ordering = LexOrdering::new(vec![PhysicalSortExpr::new_default(Arc::new(Column::new("p", 1)))]).unwrap();
        let probe = MemorySourceConfig::try_new(std::slice::from_ref(&probe_batches), Arc::clone(&schema), None)
            .unwrap()
            .try_with_sort_information(vec![ordering])
            .unwrap();
        let probe = datafusion::datasource::source::DataSourceExec::from_data_source(probe);
        let build = MemorySourceConfig::try_new_exec(&[vec![build.clone()]], Arc::clone(&schema), None).unwrap();
        let join = collect_left_join_on_k(build, probe, join_type);
        let mut options = test_options();
        options.probe_chunk_rows = 250;
        let gpu = GpuJoinExec::try_new(&join, test_backend(), &options, ReplacedOperator::HashJoin).unwrap();
        assert!(gpu.preserves_probe_order(), "{join_type:?}");
        let config = SessionConfig::new().with_batch_size(77).with_option_extension(options);
        let batches = collect(Arc::new(gpu), SessionContext::new_with_config(config).task_ctx()).await.unwrap();
        let p_index = batches[0].schema().fields().iter().rposition(|f| f.name() == "p").unwrap();
        let probe_rows: Vec<i64> = batches
            .iter()
            .flat_map(|b| {
                b.column(p_index).as_any().downcast_ref::<Int64Array>().unwrap().iter().flatten().collect::<Vec<_>>()
            })
            .collect();
        assert!(probe_rows.windows(2).all(|w| w[0] <= w[1]), "{join_type:?}: probe order lost");
        assert!(total_rows(&batches) > 0, "{join_type:?}");
    }
}

/// A sort-merge join whose order the query relies on (its ORDER BY is
/// satisfied by the join, the sort above it removed) is replaced by a GPU
/// join that sorts on the device: the sorts below it go, the plan keeps no
/// sort above it, and every row leaves in the order DataFusion's gives,
/// including the mirror image of a Right join and rows padded with NULLs.
#[tokio::test]
async fn sort_merge_join_order_is_kept_without_its_sorts() {
    let config = SessionConfig::new().with_target_partitions(3).with_batch_size(7);
    let ctx = context_with_tables(config.clone()).await;
    let reference = datafusion_context(config);
    for context in [&ctx, &reference] {
        for sql in [
            "SET datafusion.optimizer.prefer_hash_join = false",
            "SET datafusion.optimizer.join_reordering = false",
            "CREATE TABLE a (k BIGINT, x BIGINT) AS SELECT CASE WHEN i % 13 = 0 THEN NULL ELSE i % 97 END, i \
             FROM generate_series(1, 3000) t(i)",
            "CREATE TABLE b (k BIGINT, y BIGINT) AS SELECT CASE WHEN i % 17 = 0 THEN NULL ELSE (i * 7) % 131 END, i \
             FROM generate_series(1, 2000) t(i)",
        ] {
            run(context, sql).await;
        }
    }
    for (sql, join_type) in [
        ("SELECT a.k, a.x, b.y FROM a JOIN b ON a.k = b.k ORDER BY a.k NULLS FIRST", "Inner"),
        ("SELECT a.k, a.x, b.y FROM a LEFT JOIN b ON a.k = b.k ORDER BY a.k NULLS FIRST", "Left"),
        ("SELECT a.x, b.k, b.y FROM a RIGHT JOIN b ON a.k = b.k ORDER BY b.k NULLS FIRST", "Left"),
        ("SELECT a.k, a.x FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k = a.k) ORDER BY a.k NULLS FIRST", "LeftSemi"),
        // An aggregate that streams over groups in key order.
        ("SELECT a.k, sum(b.y) AS total FROM a JOIN b ON a.k = b.k GROUP BY a.k", "Inner"),
        // The query's own sort stays above the join; none below it.
        ("SELECT a.k, a.x FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k) ORDER BY a.k DESC", "LeftAnti"),
    ] {
        let plan = physical_plan_text(&ctx, sql).await;
        let at = plan.find("GpuJoinExec").unwrap_or_else(|| panic!("{sql}\n{plan}"));
        let line = plan[at..].lines().next().unwrap_or_default();
        assert!(
            line.contains("output_ordering=[") && line.contains(&format!("join_type={join_type}")),
            "{sql}\n{plan}"
        );
        assert!(!plan[at..].contains("SortExec"), "{sql}: a sort is left below the join\n{plan}");
        assert!(!sql.contains("NULLS FIRST") || !plan.contains("SortExec"), "{sql}: a sort is left in\n{plan}");
        let keys = |batches: &[RecordBatch], column: &str| -> Vec<Option<i64>> {
            let index = batches[0].schema().index_of(column).unwrap();
            batches
                .iter()
                .flat_map(|b| b.column(index).as_any().downcast_ref::<Int64Array>().unwrap().iter().collect::<Vec<_>>())
                .collect()
        };
        let (actual, expected) = (run(&ctx, sql).await, run(&reference, sql).await);
        if sql.contains("ORDER BY") {
            assert_eq!(keys(&actual, "k"), keys(&expected, "k"), "{sql}: keys out of DataFusion's order");
        }
        assert_eq!(sorted_rows(&actual), sorted_rows(&expected), "{sql}");
    }
}

/// Strings carried through a chain of joins (TPC-H Q21's supplier names)
/// come out of every GPU join with as few data buffers as they went in:
/// each join's output batches share their source's buffers, and the join
/// above must not repeat them once per batch when it concatenates them.
/// Joins left to DataFusion's operator (build sides below
/// `min_build_rows`) hand it their build side as one batch that keeps each
/// buffer once, read whole (not cut into slices of `batch_size`, which the
/// operator would concatenate with every buffer once per slice), where
/// DataFusion's own plan repeats them once per batch of each join's build
/// side: their output holds a few buffers of the operator's own.
/// One collected into a single build side instead of DataFusion's
/// `Partitioned` plan compacts them: each output batch holds only the
/// bytes of its own strings.
#[tokio::test]
async fn string_views_carried_through_joined_joins_stay_compact() {
    let config = SessionConfig::new().with_target_partitions(2).with_batch_size(64);
    let (gpu, cpu) = (gpu_context(config.clone()), datafusion_context(config));
    for ctx in [&gpu, &cpu] {
        for sql in [
            "CREATE TABLE supplier AS SELECT i AS sk, arrow_cast(concat('Supplier#', lpad(CAST(i AS VARCHAR), 12, '0')), 'Utf8View') AS name FROM generate_series(1, 300) t(i)",
            "CREATE TABLE item AS SELECT i AS ik, i % 300 + 1 AS sk FROM generate_series(1, 6000) t(i)",
            "CREATE TABLE orders AS SELECT i AS ik, i % 3 AS flag FROM generate_series(1, 6000) t(i)",
        ] {
            run(ctx, sql).await;
        }
    }
    let query = "SELECT s.name, o.flag, i2.sk FROM supplier s JOIN item i ON s.sk = i.sk \
                 JOIN orders o ON i.ik = o.ik JOIN item i2 ON i2.ik = o.ik WHERE o.flag <> 1";
    let plan = physical_plan_text(&gpu, query).await;
    assert_eq!(plan.matches("GpuJoinExec").count(), 3, "{plan}");
    let buffers = |batches: &[RecordBatch]| -> usize {
        batches.iter().map(|b| b.column(0).as_string_view().data_buffers().len()).max().unwrap_or(0)
    };
    let names = buffers(&run(&cpu, "SELECT name FROM supplier").await);
    let expected = run(&cpu, query).await;
    // At 2^20 the supplier join (300 build rows at most) is not replaced,
    // and the two above are left to DataFusion's operator as collected.
    for (min_build_rows, gpu_joins, on_datafusion) in [(0, 3, 0), (1 << 20, 2, 2)] {
        run(&gpu, &format!("SET gpu_join.min_build_rows = {min_build_rows}")).await;
        let analyzed = explain_analyze(&gpu, query).await;
        assert_eq!(analyzed.matches("GpuJoinExec").count(), gpu_joins, "{analyzed}");
        assert_eq!(analyzed.matches("algorithm=DataFusion").count(), on_datafusion, "{analyzed}");
        let batches = run(&gpu, query).await;
        assert_eq!(sorted_rows(&batches), sorted_rows(&expected), "min_build_rows = {min_build_rows}");
        // DataFusion's plan itself repeats them: 43,711 buffers in one
        // batch. Its operator, given each build side as one batch with
        // every buffer once, coalesces its output into buffers of its own
        // (6 in one batch); given that batch cut into slices of
        // `batch_size`, it held 378.
        let most = buffers(&batches);
        let bound = match on_datafusion {
            0 => names,
            _ => 16,
        };
        assert!(most <= bound, "{most} data buffers in one output batch; the names came in {names}");
        assert!(10 * most < buffers(&expected), "{most} buffers, DataFusion's plan {}", buffers(&expected));
    }
    let query = "SELECT s.name, i.ik FROM supplier s JOIN item i ON s.sk = i.sk";
    for sql in &PARTITIONED[..2] {
        run(&gpu, sql).await;
    }
    let analyzed = explain_analyze(&gpu, query).await;
    assert!(analyzed.contains("algorithm=DataFusion, mode=CollectLeft"), "{analyzed}");
    assert!(!analyzed.contains("RepartitionExec"), "{analyzed}");
    let batches = run(&gpu, query).await;
    assert_eq!(total_rows(&batches), 6000);
    for batch in &batches {
        let column = batch.column(0).as_string_view();
        let held: usize = column.data_buffers().iter().map(|b| b.len()).sum();
        assert!(held <= 2 * column.total_buffer_bytes_used(), "{held} bytes held for {} rows", batch.num_rows());
    }
}

async fn explain_analyze(ctx: &SessionContext, query: &str) -> String {
    arrow::util::pretty::pretty_format_batches(&run(ctx, &format!("EXPLAIN ANALYZE {query}")).await)
        .unwrap()
        .to_string()
}

/// A join that DataFusion's operator joins for the GPU join (its build side
/// below `min_build_rows`), in the shape DataFusion planned it, hands that
/// operator's batches on as they come: the batches DataFusion's plan gives,
/// their string views still over the build side's buffers. Compacting
/// them, as a join in another shape does, copies every string the join
/// outputs, which DataFusion's plan does not.
#[tokio::test]
async fn a_join_as_planned_hands_datafusions_batches_on_as_they_come() {
    let key = Field::new("k", DataType::Int64, false);
    let build_schema = Arc::new(Schema::new(vec![key.clone(), Field::new("name", DataType::Utf8View, false)]));
    let names: StringViewArray =
        (0..1000).map(|i| Some(format!("a name too long to be inlined, number {i}"))).collect();
    let name_buffers: BTreeSet<usize> = names.data_buffers().iter().map(|b| b.as_ptr() as usize).collect();
    let build = RecordBatch::try_new(
        Arc::clone(&build_schema),
        vec![Arc::new(Int64Array::from_iter_values(0..1000)), Arc::new(names)],
    )
    .unwrap();
    let probe_schema = Arc::new(Schema::new(vec![key]));
    let probe: Vec<RecordBatch> = (0..10)
        .map(|b| {
            let keys = Int64Array::from_iter_values((0..100).map(|i| (b * 100 + i) * 7 % 1000));
            RecordBatch::try_new(Arc::clone(&probe_schema), vec![Arc::new(keys)]).unwrap()
        })
        .collect();
    let build = MemorySourceConfig::try_new_exec(&[vec![build]], build_schema, None).unwrap();
    let probe = MemorySourceConfig::try_new_exec(&[probe], probe_schema, None).unwrap();
    let reference = collect_left_join_on_k(build, probe, JoinType::Inner);
    let mut options = test_options();
    options.min_build_rows = 1 << 20;
    let gpu = Arc::new(GpuJoinExec::try_new(&reference, test_backend(), &options, ReplacedOperator::HashJoin).unwrap());
    let config = SessionConfig::new().with_batch_size(64).with_option_extension(options);
    let task = SessionContext::new_with_config(config).task_ctx();
    let batches = collect(Arc::clone(&gpu) as Arc<dyn ExecutionPlan>, Arc::clone(&task)).await.unwrap();
    let expected = collect(Arc::new(reference), task).await.unwrap();
    assert!(gpu.strategy_text().0.contains("DataFusion"), "{:?}", gpu.strategy_text());
    assert_eq!(batches, expected);
    assert_eq!(total_rows(&batches), 1000);
    for batch in &batches {
        let column = batch.column(1).as_string_view();
        let held: BTreeSet<usize> = column.data_buffers().iter().map(|b| b.as_ptr() as usize).collect();
        assert!(held.is_subset(&name_buffers), "{} rows in buffers of their own", batch.num_rows());
    }
    assert_eq!(gpu.metrics().and_then(|m| m.output_rows()), Some(1000));
}

/// The sides of the probe placement tests: a key, each row's number within
/// its batch, and a name, a column the device does not hold.
fn numbered_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("p", DataType::Int64, false),
        Field::new("s", DataType::Utf8, false),
    ]))
}

/// A batch of [`numbered_schema`] with `keys`.
fn numbered_batch(keys: Vec<Option<i64>>) -> RecordBatch {
    let rows = keys.len() as i64;
    let names: StringArray = (0..rows).map(|i| Some(format!("row {i}"))).collect();
    RecordBatch::try_new(
        numbered_schema(),
        vec![Arc::new(Int64Array::from(keys)), Arc::new(Int64Array::from_iter_values(0..rows)), Arc::new(names)],
    )
    .unwrap()
}

/// Joins `build` with `probe` (one partition each, `CollectLeft`, inner)
/// by the GPU join with `options` and by DataFusion's operator, at
/// `batch_size`: the GPU join (for its metrics), its output and DataFusion's.
async fn joined_both_ways(
    build: &RecordBatch,
    probe: &[RecordBatch],
    options: GpuJoinConfig,
    batch_size: usize,
) -> (Arc<GpuJoinExec>, Vec<RecordBatch>, Vec<RecordBatch>) {
    let schema = numbered_schema();
    let build = MemorySourceConfig::try_new_exec(&[vec![build.clone()]], Arc::clone(&schema), None).unwrap();
    let probe = MemorySourceConfig::try_new_exec(&[probe.to_vec()], schema, None).unwrap();
    let reference = collect_left_join_on_k(build, probe, JoinType::Inner);
    let gpu = Arc::new(GpuJoinExec::try_new(&reference, test_backend(), &options, ReplacedOperator::HashJoin).unwrap());
    let config = SessionConfig::new().with_batch_size(batch_size).with_option_extension(options);
    let task = SessionContext::new_with_config(config).task_ctx();
    let batches = collect(Arc::clone(&gpu) as Arc<dyn ExecutionPlan>, Arc::clone(&task)).await.unwrap();
    let expected = collect(Arc::new(reference), task).await.unwrap();
    (gpu, batches, expected)
}

fn metric(gpu: &GpuJoinExec, name: &str) -> usize {
    gpu.metrics().unwrap().sum_by_name(name).map_or(0, |m| m.as_usize())
}

/// A probe chunk's output columns are uploaded when the chunk has enough
/// output rows per probe row: decided after matching for the first chunks,
/// and before loading once the join has measured enough. A join of which
/// few probe rows match takes them on the host for every chunk, one of
/// which all match uploads them, a ratio of 0 always uploads them and an
/// infinite one never does. Every way gives DataFusion's rows.
#[tokio::test]
async fn probe_columns_are_uploaded_only_where_enough_rows_match() {
    let (chunk_rows, chunks) = (50i64, 40usize);
    let probe_keys: Vec<Option<i64>> = (0..chunk_rows * chunks as i64).map(|i| (i % 13 != 0).then_some(i)).collect();
    let probe: Vec<RecordBatch> = probe_keys.chunks(70).map(|keys| numbered_batch(keys.to_vec())).collect();
    // Three build keys match one probe row each; keys % 20 match every
    // probe row whose key is not NULL.
    let few = numbered_batch(vec![Some(1), Some(500), Some(1999), Some(-4)]);
    let all = numbered_batch((0..20).map(Some).collect());
    let all_probe: Vec<RecordBatch> =
        probe_keys.chunks(70).map(|keys| numbered_batch(keys.iter().map(|k| k.map(|k| k % 20)).collect())).collect();
    for (name, build, probe, ratio, on_host) in [
        ("few match", &few, &probe, 0.25, chunks),
        ("few match, always uploaded", &few, &probe, 0.0, 0),
        ("all match", &all, &all_probe, 0.25, 0),
        ("all match, always uploaded", &all, &all_probe, 0.0, 0),
        ("all match, never uploaded", &all, &all_probe, f64::INFINITY, chunks),
    ] {
        let mut options = test_options();
        (options.probe_chunk_rows, options.probe_device_gather_ratio) = (chunk_rows as usize, ratio);
        let (gpu, batches, expected) = joined_both_ways(build, probe, options, 64).await;
        assert_eq!(sorted_rows(&batches), sorted_rows(&expected), "{name}");
        assert!(total_rows(&batches) > 0, "{name}");
        let taken = metric(&gpu, "probe_chunks_on_host");
        assert_eq!(taken, on_host, "{name}: chunks whose columns were taken on the host, of {chunks}");
    }
}

/// Chunks too large to keep probe order by default, some of whose probe
/// columns are taken on the host: under `auto` their pairs are put in probe
/// row order first, so the host reads each probe batch front to back, also
/// where only the string column is taken there (the others uploaded, as one
/// chunk whose output rows pay for it); under `required` their order is not
/// promised. Every way gives DataFusion's rows.
#[tokio::test]
async fn probe_columns_taken_on_the_host_are_read_in_probe_order() {
    let rows = 200_000i64;
    // Some probe rows match no build row, one key matches two build rows.
    let probe_keys: Vec<Option<i64>> = (0..rows).map(|i| Some((i * 7919) % 5000)).collect();
    let probe = numbered_batch(probe_keys);
    let probe: Vec<RecordBatch> =
        (0..rows as usize).step_by(8192).map(|at| probe.slice(at, 8192.min(rows as usize - at))).collect();
    let mut build_keys: Vec<Option<i64>> = (0..3000).map(|k| Some((k * 37) % 3000)).collect();
    build_keys.push(Some(7));
    let build = numbered_batch(build_keys);
    for (order, chunk_rows, ratio, kept) in [
        (ProbeOrderChoice::Auto, 100_000, f64::INFINITY, true),
        (ProbeOrderChoice::Required, 100_000, f64::INFINITY, false),
        (ProbeOrderChoice::Auto, rows as usize, 0.01, true),
    ] {
        let mut options = test_options();
        (options.probe_chunk_rows, options.probe_device_gather_ratio) = (chunk_rows, ratio);
        options.keep_probe_order = order;
        let (gpu, batches, expected) = joined_both_ways(&build, &probe, options, 8192).await;
        let case = format!("{order:?}, ratio {ratio}");
        assert_eq!(sorted_rows(&batches), sorted_rows(&expected), "{case}");
        let chunks_on_host = metric(&gpu, "probe_chunks_on_host");
        match ratio.is_finite() {
            true => assert_eq!(chunks_on_host, 0, "{case}: fixed-width probe columns uploaded"),
            false => assert!(chunks_on_host >= 2, "{case}: probe columns taken on the host"),
        }
        if kept {
            let probe_rows: Vec<i64> =
                batches.iter().flat_map(|b| b.column(4).as_primitive::<Int64Type>().values().to_vec()).collect();
            assert!(probe_rows.len() > rows as usize / 2, "{} output rows", probe_rows.len());
            assert!(probe_rows.is_sorted(), "{case}: output rows in probe row order");
        }
    }
}

/// A probe chunk each of whose rows matches exactly one build row (a
/// foreign-key join) hands its own probe columns on, in probe order, and
/// moves none of them; a chunk in which a row matches twice is joined as
/// before. Every way gives DataFusion's rows.
#[tokio::test]
async fn probe_rows_matched_once_pass_through_in_probe_order() {
    let (chunk_rows, chunks, batch_size) = (50usize, 40usize, 64usize);
    let rows = (chunk_rows * chunks) as i64;
    // Shuffled build keys; the probe side's keys each match one of them.
    let mut build_keys: Vec<Option<i64>> = (0..rows).map(|i| Some((i * 7919) % rows)).collect();
    let probe_keys: Vec<Option<i64>> = (0..rows).map(|i| Some((i * 31) % rows)).collect();
    let once = numbered_batch(build_keys.clone());
    // The probe row of key 1999 * 31 % 2000 (the last chunk's) matches twice.
    build_keys.push(Some((rows - 1) * 31 % rows));
    let twice = numbered_batch(build_keys);
    for (name, build, probe_batch_rows, ratio, passed) in [
        ("every row once", &once, 70, 0.25, chunks),
        ("every row once, small probe batches", &once, 10, 0.25, chunks),
        ("every row once, always uploaded", &once, 70, 0.0, 0),
        ("a row of the last chunk twice", &twice, 70, 0.25, chunks - 1),
    ] {
        let probe: Vec<RecordBatch> =
            probe_keys.chunks(probe_batch_rows).map(|keys| numbered_batch(keys.to_vec())).collect();
        let mut options = test_options();
        (options.probe_chunk_rows, options.probe_device_gather_ratio) = (chunk_rows, ratio);
        let (gpu, batches, expected) = joined_both_ways(build, &probe, options, batch_size).await;
        assert_eq!(sorted_rows(&batches), sorted_rows(&expected), "{name}");
        let passed_through = metric(&gpu, "probe_chunks_passed_through");
        assert_eq!(passed_through, passed, "{name}: chunks passed through, of {chunks}");
        if passed == chunks {
            // The probe side's row numbers (its `p`), in the probe side's order.
            let probe_rows: Vec<i64> =
                batches.iter().flat_map(|b| b.column(4).as_primitive::<Int64Type>().values().to_vec()).collect();
            let in_order: Vec<i64> = (0..rows).map(|i| i % probe_batch_rows as i64).collect();
            assert_eq!(probe_rows, in_order, "{name}: output in probe order");
            // Small probe batches are joined up to half a batch or more,
            // except for each chunk's last.
            let small = batches.iter().filter(|b| b.num_rows() < batch_size / 2).count();
            assert!(small <= chunks, "{name}: {small} output batches of fewer than {} rows", batch_size / 2);
        }
    }
}

/// A partition stream of fixed batches. A waiting build side waits until
/// some probe partition has handed out a batch, and fails after a few
/// seconds without one; the probe side's reports its first batch.
#[derive(Debug)]
struct RacingSide {
    schema: Arc<Schema>,
    batches: Vec<RecordBatch>,
    probe_read: Arc<AtomicBool>,
    waits_for_probe: bool,
}

impl PartitionStream for RacingSide {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn execute(&self, _context: Arc<TaskContext>) -> SendableRecordBatchStream {
        let (batches, probe_read) = (self.batches.clone(), Arc::clone(&self.probe_read));
        let stream: BoxStream<'static, datafusion::error::Result<RecordBatch>> = match self.waits_for_probe {
            true => futures::stream::once(async move {
                waited_for(&probe_read, "the probe input was not read while the build side was collected").await?;
                Ok::<_, DataFusionError>(futures::stream::iter(batches.into_iter().map(Ok)))
            })
            .try_flatten()
            .boxed(),
            false => futures::stream::iter(batches.into_iter().map(Ok))
                .inspect(move |_| probe_read.store(true, Ordering::Release))
                .boxed(),
        };
        Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), stream))
    }
}

/// Ok once `flag` is set; the error `failure` if it is not within a few
/// seconds.
async fn waited_for(flag: &AtomicBool, failure: &str) -> datafusion::error::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !flag.load(Ordering::Acquire) {
        if Instant::now() > deadline {
            return Err(DataFusionError::Execution(failure.into()));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// A probe partition that gives its first batch, then waits until
/// `released` before giving the rest, and fails after a few seconds.
#[derive(Debug)]
struct StallingProbe {
    schema: Arc<Schema>,
    first: RecordBatch,
    rest: RecordBatch,
    released: Arc<AtomicBool>,
}

impl PartitionStream for StallingProbe {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn execute(&self, _context: Arc<TaskContext>) -> SendableRecordBatchStream {
        let (rest, released) = (self.rest.clone(), Arc::clone(&self.released));
        let rest = futures::stream::once(async move {
            waited_for(&released, "the join held the output of a chunk until its probe input went on").await?;
            Ok(rest)
        });
        let stream = futures::stream::once(futures::future::ready(Ok(self.first.clone()))).chain(rest);
        Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), stream))
    }
}

/// Registers `b` (build, one partition of 300 rows) and `p` (probe, two
/// partitions of 400 rows, each stalling after 200 until `released`), both
/// `(k, v)` over the keys 0 to 299.
fn register_stalling_tables(ctx: &SessionContext, released: &Arc<AtomicBool>) {
    let schema =
        Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true), Field::new("v", DataType::Int64, false)]));
    let batch = |ids: std::ops::Range<i64>| {
        let k: Int64Array = ids.clone().map(|i| Some(i * 7 % 300)).collect();
        RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(k), Arc::new(Int64Array::from_iter_values(ids))])
            .unwrap()
    };
    let build = MemTable::try_new(Arc::clone(&schema), vec![vec![batch(0..300)]]).unwrap();
    let probe = (0..2)
        .map(|part| {
            let start = part * 400;
            let side = StallingProbe {
                schema: Arc::clone(&schema),
                first: batch(start..start + 200),
                rest: batch(start + 200..start + 400),
                released: Arc::clone(released),
            };
            Arc::new(side) as Arc<dyn PartitionStream>
        })
        .collect();
    let probe = StreamingTable::try_new(Arc::clone(&schema), probe).unwrap();
    for (name, table) in [("b", Arc::new(build) as Arc<dyn TableProvider>), ("p", Arc::new(probe))] {
        ctx.deregister_table(name).unwrap();
        ctx.register_table(name, table).unwrap();
    }
}

/// A probe input that stalls does not hold back the output of the chunks
/// it filled: the join hands it on while it waits for the next chunk,
/// rather than once that chunk is joined. Here each probe partition gives
/// one chunk's rows and then waits for the query's first output before
/// giving the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn output_of_a_stalled_probe_input_leaves_while_it_waits() {
    let sql = "SELECT b.k, b.v, p.v FROM b JOIN p ON b.k = p.k";
    let config = || SessionConfig::new().with_target_partitions(2);
    let reference = datafusion_context(config());
    register_stalling_tables(&reference, &Arc::new(AtomicBool::new(true)));
    let expected = sorted_rows(&run(&reference, sql).await);
    assert_eq!(expected.len(), 800);
    let ctx = gpu_context(config());
    run(&ctx, "SET gpu_join.probe_chunk_rows = 200").await;
    let output_seen = Arc::new(AtomicBool::new(false));
    register_stalling_tables(&ctx, &output_seen);
    let plan = physical_plan_text(&ctx, sql).await;
    assert!(plan.contains("GpuJoinExec"), "{plan}");
    let mut output = ctx.sql(sql).await.unwrap().execute_stream().await.unwrap();
    let mut batches = vec![];
    while let Some(batch) = output.next().await {
        batches.push(batch.unwrap_or_else(|e| panic!("{e}")));
        output_seen.store(true, Ordering::Release);
    }
    assert_eq!(sorted_rows(&batches), expected);
}

/// Registers `b` (build, 2 partitions) and `p` (probe, 3 partitions), each
/// a `(k, v)` table of `rows` rows over `keys` keys; `b` waits for `p` to be
/// read when `build_waits`.
fn register_racing_tables(ctx: &SessionContext, build_waits: bool) {
    let schema =
        Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true), Field::new("v", DataType::Int64, false)]));
    let probe_read = Arc::new(AtomicBool::new(false));
    for (name, partitions, rows, keys, waits_for_probe) in
        [("b", 2, 3000, 1000, build_waits), ("p", 3, 9000, 4000, false)]
    {
        let sides = (0..partitions)
            .map(|part| {
                let batches = (0..3)
                    .map(|piece| {
                        let ids = (0..rows / partitions / 3).map(|i| (i * partitions * 3 + part * 3 + piece) as i64);
                        let k: Int64Array = ids.clone().map(|i| (i % 7 != 0).then_some(i * 31 % keys)).collect();
                        let v: Int64Array = ids.collect();
                        RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(k), Arc::new(v)]).unwrap()
                    })
                    .collect();
                let side = RacingSide {
                    schema: Arc::clone(&schema),
                    batches,
                    probe_read: Arc::clone(&probe_read),
                    waits_for_probe,
                };
                Arc::new(side) as Arc<dyn PartitionStream>
            })
            .collect();
        let table = StreamingTable::try_new(Arc::clone(&schema), sides).unwrap();
        ctx.deregister_table(name).unwrap();
        ctx.register_table(name, Arc::new(table)).unwrap();
    }
}

/// A partition reads its probe input while the build side is collected, as
/// long as fewer than `min_build_rows` build rows are in, whether the device
/// or DataFusion's operator then joins it: here the build input waits for
/// the probe input before giving any row, and a GPU join that read the two
/// one after the other would fail. (DataFusion's own
/// plan would: its hash repartitions start their inputs one after the
/// other, so the reference runs over a build side that does not wait.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_probe_input_is_read_while_the_build_side_is_collected() {
    let sql = "SELECT b.k, b.v, p.v FROM b JOIN p ON b.k = p.k";
    let reference = datafusion_context(SessionConfig::new().with_target_partitions(4));
    register_racing_tables(&reference, false);
    let expected = sorted_rows(&run(&reference, sql).await);
    assert!(expected.len() > 3000, "{} rows", expected.len());
    // The build side has 3000 rows: at 3000 the device joins it.
    for (min_build_rows, on_datafusion) in [(3000, false), (1 << 20, true)] {
        let ctx = gpu_context(SessionConfig::new().with_target_partitions(4));
        run(&ctx, "SET gpu_join.probe_read_ahead_rows = 1000").await;
        run(&ctx, &format!("SET gpu_join.min_build_rows = {min_build_rows}")).await;
        register_racing_tables(&ctx, true);
        let plan = physical_plan_text(&ctx, sql).await;
        assert!(plan.contains("GpuJoinExec") && plan.contains("mode=CollectLeft"), "{plan}");
        assert_eq!(sorted_rows(&run(&ctx, sql).await), expected, "min_build_rows = {min_build_rows}");
        register_racing_tables(&ctx, true);
        let analyzed = explain_analyze(&ctx, sql).await;
        assert_eq!(analyzed.contains("algorithm=DataFusion"), on_datafusion, "{analyzed}");
    }
}
