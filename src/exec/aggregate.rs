//! `GpuAggregateExec`: DataFusion's aggregation, its rows grouped on the
//! backend (`gpu_join.aggregate`).
//!
//! It keeps the `AggregateExec` it replaces, which defines what it promises
//! the plan (schema, partitioning, statistics, the filters it passes down)
//! and aggregates, as DataFusion does, each chunk whose keys the backend
//! cannot group exactly or whose grouping fails on the device (out of
//! memory, say): every chunk's rows are grouped once, by one of the two.
//! A partial aggregation's groups of each chunk leave as soon as they are
//! made, to be merged by the final aggregation above, as DataFusion's
//! partial aggregation emits its groups when it runs out of memory. A
//! final aggregation emits each group once: each chunk is merged into the
//! groups so far, and once a chunk cannot be, those groups and the rest of
//! the input go to DataFusion's aggregation together, streamed.
//!
//! Each partition's stream (`aggregate_chunks.rs`) groups its input chunk
//! by chunk.

use std::fmt;
use std::sync::Arc;

use datafusion::common::internal_err;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::execution_plan::{CardinalityEffect, ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::filter_pushdown::{FilterDescription, FilterPushdownPhase};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::statistics::{ChildStats, StatisticsArgs};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, InputDistributionRequirements, PlanProperties,
    SendableRecordBatchStream, Statistics,
};

use super::aggregate_chunks::{GroupingJob, grouped_in_chunks};
use crate::algorithms::Grouping;
use crate::backend::BackendHandle;
use crate::config::GpuJoinConfig;

/// An aggregation whose groups the backend makes.
#[derive(Debug)]
pub struct GpuAggregateExec {
    /// DataFusion's aggregation it replaces.
    aggregate: Arc<AggregateExec>,
    grouping: Arc<Grouping>,
    backend: BackendHandle,
    /// Rows of the input grouped at once (`gpu_join.aggregate_chunk_rows`).
    chunk_rows: usize,
    /// `gpu_join.aggregate_min_key_values`.
    min_key_values: usize,
    concurrent_tasks: usize,
    metrics: ExecutionPlanMetricsSet,
}

impl GpuAggregateExec {
    /// `aggregate`, which `grouping` describes, on `backend`.
    pub fn new(
        aggregate: Arc<AggregateExec>,
        grouping: Grouping,
        backend: BackendHandle,
        options: &GpuJoinConfig,
    ) -> Self {
        Self {
            aggregate,
            grouping: Arc::new(grouping),
            backend,
            chunk_rows: options.aggregate_chunk_rows.max(1),
            min_key_values: options.aggregate_min_key_values,
            concurrent_tasks: options.concurrent_tasks,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// DataFusion's aggregation it replaces.
    pub fn aggregate(&self) -> &Arc<AggregateExec> {
        &self.aggregate
    }

    /// The backend it groups on.
    pub fn backend(&self) -> &BackendHandle {
        &self.backend
    }

    fn with_aggregate(&self, aggregate: Arc<dyn ExecutionPlan>) -> Result<Self> {
        let Some(aggregate) = aggregate.downcast_ref::<AggregateExec>() else {
            return internal_err!("GpuAggregateExec wraps an AggregateExec");
        };
        Ok(Self {
            aggregate: Arc::new(aggregate.clone()),
            grouping: Arc::clone(&self.grouping),
            backend: self.backend.clone(),
            chunk_rows: self.chunk_rows,
            min_key_values: self.min_key_values,
            concurrent_tasks: self.concurrent_tasks,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

impl DisplayAs for GpuAggregateExec {
    fn fmt_as(&self, format: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GpuAggregateExec: backend={}, ", self.backend.name())?;
        self.aggregate.fmt_as(format, f)
    }
}

impl ExecutionPlan for GpuAggregateExec {
    fn name(&self) -> &'static str {
        "GpuAggregateExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.aggregate.properties()
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        self.aggregate.input_distribution_requirements()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.aggregate.input()]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        self.aggregate.apply_expressions(f)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let aggregate = Arc::clone(&self.aggregate).replace_children(children, options)?;
        Ok(Arc::new(self.with_aggregate(aggregate)?))
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(children, ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let job = GroupingJob {
            aggregate: Arc::clone(&self.aggregate),
            grouping: Arc::clone(&self.grouping),
            backend: self.backend.clone(),
            min_key_values: self.min_key_values,
            concurrent_tasks: self.concurrent_tasks,
        };
        grouped_in_chunks(job, self.chunk_rows, &self.metrics, partition, context)
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        self.aggregate.child_stats_requests(partition)
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        self.aggregate.statistics_from_inputs(input_stats, args)
    }

    fn cardinality_effect(&self) -> CardinalityEffect {
        self.aggregate.cardinality_effect()
    }

    /// DataFusion's aggregation's: filters on grouping columns go on to the
    /// input, which the groups come from.
    fn gather_filters_for_pushdown(
        &self,
        phase: FilterPushdownPhase,
        parent_filters: Vec<Arc<dyn PhysicalExpr>>,
        config: &ConfigOptions,
    ) -> Result<FilterDescription> {
        self.aggregate.gather_filters_for_pushdown(phase, parent_filters, config)
    }
}
