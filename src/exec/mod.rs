//! `GpuJoinExec`: the operator that replaces DataFusion's hash and sort-merge
//! joins.
//!
//! It keeps an equivalent `HashJoinExec` (its "twin") over the same children.
//! The twin defines what the operator promises to the rest of the plan
//! (schema, partitioning, equivalences, distribution requirements,
//! statistics), so those promises are exactly DataFusion's.

mod aggregate;
mod aggregate_chunks;
mod build;
mod chosen;
mod chunk_jobs;
mod device_build;
mod device_join;
mod display;
mod fallback;
mod filtered_from_above;
mod filters_from_above;
mod handoff;
mod in_key_order;
mod inputs;
mod key_order;
mod key_set;
mod metrics;
mod out_of_memory;
mod output;
mod partition;
mod passes;
mod probe_filter;
mod probe_stages;
mod probing;
mod read_ahead;
mod runner;
mod runtime;
mod smaller_side;
mod spread;
mod staging;
mod twin;

use std::any::Any;
use std::sync::{Arc, OnceLock};

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{JoinType, NullEquality, internal_err};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::DynamicFilterPhysicalExpr;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::filter_pushdown::{
    ChildPushdownResult, FilterDescription, FilterPushdownPhase, FilterPushdownPropagation,
};
use datafusion::physical_plan::joins::utils::{JoinFilter, JoinOn, build_join_schema};
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::statistics::{ChildStats, StatisticsArgs};
use datafusion::physical_plan::{
    ExecutionPlan, ExecutionPlanProperties, InputDistributionRequirements, PlanProperties, SendableRecordBatchStream,
    Statistics, apply_expression_roots,
};

use crate::algorithms::choice::{self, PlanStatistics, PlannedSizes, planned_sizes};
use crate::algorithms::{JoinDefinition, KeyOrder, PairFilter};
use crate::backend::{BackendHandle, Devices};
use crate::config::GpuJoinConfig;
use crate::testing::JoinLimits;
pub use aggregate::GpuAggregateExec;
pub use filtered_from_above::FilteredFromAboveExec;
use filters_from_above::FiltersFromAbove;
use inputs::{InputReductions, PartitionInputs};
use key_order::OrderedOutput;
pub(crate) use key_order::SortMergeOrder;
use metrics::GpuJoinMetrics;
use probe_filter::ProbeFilter;
use runner::{JoinRunner, runner_for};
use twin::{build_sides, probe_keys, probe_order_required};

/// The DataFusion operator a `GpuJoinExec` took the place of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplacedOperator {
    HashJoin,
    SortMergeJoin,
}

impl ReplacedOperator {
    pub fn name(&self) -> &'static str {
        match self {
            ReplacedOperator::HashJoin => "HashJoinExec",
            ReplacedOperator::SortMergeJoin => "SortMergeJoinExec",
        }
    }
}

/// An equi-join executed by a GPU join backend.
#[derive(Debug)]
pub struct GpuJoinExec {
    twin: Arc<HashJoinExec>,
    definition: Arc<JoinDefinition>,
    /// The devices its partitions spread over ([`spread`]).
    devices: Devices,
    replaces: ReplacedOperator,
    runner: Arc<dyn JoinRunner>,
    metrics: ExecutionPlanMetricsSet,
    chosen: Arc<chosen::ChosenStrategies>,
    /// Set when the output leaves in a replaced sort-merge join's order.
    ordered: Option<OrderedOutput>,
    /// The dynamic filter planted in the probe side's scan, if any.
    probe_filter: Option<Arc<ProbeFilter>>,
    /// The dynamic filters of joins above that pass through this one.
    from_above: FiltersFromAbove,
    /// What each input's rows go through, resolved by the first partition
    /// to run and shared by all, which then wait for one predicate each.
    reductions: OnceLock<InputReductions>,
    /// The join is the hash join DataFusion planned, its mode and inputs
    /// unchanged; see [`GpuJoinExec::reshaped`].
    as_planned: bool,
}

