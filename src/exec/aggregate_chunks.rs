//! One partition of a `GpuAggregateExec`: its input grouped chunk by chunk.
//!
//! Each chunk is grouped on a task of its own while the next is read, so
//! the input's scan does not stop while the device groups. The rows held
//! (the chunk read, the one being grouped, a final aggregation's groups so
//! far) are counted in the session's memory pool; where the pool grants no
//! more, a chunk is grouped as it stands, and a final aggregation leaves
//! the rest to DataFusion's, which can spill.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use datafusion::common::exec_datafusion_err;
use datafusion::common::runtime::SpawnedTask;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, RecordOutput, Time,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream, collect};
use futures::StreamExt;

use super::output::output_slices;
use super::read_ahead::StreamSlots;
use super::runtime::run_blocking;
use crate::algorithms::{Grouping, GroupingTimers};
use crate::arrays::owned_slice;
use crate::backend::cuda::CudaBackend;
use crate::backend::{BackendHandle, DeviceCounters, JoinBackend, cpu::CpuBackend};

/// Partition `partition` of `job`'s aggregation, `chunk_rows` input rows
/// grouped at a time, counted in `metrics`.
pub(super) fn grouped_in_chunks(
    job: GroupingJob,
    chunk_rows: usize,
    metrics: &ExecutionPlanMetricsSet,
    partition: usize,
    context: Arc<TaskContext>,
) -> Result<SendableRecordBatchStream> {
    let input = job.aggregate.input().execute(partition, Arc::clone(&context))?;
    let reservation = MemoryConsumer::new(format!("GpuAggregateExec[{partition}]")).register(context.memory_pool());
    let schema = job.aggregate.schema();
    let skip_probe = (!job.grouping.final_groups()).then(|| SkipProbe::new(&context)).flatten();
    let chunks = Chunks {
        input: Some(input),
        chunk: vec![],
        rows: 0,
        chunk_bytes: 0,
        pending: None,
        merged: None,
        phase: Phase::Reading,
        first_rows_to_check: true,
        reservation,
        job: Arc::new(job),
        chunk_rows,
        batch_size: context.session_config().batch_size(),
        skip_probe,
        context,
        metrics: AggregateMetrics::new(metrics, partition),
    };
    let stream = futures::stream::try_unfold(chunks, |mut chunks| async move {
        Ok(chunks.next_batch().await?.map(|batch| (batch, chunks)))
    });
    Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
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
    device: DeviceWork,
}

/// A partition's work with the device, which its grouping tasks add to.
#[derive(Clone)]
struct DeviceWork {
    /// Waiting for the device's admission: not at work, so not in
    /// `elapsed_compute`.
    admission_wait: Time,
    timers: GroupingTimers,
    bytes_to_device: Count,
    bytes_from_device: Count,
}

impl AggregateMetrics {
    fn new(metrics: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        let builder = || MetricBuilder::new(metrics);
        let time = |name: &'static str| builder().subset_time(name, partition);
        Self {
            baseline: BaselineMetrics::new(metrics, partition),
            rows_on_backend: builder().counter("rows_on_backend", partition),
            rows_on_datafusion: builder().counter("rows_on_datafusion", partition),
            groups: builder().counter("groups", partition),
            device: DeviceWork {
                admission_wait: time("admission_wait_time"),
                timers: GroupingTimers {
                    prepare: time("prepare_time"),
                    group: time("group_time"),
                    output: time("output_time"),
                },
                bytes_to_device: builder().counter("bytes_to_device", partition),
                bytes_from_device: builder().counter("bytes_from_device", partition),
            },
        }
    }
}

