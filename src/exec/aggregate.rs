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
//! the input go to DataFusion's aggregation together.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::common::internal_err;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::config::ConfigOptions;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::execution_plan::{CardinalityEffect, ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::filter_pushdown::{FilterDescription, FilterPushdownPhase};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, RecordOutput,
};
use datafusion::physical_plan::statistics::{ChildStats, StatisticsArgs};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, InputDistributionRequirements, PlanProperties,
    SendableRecordBatchStream, Statistics, collect,
};
use futures::StreamExt;

use super::runtime::run_blocking;
use crate::algorithms::Grouping;
use crate::backend::cuda::CudaBackend;
use crate::backend::{BackendHandle, DeviceCounters, JoinBackend, cpu::CpuBackend};
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
        let input = self.aggregate.input().execute(partition, Arc::clone(&context))?;
        let metrics = AggregateMetrics::new(&self.metrics, partition);
        let chunks = Chunks {
            input,
            chunk: vec![],
            rows: 0,
            merged: None,
            phase: Phase::Reading,
            aggregate: Arc::clone(&self.aggregate),
            grouping: Arc::clone(&self.grouping),
            backend: self.backend.clone(),
            chunk_rows: self.chunk_rows,
            concurrent_tasks: self.concurrent_tasks,
            batch_size: context.session_config().batch_size(),
            context,
            metrics,
        };
        let stream = futures::stream::try_unfold(chunks, |mut chunks| async move {
            Ok(chunks.next_batch().await?.map(|batch| (batch, chunks)))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.aggregate.schema(), stream)))
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

/// What the partition's work is counted in (EXPLAIN ANALYZE).
struct AggregateMetrics {
    baseline: BaselineMetrics,
    /// Rows the backend grouped.
    rows_on_backend: Count,
    /// Rows left to DataFusion's aggregation.
    rows_on_datafusion: Count,
    /// Groups the partition emitted.
    groups: Count,
}

impl AggregateMetrics {
    fn new(metrics: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        let builder = || MetricBuilder::new(metrics);
        Self {
            baseline: BaselineMetrics::new(metrics, partition),
            rows_on_backend: builder().counter("rows_on_backend", partition),
            rows_on_datafusion: builder().counter("rows_on_datafusion", partition),
            groups: builder().counter("groups", partition),
        }
    }
}

/// Where a partition's stream stands.
///
/// A partial aggregation sends each chunk's groups on; a final one merges
/// each chunk into the groups so far and sends them when its input ends.
///
/// ```text
/// Reading ──(chunk_rows rows in; partial)──▶ Emitting ──(its groups sent)──▶ Reading
/// Reading ──(chunk_rows rows in; final: merged into the groups so far)──▶ Reading
/// Reading ──(final: a chunk the backend cannot merge)──▶ Collecting
/// Collecting ──(input ends: DataFusion aggregates the groups so far and the rest)──▶ Ending
/// Reading ──(input ends: the last chunk grouped)──▶ Ending ──(its groups sent)──▶ Done
/// ```
enum Phase {
    Reading,
    Emitting(VecDeque<RecordBatch>),
    Collecting,
    Ending(VecDeque<RecordBatch>),
    Done,
}

/// A partition's input, grouped chunk by chunk.
struct Chunks {
    input: SendableRecordBatchStream,
    chunk: Vec<RecordBatch>,
    /// Input rows in `chunk`.
    rows: usize,
    /// A final aggregation's groups of the chunks merged so far.
    merged: Option<RecordBatch>,
    phase: Phase,
    aggregate: Arc<AggregateExec>,
    grouping: Arc<Grouping>,
    backend: BackendHandle,
    chunk_rows: usize,
    concurrent_tasks: usize,
    batch_size: usize,
    context: Arc<TaskContext>,
    metrics: AggregateMetrics,
}