impl GpuJoinExec {
    /// A GPU join computing exactly what `join` computes.
    pub fn try_new(
        join: &HashJoinExec,
        devices: impl Into<Devices>,
        options: &GpuJoinConfig,
        replaces: ReplacedOperator,
    ) -> Result<Self> {
        Self::try_new_ordered(join, devices.into(), options, replaces, None, &PlanStatistics::default())
    }

    /// A GPU join computing what `join` computes, in the order of the
    /// sort-merge join it replaces when `order` is given; its inputs' sizes
    /// read from `statistics`.
    pub(crate) fn try_new_ordered(
        join: &HashJoinExec,
        devices: Devices,
        options: &GpuJoinConfig,
        replaces: ReplacedOperator,
        order: Option<SortMergeOrder>,
        statistics: &PlanStatistics,
    ) -> Result<Self> {
        if *join.partition_mode() == PartitionMode::Auto {
            return internal_err!("GpuJoinExec needs a join whose partition mode is decided");
        }
        let twin = Arc::new(join.builder().reset_state().build()?);
        let ordered = order.map(|order| order.output(&twin)).transpose()?;
        let key_order = ordered.as_ref().map(|o| o.key_order.clone());
        let planned = planned_sizes(statistics, twin.right(), &probe_keys(&twin), build_sides(&twin));
        let definition = Arc::new(Self::definition(&twin, options, key_order, planned)?);
        Self::assemble(twin, definition, devices, replaces, ordered, None, FiltersFromAbove::default())
    }

    /// Marks the join as run in another shape than DataFusion planned (its
    /// mode changed, repartitions gone). Where DataFusion's operator joins
    /// a build side for it, its output batches are then compacted before
    /// they leave: they share the build side's string buffers, which in
    /// DataFusion's plan a repartition above would have copied apart, and
    /// a join above that collects them would hold each buffer once per
    /// batch. A join as planned hands them on as they come, as DataFusion's
    /// plan would.
    pub(crate) fn reshaped(mut self) -> Self {
        self.as_planned = false;
        self
    }

    fn assemble(
        twin: Arc<HashJoinExec>,
        definition: Arc<JoinDefinition>,
        devices: Devices,
        replaces: ReplacedOperator,
        ordered: Option<OrderedOutput>,
        dynamic_filter: Option<Arc<DynamicFilterPhysicalExpr>>,
        from_above: FiltersFromAbove,
    ) -> Result<Self> {
        // A fresh one per plan node, as the runner: its build sides report anew.
        let probe_filter = dynamic_filter.map(|filter| ProbeFilter::new(filter, &twin).map(Arc::new)).transpose()?;
        let chosen = Arc::default();
        let runner = runner_for(
            &devices,
            Arc::clone(&definition),
            Arc::clone(&twin),
            twin.right().output_partitioning().partition_count(),
            Arc::clone(&chosen),
        );
        let metrics = ExecutionPlanMetricsSet::new();
        Ok(Self {
            twin,
            definition,
            devices,
            replaces,
            runner,
            metrics,
            chosen,
            ordered,
            probe_filter,
            from_above,
            reductions: OnceLock::new(),
            as_planned: replaces == ReplacedOperator::HashJoin,
        })
    }

    fn definition(
        twin: &HashJoinExec,
        options: &GpuJoinConfig,
        key_order: Option<KeyOrder>,
        planned: PlannedSizes,
    ) -> Result<JoinDefinition> {
        let (_, column_indices) = build_join_schema(&twin.left().schema(), &twin.right().schema(), twin.join_type());
        let column_indices = match &twin.projection {
            Some(projection) => projection.iter().map(|&i| column_indices[i].clone()).collect(),
            None => column_indices,
        };
        Ok(JoinDefinition {
            join_type: *twin.join_type(),
            build_keys: twin.on().iter().map(|(l, _)| Arc::clone(l)).collect(),
            probe_keys: probe_keys(twin),
            null_equality: twin.null_equality(),
            null_aware: twin.null_aware,
            filter: twin.filter().cloned(),
            pair_filter: twin.filter().filter(|_| options.filter_on_backend).and_then(PairFilter::of),
            output_schema: twin.schema(),
            output_columns: JoinDefinition::output_columns_from(&column_indices),
            probe_order_required: probe_order_required(twin, key_order.as_ref()),
            keep_probe_order: options.keep_probe_order,
            algorithm: options.algorithm,
            materialization: options.materialization,
            probe_device_gather_ratio: options.probe_device_gather_ratio,
            planned,
            key_order,
        })
    }