/// Where a partition's stream stands.
///
/// The input is grouped in chunks of `chunk_rows` rows, fewer where the
/// memory pool grants no more, each on a task of its own while the next is
/// read, one chunk at a time (`Chunks::pending`): the input's scan runs
/// beside the grouping rather than stopping for it. A partial aggregation
/// sends each chunk's groups on once the chunk after it is read; a final one
/// merges each chunk into the groups so far and sends them when its input
/// ends. A partial aggregation whose chunks hardly reduce (`SkipProbe`)
/// sends the groups made so far and leaves the rest of its input to
/// DataFusion's, as does one with a chunk the backend could not group (its
/// keys too wide to pack, or of too few values to pay, or the device
/// failed). The keys of the first `FIRST_ROWS_CHECKED` rows are checked
/// before the first chunk fills, so that an input whose keys would not
/// group goes to DataFusion's at once, with no chunk held for the backend.
///
/// ```text
/// Reading ──(the first rows read: their keys would not group on the backend)──▶ OnDataFusion
/// Reading ──(a chunk read; partial: the one before it grouped)──▶ Emitting ──(its groups sent)──▶ Reading
/// Reading ──(a chunk read; partial: the chunks grouped hardly reduce)──▶ Handing
/// Reading ──(a chunk read; partial: the one before it not grouped)──▶ Handing
/// Handing ──(the last chunk's groups sent)──▶ OnDataFusion
/// Reading ──(a chunk read; final: the one before it merged)──▶ Reading
/// Reading ──(input ends: the last chunk grouped)──▶ Ending ──(the groups sent)──▶ Done
/// Reading ──(final: a chunk the backend cannot merge, or the pool grants no more)──▶ OnDataFusion
/// OnDataFusion ──(DataFusion's aggregation of the groups so far and the rest of the input ends)──▶ Done
/// ```
enum Phase {
    Reading,
    Emitting(VecDeque<RecordBatch>),
    /// The backend's last groups, then DataFusion's aggregation of the
    /// chunk read and the rest of the input.
    Handing(VecDeque<RecordBatch>, OnDataFusion),
    Ending(VecDeque<RecordBatch>),
    OnDataFusion(OnDataFusion),
    Done,
}

/// DataFusion's aggregation of the rest of a partition, and the plan that
/// runs it, whose compute time the partition counts as its own once it ends
/// (EXPLAIN ANALYZE would otherwise show the rows but not the time).
struct OnDataFusion {
    groups: SendableRecordBatchStream,
    plan: Arc<dyn ExecutionPlan>,
}

/// What reading a batch into the chunk says of the chunk.
enum Read {
    /// Room for more rows.
    More,
    /// `chunk_rows` rows in: to be grouped.
    Full,
    /// The memory pool refused the batch: to be grouped now, or, in a final
    /// aggregation, left to DataFusion's, which spills.
    Refused,
}

/// A partition's input, grouped chunk by chunk.
struct Chunks {
    /// `None` once handed to DataFusion's aggregation.
    input: Option<SendableRecordBatchStream>,
    /// The chunk being read.
    chunk: Vec<RecordBatch>,
    /// Input rows in `chunk`.
    rows: usize,
    /// Memory of `chunk`.
    chunk_bytes: usize,
    /// The chunk being grouped.
    pending: Option<Pending>,
    /// A final aggregation's groups of the chunks merged so far, where no
    /// merge is under way, and their memory.
    merged: Option<(RecordBatch, usize)>,
    phase: Phase,
    /// Whether the first rows are still to be checked: no chunk has been
    /// grouped yet, nor `FIRST_ROWS_CHECKED` rows read.
    first_rows_to_check: bool,
    /// The memory of `chunk`, of the chunk being grouped and of `merged`.
    reservation: MemoryReservation,
    job: Arc<GroupingJob>,
    chunk_rows: usize,
    batch_size: usize,
    /// A partial aggregation's check of how far the backend reduces its
    /// rows; `None` in a final one, and where the session turns it off.
    skip_probe: Option<SkipProbe>,
    context: Arc<TaskContext>,
    metrics: AggregateMetrics,
}

/// DataFusion's rule for a partial aggregation that hardly reduces its
/// input (`datafusion.execution.skip_partial_aggregation_probe_*`): once
/// `rows` input rows are grouped, more than `ratio` groups per row leave
/// the rest of the input to DataFusion's partial aggregation, which turns
/// rows into states without grouping them. On the backend such a chunk
/// costs its rows' way to the device and about as many groups' way back,
/// for nothing the final aggregation would not do.
struct SkipProbe {
    rows: usize,
    ratio: f64,
    /// Input rows grouped on the backend so far, and their groups.
    grouped: (usize, usize),
}