impl Chunks {
    async fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            match &mut self.phase {
                Phase::Emitting(batches) | Phase::Ending(batches) if !batches.is_empty() => {
                    return Ok(batches.pop_front().map(|batch| batch.record_output(&self.metrics.baseline)));
                }
                Phase::Emitting(_) => self.phase = Phase::Reading,
                Phase::Ending(_) | Phase::Done => {
                    self.phase = Phase::Done;
                    return Ok(None);
                }
                Phase::Reading => match self.input.next().await.transpose()? {
                    Some(batch) => {
                        self.rows += batch.num_rows();
                        self.chunk.push(batch);
                        if self.rows >= self.chunk_rows {
                            self.phase = match self.grouping.final_groups() {
                                false => Phase::Emitting(self.group_chunk().await?),
                                true if self.merge_chunk().await? => Phase::Reading,
                                true => Phase::Collecting,
                            };
                        }
                    }
                    None if !self.grouping.final_groups() => self.phase = Phase::Ending(self.group_chunk().await?),
                    None => {
                        let groups = match self.merge_chunk().await? {
                            true => self.merged.take().into_iter().collect(),
                            false => self.on_datafusion().await?,
                        };
                        self.phase = Phase::Ending(self.sliced(groups));
                    }
                },
                Phase::Collecting => match self.input.next().await.transpose()? {
                    Some(batch) => {
                        self.metrics.rows_on_datafusion.add(batch.num_rows());
                        self.chunk.push(batch);
                    }
                    None => {
                        let groups = self.on_datafusion().await?;
                        self.phase = Phase::Ending(self.sliced(groups));
                    }
                },
            }
        }
    }

    /// The groups of the chunk read so far, in batches of the session's
    /// size.
    async fn group_chunk(&mut self) -> Result<VecDeque<RecordBatch>> {
        if self.rows == 0 {
            return Ok(VecDeque::new());
        }
        let groups = match self.on_backend().await? {
            Some(groups) => vec![groups],
            None => self.on_datafusion().await?,
        };
        Ok(self.sliced(groups))
    }

    /// Merges the chunk read so far into the groups so far, on the
    /// backend; false where it cannot, and both wait in the chunk for
    /// DataFusion's aggregation.
    async fn merge_chunk(&mut self) -> Result<bool> {
        if self.rows == 0 {
            return Ok(true);
        }
        if let Some(merged) = self.merged.take() {
            self.chunk.insert(0, self.grouping.as_input(&merged)?);
        }
        match self.on_backend().await? {
            Some(groups) => {
                self.merged = Some(groups);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The chunk's groups made on the backend, the chunk taken; `None`,
    /// with the chunk left and its rows counted as DataFusion's, where the
    /// backend cannot group it.
    async fn on_backend(&mut self) -> Result<Option<RecordBatch>> {
        let timer = self.metrics.baseline.elapsed_compute().timer();
        let (grouping, tasks, batches) = (Arc::clone(&self.grouping), self.concurrent_tasks, self.chunk.clone());
        let grouped = match self.backend.clone() {
            BackendHandle::Cpu => on_backend::<CpuBackend>((), grouping, batches, tasks).await,
            BackendHandle::Cuda(device) => on_backend::<CudaBackend>(device, grouping, batches, tasks).await,
        };
        timer.done();
        let rows = std::mem::take(&mut self.rows);
        match grouped {
            Ok(Some(groups)) => {
                self.metrics.rows_on_backend.add(rows);
                self.chunk.clear();
                Ok(Some(groups))
            }
            outcome => {
                if let Err(e) = outcome {
                    log::warn!("gpu_join: a chunk of {rows} rows is aggregated by DataFusion: {e}");
                }
                self.metrics.rows_on_datafusion.add(rows);
                Ok(None)
            }
        }
    }

    /// The groups of the chunk, the chunk taken, made by DataFusion's
    /// aggregation.
    async fn on_datafusion(&mut self) -> Result<Vec<RecordBatch>> {
        let timer = self.metrics.baseline.elapsed_compute().timer();
        let batches = std::mem::take(&mut self.chunk);
        let groups = on_datafusion(Arc::clone(&self.aggregate), batches, Arc::clone(&self.context)).await;
        timer.done();
        groups
    }

    /// `groups` in batches of the session's size, counted.
    fn sliced(&self, groups: Vec<RecordBatch>) -> VecDeque<RecordBatch> {
        let mut out = VecDeque::new();
        for batch in groups {
            self.metrics.groups.add(batch.num_rows());
            let mut offset = 0;
            while offset < batch.num_rows() {
                let len = self.batch_size.min(batch.num_rows() - offset);
                out.push_back(batch.slice(offset, len));
                offset += len;
            }
        }
        out
    }
}

/// A chunk's groups made on a device of `B`, admitted as its other jobs
/// are; `None` where its keys do not group there.
async fn on_backend<B: JoinBackend>(
    device: B::Device,
    grouping: Arc<Grouping>,
    batches: Vec<RecordBatch>,
    concurrent_tasks: usize,
) -> Result<Option<RecordBatch>> {
    let _permit = B::admission(&device).shared(concurrent_tasks).await?;
    run_blocking("grouping rows", move || {
        let backend = B::open(&device, Arc::new(DeviceCounters::default()))?;
        grouping.group(&backend, &batches)
    })
    .await
}

/// A chunk's groups made by DataFusion's aggregation.
async fn on_datafusion(
    aggregate: Arc<AggregateExec>,
    batches: Vec<RecordBatch>,
    context: Arc<TaskContext>,
) -> Result<Vec<RecordBatch>> {
    let source =
        MemorySourceConfig::try_new_exec(&[batches], aggregate.input().schema(), None)? as Arc<dyn ExecutionPlan>;
    let options = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
    let plan = (aggregate as Arc<dyn ExecutionPlan>).replace_children(vec![source], options)?;
    collect(plan, context).await
}