    fn with_twin(
        &self,
        twin: Arc<HashJoinExec>,
        dynamic_filter: Option<Arc<DynamicFilterPhysicalExpr>>,
    ) -> Result<Self> {
        self.with_twin_and_filters(twin, dynamic_filter, self.from_above.clone())
    }

    fn with_twin_and_filters(
        &self,
        twin: Arc<HashJoinExec>,
        dynamic_filter: Option<Arc<DynamicFilterPhysicalExpr>>,
        from_above: FiltersFromAbove,
    ) -> Result<Self> {
        let ordered = self.ordered.as_ref().map(|o| o.order.clone().output(&twin)).transpose()?;
        let key_order = ordered.as_ref().map(|o| o.key_order.clone());
        // The sizes as the rule planned them: DataFusion's later passes
        // rebuild the join over inputs of the same rows (filters planted,
        // projections moved), and its statistics, asked again, would walk
        // the whole probe side each time.
        let planned = PlannedSizes { build_sides: build_sides(&twin), ..self.definition.planned };
        let definition = Arc::new(JoinDefinition {
            output_schema: twin.schema(),
            probe_order_required: probe_order_required(&twin, key_order.as_ref()),
            planned,
            key_order,
            ..self.definition.as_ref().clone()
        });
        let devices = self.devices.clone();
        let join = Self::assemble(twin, definition, devices, self.replaces, ordered, dynamic_filter, from_above)?;
        Ok(Self { as_planned: self.as_planned, ..join })
    }

    /// The same join feeding the dynamic filter `replaced`, the
    /// `HashJoinExec` it takes the place of, already planted in its probe
    /// side, if it did.
    pub(crate) fn feeding_planted_filter(mut self, replaced: &HashJoinExec) -> Result<Self> {
        let planted = replaced.dynamic_expressions_produced().into_iter().find_map(as_dynamic_filter);
        if let Some(filter) = planted {
            self.probe_filter = Some(Arc::new(ProbeFilter::new(filter, &self.twin)?));
        }
        Ok(self)
    }

    fn dynamic_filter(&self) -> Option<Arc<DynamicFilterPhysicalExpr>> {
        self.probe_filter.as_ref().map(|f| Arc::clone(f.filter()))
    }

    pub fn left(&self) -> &Arc<dyn ExecutionPlan> {
        self.twin.left()
    }

    pub fn right(&self) -> &Arc<dyn ExecutionPlan> {
        self.twin.right()
    }

    pub fn on(&self) -> &JoinOn {
        &self.twin.on
    }

    pub fn filter(&self) -> Option<&JoinFilter> {
        self.twin.filter()
    }

    pub fn join_type(&self) -> JoinType {
        self.definition.join_type
    }

    pub fn partition_mode(&self) -> PartitionMode {
        *self.twin.partition_mode()
    }

    pub fn null_equality(&self) -> NullEquality {
        self.definition.null_equality
    }

    /// The backend of its devices; the first device's, which plans it.
    pub fn backend(&self) -> &BackendHandle {
        self.devices.first()
    }

    pub fn devices(&self) -> &Devices {
        &self.devices
    }

    /// The index among its devices of the one partition `partition` runs
    /// on.
    fn device_of(&self, partition: usize) -> usize {
        let spreads = spread::spreads_one_build_side(&self.definition);
        spread::device_of(partition, self.partition_mode(), self.devices.len(), spreads)
    }

    pub fn replaces(&self) -> ReplacedOperator {
        self.replaces
    }

    /// The equivalent DataFusion join, over the same children.
    pub fn cpu_equivalent(&self) -> &Arc<HashJoinExec> {
        &self.twin
    }