impl SkipProbe {
    /// The session's rule; `None` where its ratio (1 or more) turns it off.
    fn new(context: &TaskContext) -> Option<Self> {
        let options = &context.session_config().options().execution;
        let ratio = options.skip_partial_aggregation_probe_ratio_threshold;
        (ratio < 1.0).then_some(Self {
            rows: options.skip_partial_aggregation_probe_rows_threshold,
            ratio,
            grouped: (0, 0),
        })
    }

    /// Counts a chunk of `rows` input rows grouped into `groups`; whether
    /// the rest of the input is better left to DataFusion.
    fn reduces_too_little(&mut self, rows: usize, groups: usize) -> bool {
        self.grouped = (self.grouped.0 + rows, self.grouped.1 + groups);
        let (rows, groups) = self.grouped;
        rows >= self.rows && groups as f64 / rows.max(1) as f64 > self.ratio
    }
}

/// Input rows of a partition whose grouping keys are checked before its
/// first chunk fills (`Chunks::check_first_rows`): enough that keys stored
/// in order still show a range past the default `aggregate_min_key_values`
/// (TPC-H's `lineitem`, in order key order, spans about as many order keys
/// as rows), few enough to hold at no cost beside a chunk.
const FIRST_ROWS_CHECKED: usize = 1 << 18;

/// A chunk being grouped on a task of its own.
struct Pending {
    task: SpawnedTask<Grouped>,
    /// Memory of the batches it holds, reserved until it ends.
    bytes: usize,
}

/// A chunk's grouping: its groups, or its batches back where the backend
/// could not group them.
struct Grouped {
    /// The chunk's input rows (a final aggregation's groups so far, merged
    /// with them, not counted).
    rows: usize,
    groups: std::result::Result<RecordBatch, Vec<RecordBatch>>,
}

/// What grouping a chunk needs, shared by a partition's tasks.
pub(super) struct GroupingJob {
    /// DataFusion's aggregation, which aggregates what the backend cannot.
    pub aggregate: Arc<AggregateExec>,
    pub grouping: Arc<Grouping>,
    pub backend: BackendHandle,
    /// The fewest values a chunk's keys take for the backend to group it.
    pub min_key_values: usize,
    pub concurrent_tasks: usize,
}

impl GroupingJob {
    /// The groups of `batches`, `rows` input rows, made on the backend,
    /// the work timed in `compute` and counted in `work`; the batches back
    /// where it cannot group them.
    async fn group(
        self: Arc<Self>,
        batches: Vec<RecordBatch>,
        rows: usize,
        compute: Time,
        work: DeviceWork,
    ) -> Grouped {
        let grouped = match self.backend.clone() {
            BackendHandle::Cpu => on_backend::<CpuBackend>((), &self, batches.clone(), compute, work).await,
            BackendHandle::Cuda(device) => {
                on_backend::<CudaBackend>(device, &self, batches.clone(), compute, work).await
            }
        };
        let groups = match grouped {
            Ok(Some(groups)) => Ok(groups),
            outcome => {
                if let Err(e) = outcome {
                    log::warn!("gpu_join: a chunk of {rows} rows is aggregated by DataFusion: {e}");
                }
                Err(batches)
            }
        };
        Grouped { rows, groups }
    }
}

