//! An input's rows less those that the dynamic filters of GPU joins above
//! cannot match (`gpu_join.filters_from_above`), where an operator between
//! the scan and the join would otherwise do work for them: under an
//! aggregation whose groups the filters' keys are.
//!
//! DataFusion passes a join's dynamic filter through an aggregation where
//! it reads grouping columns only, since it then picks whole groups, and a
//! scan skips row groups with it. The aggregation still reads every row
//! the scan gives: in TPC-H Q17 the 6 million rows of `lineitem` at SF 1,
//! grouped by part, of which the semi join above can match the 204 parts
//! of one brand and container. This node, which the rule puts under such
//! an aggregation, applies the filter to those rows as a GPU join applies
//! the filters passing through it ([`super::filters_from_above`]): it reads
//! its input ahead until the join has its build sides in, then drops the
//! rows whose key none of them holds, and stops checking where that drops
//! too few.

use std::fmt;
use std::sync::{Arc, OnceLock};

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::DynamicFilterPhysicalExpr;
use datafusion::physical_plan::execution_plan::{CardinalityEffect, ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::filter_pushdown::{
    ChildPushdownResult, FilterDescription, FilterPushdownPhase, FilterPushdownPropagation,
};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, RecordOutput,
};
use datafusion::physical_plan::statistics::{ChildStats, StatisticsArgs};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream, Statistics,
    apply_expression_roots,
};
use futures::{StreamExt, TryStreamExt};

use super::filters_from_above::{FiltersFromAbove, RowReduction, reduced};
use super::read_ahead::{read_ahead_while, worth_reading_ahead};
use crate::config::GpuJoinConfig;

/// Its input's rows that the dynamic filters of GPU joins above can match;
/// every row where no such filter reaches it.
#[derive(Debug)]
pub struct FilteredFromAboveExec {
    input: Arc<dyn ExecutionPlan>,
    /// The dynamic filters that reached it, in its input's columns.
    filters: FiltersFromAbove,
    /// What its rows go through, made at the first execution.
    reduction: OnceLock<Option<Arc<RowReduction>>>,
    metrics: ExecutionPlanMetricsSet,
}

impl FilteredFromAboveExec {
    pub fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        Self::with_filters(input, FiltersFromAbove::default())
    }

    fn with_filters(input: Arc<dyn ExecutionPlan>, filters: FiltersFromAbove) -> Self {
        Self { input, filters, reduction: OnceLock::new(), metrics: ExecutionPlanMetricsSet::new() }
    }

    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }

    /// Whether `filter` reached it, to be applied to its rows.
    pub(crate) fn holds(&self, filter: &DynamicFilterPhysicalExpr) -> bool {
        self.filters.holds(filter)
    }
}

impl DisplayAs for FilteredFromAboveExec {
    fn fmt_as(&self, _format: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FilteredFromAboveExec: filters={}", self.filters.len())
    }
}

impl ExecutionPlan for FilteredFromAboveExec {
    fn name(&self) -> &'static str {
        "FilteredFromAboveExec"
    }

    /// Its input's: dropping rows keeps their partitions and order.
    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        apply_expression_roots(self.filters.expressions(), f)
    }

    fn replace_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let (Some(input), true) = (children.pop(), children.is_empty()) else {
            return datafusion::common::internal_err!("FilteredFromAboveExec takes one child");
        };
        Ok(Arc::new(Self::with_filters(input, self.filters.clone())))
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(children, ReplaceChildrenOptions::new(ChildrenPropertiesMode::Keep))
    }

    /// The filters go with the rest of the state, as a join's do.
    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::new(Arc::clone(&self.input))))
    }

    /// Its input's rows, read ahead while the filters are not complete
    /// (up to `gpu_join.probe_read_ahead_rows`), then checked: the input
    /// does not depend on the joins above, and waiting without reading ran
    /// it after their build sides. In TPC-DS Q81 at SF 100 the second
    /// reading of the common table expression waited so for the first,
    /// the semi join's build side: the query took 1.05 times DataFusion's
    /// time, and 0.99 reading ahead.
    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let options = GpuJoinConfig::from_config(context.session_config().options());
        let (min_rows, read_ahead_rows) = (options.min_rows, options.probe_read_ahead_rows);
        let pool = Arc::clone(context.memory_pool());
        let input = self.input.execute(partition, context)?;
        let Some(reduction) = self.reduction.get_or_init(|| self.filters.reduction(0, &self.input, min_rows)).clone()
        else {
            return Ok(input);
        };
        let reservation = MemoryConsumer::new(format!("FilteredFromAboveExec[{partition}]")).register(&pool);
        let read_ahead_rows = if worth_reading_ahead(&self.input) { read_ahead_rows } else { 0 };
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let dropped = MetricBuilder::new(&self.metrics).counter("rows_filtered_from_above", partition);
        let (schema, compute) = (input.schema(), baseline.elapsed_compute().clone());
        let rows = futures::stream::once(async move {
            let complete = async { reduction.predicate().await.map(|_| ()) };
            let (complete, input) =
                read_ahead_while(input.boxed(), complete, read_ahead_rows, || true, reservation).await;
            complete?;
            Ok::<_, DataFusionError>(reduced(input, Some(reduction), dropped, compute))
        })
        .try_flatten()
        .map_ok(move |batch| batch.record_output(&baseline));
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, rows)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        vec![ChildStats::At(partition)]
    }

    /// Its input's, made inexact: it drops rows only once the joins above
    /// have their build sides in.
    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        Ok(Arc::new(input_stats.first().map(|stats| stats.as_ref().clone().to_inexact()).unwrap_or_default()))
    }

    fn cardinality_effect(&self) -> CardinalityEffect {
        CardinalityEffect::LowerEqual
    }

    /// Every filter goes on to the input, whose scan skips row groups with
    /// it.
    fn gather_filters_for_pushdown(
        &self,
        _phase: FilterPushdownPhase,
        parent_filters: Vec<Arc<dyn PhysicalExpr>>,
        _config: &ConfigOptions,
    ) -> Result<FilterDescription> {
        FilterDescription::from_children(parent_filters, &self.children())
    }

    /// The dynamic filters among the parent's are kept, to be applied to
    /// the input's rows.
    fn handle_child_pushdown_result(
        &self,
        _phase: FilterPushdownPhase,
        child_pushdown_result: ChildPushdownResult,
        config: &ConfigOptions,
    ) -> Result<FilterPushdownPropagation<Arc<dyn ExecutionPlan>>> {
        let reached = match GpuJoinConfig::from_config(config).filters_from_above {
            true => FiltersFromAbove::passed_through(&child_pushdown_result.parent_filters),
            false => FiltersFromAbove::default(),
        };
        let result = FilterPushdownPropagation::if_all(child_pushdown_result);
        if reached.is_empty() {
            return Ok(result);
        }
        let updated = Self::with_filters(Arc::clone(&self.input), self.filters.with(reached));
        Ok(result.with_updated_node(Arc::new(updated) as Arc<dyn ExecutionPlan>))
    }
}