    /// The strategy as EXPLAIN shows it: what the build sides ran once
    /// they have (`DataFusion` where its operator joined them), what the
    /// settings or fixed rules give before, `auto` where the cost model
    /// will choose; and the reasons of a weighed choice or of DataFusion's
    /// operator joining.
    pub fn strategy_text(&self) -> (String, Option<String>) {
        let backend = self.backend();
        let weighs = matches!(backend, BackendHandle::Cuda(_));
        let planned = choice::planned(backend.preferred_gather_space(), &self.definition, weighs);
        match (self.chosen.describe(), planned) {
            (Some((labels, reasons)), None) => (labels, Some(reasons)),
            (Some((labels, reasons)), Some(_)) if self.chosen.left_to_datafusion() => (labels, Some(reasons)),
            (Some((labels, _)), Some(_)) => (labels, None),
            (None, Some(strategy)) => (strategy.label(), None),
            (None, None) => ("auto".to_string(), None),
        }
    }

    pub fn preserves_probe_order(&self) -> bool {
        self.definition.probe_order_required
    }

    /// The order the output leaves in when it keeps a replaced sort-merge
    /// join's order.
    pub fn key_ordering(&self) -> Option<&datafusion::physical_expr::LexOrdering> {
        self.definition.key_order.as_ref().map(|order| &order.output_ordering)
    }
}