impl Chunks {
    async fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            match &mut self.phase {
                Phase::Emitting(batches) | Phase::Handing(batches, _) | Phase::Ending(batches)
                    if !batches.is_empty() =>
                {
                    return Ok(batches.pop_front());
                }
                Phase::Emitting(_) => self.phase = Phase::Reading,
                Phase::Handing(..) => {
                    if let Phase::Handing(_, rest) = std::mem::replace(&mut self.phase, Phase::Done) {
                        self.phase = Phase::OnDataFusion(rest);
                    }
                }
                Phase::Ending(_) | Phase::Done => {
                    self.phase = Phase::Done;
                    return Ok(None);
                }
                Phase::OnDataFusion(rest) => {
                    let next = rest.groups.next().await.transpose()?;
                    match next {
                        Some(batch) => return Ok(Some(batch.record_output(&self.metrics.baseline))),
                        None => {
                            if let Some(nanos) = rest.plan.metrics().and_then(|metrics| metrics.elapsed_compute()) {
                                self.metrics
                                    .baseline
                                    .elapsed_compute()
                                    .add_duration(Duration::from_nanos(nanos as u64));
                            }
                            self.phase = Phase::Done;
                        }
                    }
                }
                Phase::Reading => {
                    let next = match &mut self.input {
                        Some(input) => input.next().await.transpose()?,
                        None => None,
                    };
                    self.phase = match next.map(|batch| self.read(batch)) {
                        Some(Read::More) if self.first_rows_to_check && self.rows >= FIRST_ROWS_CHECKED => {
                            self.check_first_rows()?
                        }
                        Some(Read::More) => Phase::Reading,
                        Some(_) if !self.job.grouping.final_groups() => self.group_read().await?,
                        Some(read) => self.merge_read(read).await?,
                        None if !self.job.grouping.final_groups() => self.group_last().await?,
                        None => self.merge_last().await?,
                    };
                }
            }
        }
    }

    /// Adds `batch` to the chunk, its memory reserved.
    fn read(&mut self, batch: RecordBatch) -> Read {
        let bytes = batch.get_array_memory_size();
        // A batch the pool refuses is held uncounted, as DataFusion's
        // partial aggregation holds its groups when the pool refuses them,
        // and let go of as soon as it can be.
        let refused = self.reservation.try_grow(bytes).is_err();
        if !refused {
            self.chunk_bytes += bytes;
        }
        self.rows += batch.num_rows();
        self.chunk.push(batch);
        match (refused, self.rows >= self.chunk_rows) {
            (true, _) => Read::Refused,
            (false, true) => Read::Full,
            (false, false) => Read::More,
        }
    }

    /// The partition's first rows read: reading goes on where their keys
    /// group on the backend; otherwise the whole input goes to DataFusion's
    /// aggregation now, rather than after a chunk or two held for the
    /// backend (two chunks of a partial aggregation: one read while the
    /// first is tried).
    fn check_first_rows(&mut self) -> Result<Phase> {
        self.first_rows_to_check = false;
        let timer = self.metrics.baseline.elapsed_compute().timer();
        let on_backend = self.job.grouping.keys_group_on_backend(&self.chunk, self.job.min_key_values);
        timer.done();
        match on_backend {
            Ok(true) => Ok(Phase::Reading),
            outcome => {
                if let Err(e) = outcome {
                    log::warn!("gpu_join: an aggregation's keys are left to DataFusion: {e}");
                }
                Ok(Phase::OnDataFusion(self.rest_on_datafusion(vec![])?))
            }
        }
    }

    /// A partial aggregation's chunk read: the groups of the chunk before
    /// it, to send, and this one's grouping started.
    async fn group_read(&mut self) -> Result<Phase> {
        let previous = match self.finish_grouping().await? {
            // Chunks of one input are alike: the next would most likely
            // not group on the backend either.
            Some(Grouped { groups: Err(ungrouped), .. }) => {
                return Ok(Phase::Handing(VecDeque::new(), self.rest_on_datafusion(ungrouped)?));
            }
            previous => previous,
        };
        let reduces_too_little = match (&previous, &mut self.skip_probe) {
            (Some(Grouped { rows, groups: Ok(groups) }), Some(probe)) => {
                probe.reduces_too_little(*rows, groups.num_rows())
            }
            _ => false,
        };
        let groups = self.partial_groups(previous).await?;
        if reduces_too_little {
            let groups = self.sliced(groups)?;
            return Ok(Phase::Handing(groups, self.rest_on_datafusion(vec![])?));
        }
        self.start_grouping()?;
        Ok(Phase::Emitting(self.sliced(groups)?))
    }

    /// A partial aggregation's input ended: the groups of the last chunks.
    async fn group_last(&mut self) -> Result<Phase> {
        let previous = self.finish_grouping().await?;
        let mut groups = self.partial_groups(previous).await?;
        self.start_grouping()?;
        let last = self.finish_grouping().await?;
        groups.extend(self.partial_groups(last).await?);
        Ok(Phase::Ending(self.sliced(groups)?))
    }

    /// A final aggregation's chunk read: the merge before it finished, and
    /// this chunk's begun; DataFusion's aggregation where that merge failed
    /// or the pool refused the chunk.
    async fn merge_read(&mut self, read: Read) -> Result<Phase> {
        if let Some(unmerged) = self.finish_merge().await? {
            return Ok(Phase::OnDataFusion(self.rest_on_datafusion(unmerged)?));
        }
        if let Read::Refused = read {
            return Ok(Phase::OnDataFusion(self.rest_on_datafusion(vec![])?));
        }
        self.start_grouping()?;
        Ok(Phase::Reading)
    }

    /// A final aggregation's input ended: every chunk merged, the groups
    /// to send; DataFusion's aggregation where a merge failed.
    async fn merge_last(&mut self) -> Result<Phase> {
        if let Some(unmerged) = self.finish_merge().await? {
            return Ok(Phase::OnDataFusion(self.rest_on_datafusion(unmerged)?));
        }
        self.start_grouping()?;
        let groups = match self.finish_grouping().await?.map(|grouped| grouped.groups) {
            Some(Err(unmerged)) => return Ok(Phase::OnDataFusion(self.rest_on_datafusion(unmerged)?)),
            // The last merge's groups leave now, whatever the pool says.
            Some(Ok(groups)) => vec![groups],
            None => self.merged.take().map(|(groups, _)| groups).into_iter().collect(),
        };
        Ok(Phase::Ending(self.sliced(groups)?))
    }

    /// Starts grouping the chunk read so far, a final aggregation's groups
    /// so far with it, once the chunk before it is done.
    fn start_grouping(&mut self) -> Result<()> {
        self.first_rows_to_check = false;
        if self.rows == 0 {
            return Ok(());
        }
        let mut batches = std::mem::take(&mut self.chunk);
        let mut bytes = std::mem::take(&mut self.chunk_bytes);
        if let Some((merged, merged_bytes)) = self.merged.take() {
            batches.insert(0, self.job.grouping.as_input(&merged)?);
            bytes += merged_bytes;
        }
        let rows = std::mem::take(&mut self.rows);
        let compute = self.metrics.baseline.elapsed_compute().clone();
        let work = self.metrics.device.clone();
        let task = SpawnedTask::spawn(Arc::clone(&self.job).group(batches, rows, compute, work));
        self.pending = Some(Pending { task, bytes });
        Ok(())
    }

    /// The chunk being grouped, once it is, its rows counted where they
    /// were grouped; `None` where none is.
    async fn finish_grouping(&mut self) -> Result<Option<Grouped>> {
        let Some(Pending { task, bytes }) = self.pending.take() else {
            return Ok(None);
        };
        let grouped = task.join().await.map_err(|e| exec_datafusion_err!("GPU aggregation: grouping a chunk: {e}"))?;
        self.reservation.shrink(bytes);
        match grouped.groups {
            Ok(_) => self.metrics.rows_on_backend.add(grouped.rows),
            Err(_) => self.metrics.rows_on_datafusion.add(grouped.rows),
        }
        Ok(Some(grouped))
    }

    /// A partial aggregation's groups of a chunk: the backend's, or
    /// DataFusion's where the backend could not group it.
    async fn partial_groups(&mut self, grouped: Option<Grouped>) -> Result<Vec<RecordBatch>> {
        match grouped.map(|grouped| grouped.groups) {
            None => Ok(vec![]),
            Some(Ok(groups)) => Ok(vec![groups]),
            Some(Err(batches)) => {
                let timer = self.metrics.baseline.elapsed_compute().timer();
                let groups = on_datafusion(Arc::clone(&self.job.aggregate), batches, Arc::clone(&self.context)).await;
                timer.done();
                groups
            }
        }
    }

    /// A final aggregation's merge under way, finished: its groups are the
    /// groups so far. Where it failed, the batches it merged; where the
    /// pool refuses its groups, those groups: DataFusion's to aggregate.
    async fn finish_merge(&mut self) -> Result<Option<Vec<RecordBatch>>> {
        match self.finish_grouping().await?.map(|grouped| grouped.groups) {
            None => Ok(None),
            Some(Ok(groups)) => {
                let bytes = groups.get_array_memory_size();
                if self.reservation.try_grow(bytes).is_err() {
                    return Ok(Some(vec![self.job.grouping.as_input(&groups)?]));
                }
                self.merged = Some((groups, bytes));
                Ok(None)
            }
            Some(Err(unmerged)) => Ok(Some(unmerged)),
        }
    }

    /// DataFusion's aggregation of `unmerged`, the groups so far, the chunk
    /// read and the rest of the input, as it comes.
    fn rest_on_datafusion(&mut self, mut unmerged: Vec<RecordBatch>) -> Result<OnDataFusion> {
        if let Some((merged, _)) = self.merged.take() {
            unmerged.push(self.job.grouping.as_input(&merged)?);
        }
        self.metrics.rows_on_datafusion.add(std::mem::take(&mut self.rows));
        unmerged.append(&mut self.chunk);
        self.chunk_bytes = 0;
        self.reservation.free();
        // The groups so far in batches of the session's size, so that
        // DataFusion's aggregation can spill between them.
        let mut held = Vec::with_capacity(unmerged.len());
        for batch in unmerged {
            let rows = batch.num_rows();
            match rows <= self.batch_size {
                true => held.push(batch),
                false => {
                    for offset in (0..rows).step_by(self.batch_size) {
                        held.push(owned_slice(&batch, offset, self.batch_size.min(rows - offset))?);
                    }
                }
            }
        }
        let counted = self.metrics.rows_on_datafusion.clone();
        let rest = futures::stream::iter(self.input.take()).flatten().inspect(move |batch| {
            if let Ok(batch) = batch {
                counted.add(batch.num_rows());
            }
        });
        let input = StreamSlots::new(self.job.aggregate.input().schema(), 1);
        input.put(0, futures::stream::iter(held.into_iter().map(Ok)).chain(rest).boxed())?;
        let options = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
        let aggregate = Arc::clone(&self.job.aggregate) as Arc<dyn ExecutionPlan>;
        let plan = aggregate.replace_children(vec![input.plan()?], options)?;
        let groups = plan.execute(0, Arc::clone(&self.context))?;
        Ok(OnDataFusion { groups, plan })
    }

    /// `groups` in batches of the session's size, each over memory of its
    /// own (a slice of a chunk's groups would count all of them in the
    /// reservations of the operators above), counted.
    fn sliced(&self, groups: Vec<RecordBatch>) -> Result<VecDeque<RecordBatch>> {
        let mut out = VecDeque::new();
        for batch in groups {
            self.metrics.groups.add(batch.num_rows());
            for slice in output_slices(&batch, self.batch_size, usize::MAX, &self.metrics.baseline) {
                out.push_back(slice?);
            }
        }
        Ok(out)
    }
}

/// A chunk's groups made on a device of `B`, admitted as its other jobs
/// are; `None` where its keys do not group there. The work is timed in
/// `compute`, the wait for admission apart from it.
async fn on_backend<B: JoinBackend>(
    device: B::Device,
    job: &GroupingJob,
    batches: Vec<RecordBatch>,
    compute: Time,
    work: DeviceWork,
) -> Result<Option<RecordBatch>> {
    let waiting = work.admission_wait.timer();
    let _permit = B::admission(&device).shared(job.concurrent_tasks).await?;
    waiting.done();
    let (grouping, min_key_values) = (Arc::clone(&job.grouping), job.min_key_values);
    run_blocking("grouping rows", move || {
        let _timer = compute.timer();
        let counters = Arc::new(DeviceCounters::default());
        let backend = B::open(&device, Arc::clone(&counters))?;
        let groups = grouping.group(&backend, &batches, min_key_values, &work.timers);
        work.bytes_to_device.add(counters.bytes_to_device() as usize);
        work.bytes_from_device.add(counters.bytes_from_device() as usize);
        groups
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