impl ExecutionPlan for GpuJoinExec {
    fn name(&self) -> &'static str {
        "GpuJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        match &self.ordered {
            Some(ordered) => &ordered.properties,
            None => self.twin.properties(),
        }
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        self.twin.input_distribution_requirements()
    }

    /// Probe order where the hash join promised it; an output in key order
    /// is sorted on the device and keeps no input's order.
    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false, self.definition.probe_order_required]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.twin.left(), self.twin.right()]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        let keys = self.twin.on().iter().flat_map(|(l, r)| [Arc::clone(l), Arc::clone(r)]);
        let filter = self.twin.filter().map(|f| Arc::clone(f.expression()));
        let from_above = self.from_above.expressions();
        apply_expression_roots(keys.chain(filter).chain(self.dynamic_expressions_produced()).chain(from_above), f)
    }

    fn dynamic_expressions_produced(&self) -> Vec<Arc<dyn PhysicalExpr>> {
        self.dynamic_filter().into_iter().map(|f| f as Arc<dyn PhysicalExpr>).collect()
    }

    /// The twin routes the parent's filters to the children exactly as the
    /// hash join would, and in the `Post` phase adds a dynamic filter for
    /// the probe side where the hash join would plant one. A join that has
    /// its filter already asks as in the `Pre` phase, which routes the same
    /// parent filters and adds none, so that a second pass plants no copy.
    fn gather_filters_for_pushdown(
        &self,
        phase: FilterPushdownPhase,
        parent_filters: Vec<Arc<dyn PhysicalExpr>>,
        config: &ConfigOptions,
    ) -> Result<FilterDescription> {
        let phase = match (phase, &self.probe_filter) {
            (FilterPushdownPhase::Post, Some(_)) => FilterPushdownPhase::Pre,
            (phase, _) => phase,
        };
        self.twin.gather_filters_for_pushdown(phase, parent_filters, config)
    }

    /// A parent filter is taken where a child took it, as by the hash join;
    /// the dynamic filter the probe side received is kept to be fed, and
    /// the dynamic filters from above that pass through to be applied to
    /// the inputs' rows (`filters_from_above`).
    fn handle_child_pushdown_result(
        &self,
        _phase: FilterPushdownPhase,
        child_pushdown_result: ChildPushdownResult,
        config: &ConfigOptions,
    ) -> Result<FilterPushdownPropagation<Arc<dyn ExecutionPlan>>> {
        let planted = child_pushdown_result.self_filters.get(1).and_then(|filters| filters.first());
        let dynamic = planted.and_then(|f| as_dynamic_filter(Arc::clone(&f.predicate)));
        let from_above = match GpuJoinConfig::from_config(config).filters_from_above {
            true => FiltersFromAbove::routed(&self.twin, &child_pushdown_result.parent_filters, config)?,
            false => FiltersFromAbove::default(),
        };
        let result = FilterPushdownPropagation::if_any(child_pushdown_result);
        if dynamic.is_none() && from_above.is_empty() {
            return Ok(result);
        }
        let dynamic = dynamic.or_else(|| self.dynamic_filter());
        let updated = self.with_twin_and_filters(Arc::clone(&self.twin), dynamic, self.from_above.with(from_above))?;
        Ok(result.with_updated_node(Arc::new(updated) as Arc<dyn ExecutionPlan>))
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let builder = self.twin.builder();
        let builder = match options.children_properties {
            ChildrenPropertiesMode::Keep => builder,
            ChildrenPropertiesMode::Recompute => builder.recompute_properties(),
        };
        Ok(Arc::new(self.with_twin(Arc::new(builder.with_new_children(children)?.build()?), self.dynamic_filter())?))
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(children, ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute))
    }

    /// As the hash join's: the dynamic filter goes with the rest of the
    /// state.
    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        let twin = Arc::new(self.twin.builder().reset_state().build()?);
        Ok(Arc::new(self.with_twin_and_filters(twin, None, FiltersFromAbove::default())?))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let mode = self.partition_mode();
        let (left_partitions, right_partitions) =
            (self.left().output_partitioning().partition_count(), self.right().output_partitioning().partition_count());
        if mode == PartitionMode::Partitioned && left_partitions != right_partitions {
            return internal_err!(
                "GpuJoinExec: {left_partitions} build partitions but {right_partitions} probe partitions"
            );
        }
        if mode == PartitionMode::CollectLeft && left_partitions != 1 {
            return internal_err!("GpuJoinExec: CollectLeft needs one build partition, got {left_partitions}");
        }
        let probe_filter = match &self.probe_filter {
            Some(filter) if filter.read_in(self.right())? => Some(Arc::clone(filter)),
            _ => None,
        };
        if let Some(filter) = &probe_filter {
            filter.feeding(applied_below(self.right(), filter.filter())?);
        }
        let reductions = self.reductions.get_or_init(|| {
            let min_rows = GpuJoinConfig::from_config(context.session_config().options()).min_rows;
            InputReductions {
                build: self.from_above.reduction(0, self.left(), min_rows),
                probe: self.from_above.reduction(1, self.right(), min_rows),
            }
        });
        Arc::clone(&self.runner).execute(PartitionInputs {
            partition,
            limits: JoinLimits::of(context.session_config()),
            context,
            left: Arc::clone(self.left()),
            right: Arc::clone(self.right()),
            mode,
            fetch: self.twin.fetch(),
            metrics: GpuJoinMetrics::new(&self.metrics, partition, &self.devices.ordinals(), self.device_of(partition)),
            probe_filter,
            reductions: reductions.clone(),
            as_planned: self.as_planned,
        })
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        self.twin.child_stats_requests(partition)
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        self.twin.statistics_from_inputs(input_stats, args)
    }

    fn fetch(&self) -> Option<usize> {
        self.twin.fetch()
    }

    fn supports_limit_pushdown(&self) -> bool {
        self.twin.supports_limit_pushdown()
    }

    fn with_fetch(&self, limit: Option<usize>) -> Option<Arc<dyn ExecutionPlan>> {
        let twin = self.twin.builder().with_fetch(limit).build().ok()?;
        Some(Arc::new(self.with_twin(Arc::new(twin), self.dynamic_filter()).ok()?))
    }
}

/// Whether a GPU join or a [`FilteredFromAboveExec`] in `plan` applies
/// `filter` to its input rows ([`filters_from_above`]).
fn applied_below(plan: &Arc<dyn ExecutionPlan>, filter: &DynamicFilterPhysicalExpr) -> Result<bool> {
    let mut found = false;
    plan.apply(|node| {
        found = node.downcast_ref::<GpuJoinExec>().is_some_and(|join| join.from_above.holds(filter))
            || node.downcast_ref::<FilteredFromAboveExec>().is_some_and(|below| below.holds(filter));
        Ok(if found { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
    })?;
    Ok(found)
}

/// `expression` as the dynamic filter it is, if it is one.
fn as_dynamic_filter(expression: Arc<dyn PhysicalExpr>) -> Option<Arc<DynamicFilterPhysicalExpr>> {
    let expression: Arc<dyn Any + Send + Sync> = expression;
    Arc::downcast::<DynamicFilterPhysicalExpr>(expression).ok()
}
