//! One output partition of a GPU join, as a three-stage pipeline.
//!
//! The assembler stages probe batches into large chunks and assembles them
//! on the host; the loader encodes a chunk's keys and uploads it on one
//! backend instance (one CUDA stream); the joiner joins each loaded chunk
//! on another instance and hands the output on in batches of the session's
//! `batch_size`. So the host copy of chunk k + 2, the upload of chunk
//! k + 1, the kernels and download of chunk k and the hand-off of chunk
//! k - 1's batches overlap, and across partitions the device sees uploads,
//! kernels and downloads of different chunks at once. Every backend call
//! runs on tokio's blocking pool, under the device's bounded admission.
//!
//! The pipeline starts while a build side estimated to fit is still being
//! prepared whole: chunks are staged and assembled meanwhile, loading waits
//! for the build side's probe plan (how chunks encode their keys), which
//! comes while the build side is transformed, and joining waits for the
//! build side. Should it be split into passes after all, the probe rows
//! read so far, none of them joined, are joined pass by pass with the rest;
//! chunks loaded for it are dropped. A build side split into passes runs
//! the pipeline once per pass, over the probe rows of that pass; one that
//! did not fit, for a join that cannot be split, leaves the partition to
//! DataFusion's operator.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use arrow::record_batch::RecordBatch;
use datafusion::common::{exec_datafusion_err, internal_datafusion_err, internal_err};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::joins::PartitionMode;
use datafusion::physical_plan::metrics::{BaselineMetrics, RecordOutput};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::mpsc::{Receiver, Sender, channel};

use super::build::{CollectedBuild, DeviceJoin, PendingBuild, admitted};
use super::fallback::{join_chunk_on_cpu, join_partition_on_cpu};
use super::handoff::Handover;
use super::passes::{BuildPasses, SPLIT_ROWS, split_by_pass};
use super::read_ahead::{read_ahead_while, worth_reading_ahead};
use super::runner::{PartitionInputs, Runner, drop_off_the_workers};
use super::smaller_side;
use super::staging::{ProbeStaging, StagedChunk, held_bytes};
use crate::algorithms::{
    BuildSide, HostRows, JoinedChunk, LoadedChunk, ProbeColumns, ProbeOutput, ProbePlan, Settle, columns_held,
    finish_build_side, join_loaded_chunk, load_probe_chunk,
};
use crate::arrays::{compacted, owned_slice};
use crate::backend::{DeviceCounters, JoinBackend, MAX_CANDIDATES, MAX_RELATION_ROWS};
use crate::config::GpuJoinConfig;

/// Below this many rows a chunk that runs out of device memory is not
/// split further but handed to DataFusion's operator.
const SMALLEST_RETRY_ROWS: usize = 1 << 12;

/// Runs blocking join work on tokio's blocking pool, so that no backend
/// call holds up an async worker. A panic there becomes an error.
pub(crate) async fn run_blocking<T: Send + 'static>(
    what: &'static str,
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work).await.map_err(|e| exec_datafusion_err!("GPU join failed while {what}: {e}"))?
}

/// Whether an error says that device memory ran out.
pub(crate) fn is_out_of_memory(error: &DataFusionError) -> bool {
    matches!(error.find_root(), DataFusionError::ResourcesExhausted(_))
}

/// Stops the partition's backend work when the partition's task is
/// dropped (the query was cancelled): the next launch fails.
pub(crate) struct CancelOnDrop(pub Arc<DeviceCounters>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

pub(crate) async fn run_partition<B: JoinBackend>(
    runner: Arc<Runner<B>>,
    inputs: PartitionInputs,
    tx: Sender<Result<RecordBatch>>,
    handover: Handover,
) -> Result<()> {
    let options = GpuJoinConfig::from_config(inputs.context.session_config().options());
    // Injected failures hit probe chunks; the build side's preparation has
    // its own (see `super::build`).
    let (counters, build_counters) = (Arc::new(DeviceCounters::default()), Arc::new(DeviceCounters::default()));
    counters.inject_allocation_failures(0, options.inject_allocation_failures);
    let _cancel = (CancelOnDrop(Arc::clone(&counters)), CancelOnDrop(Arc::clone(&build_counters)));
    let result = match runner.join.open_backend(Arc::clone(&build_counters)) {
        Ok(build_backend) => join_partition(&runner, build_backend, &inputs, &options, &counters, &tx, handover).await,
        Err(e) => Err(e),
    };
    inputs.metrics.record_device(&counters);
    inputs.metrics.record_device(&build_counters);
    inputs.metrics.baseline.done();
    // The plan's inputs first, so that the runner holds what is left of it.
    drop(inputs);
    Runner::release(runner);
    result
}

/// Where a partition's jobs take the build side from.
enum BuildSource<B: JoinBackend> {
    Whole(Arc<BuildSide<B>>),
    /// One pass of a split build side, taken for one job at a time.
    Pass(Arc<BuildPasses<B>>, usize),
    /// A build side still being prepared whole, and the probe rows read
    /// before it was on the device.
    Preparing(PendingBuild<B>, Arc<HeldProbe>),
}

/// The build side as a job finds it.
enum BuildNow<B: JoinBackend> {
    Ready(Arc<BuildSide<B>>),
    /// Prepared whole, it did not fit the device: it was split into passes.
    Split(Arc<BuildPasses<B>>),
}

/// What a loader finds to load the next chunk by.
enum PlanNow<B: JoinBackend> {
    /// The plan, and the build side it came from when one is ready, held
    /// while the chunk loads.
    Ready(Arc<ProbePlan>, Option<Arc<BuildSide<B>>>),
    Split(Arc<BuildPasses<B>>),
}

/// Probe batches a partition read while its build side was being prepared
/// whole, held in case it is split into passes after all: the partition
/// then joins every probe row pass by pass, as none has been joined yet.
struct HeldProbe {
    /// `None` once the build side is on the device.
    held: Mutex<Option<HeldBatches>>,
}

type HeldBatches = (Vec<RecordBatch>, MemoryReservation);

impl HeldProbe {
    fn new(inputs: &PartitionInputs) -> Self {
        let reservation = MemoryConsumer::new(format!("GpuJoinProbeHeld[{}]", inputs.partition))
            .register(inputs.context.memory_pool());
        Self { held: Mutex::new(Some((vec![], reservation))) }
    }

    fn lock(&self) -> Result<MutexGuard<'_, Option<HeldBatches>>> {
        self.held.lock().map_err(|_| internal_datafusion_err!("GPU join: held probe rows lock poisoned"))
    }

    /// Holds `batch` while the build side may still be split.
    fn hold(&self, batch: &RecordBatch) -> Result<()> {
        if let Some((batches, reservation)) = self.lock()?.as_mut() {
            reservation.try_grow(held_bytes(batch))?;
            batches.push(batch.clone());
        }
        Ok(())
    }

    /// The build side is on the device: nothing needs holding any more.
    fn release(&self) -> Result<()> {
        *self.lock()? = None;
        Ok(())
    }

    /// The batches held, in the order they were read.
    fn take(&self) -> Result<Vec<RecordBatch>> {
        Ok(self.lock()?.take().map(|(batches, _)| batches).unwrap_or_default())
    }
}

/// What every stage of one output partition works with.
struct Partition<'a, B: JoinBackend> {
    join: &'a DeviceJoin<B>,
    build: BuildSource<B>,
    /// The instance that prepares a pass of the build side when this
    /// partition is the first to ask for it.
    build_backend: B,
    inputs: &'a PartitionInputs,
    options: &'a GpuJoinConfig,
    /// Counters of the probe-chunk instances.
    counters: &'a Arc<DeviceCounters>,
}

impl<B: JoinBackend> Partition<'_, B> {
    /// The build side for one job; a job holds it no longer than it runs.
    async fn build_now(&self) -> Result<BuildNow<B>> {
        match &self.build {
            BuildSource::Whole(build) => Ok(BuildNow::Ready(Arc::clone(build))),
            BuildSource::Pass(passes, pass) => {
                let prepare = |piece| {
                    self.inputs.metrics.build_pass_loads.add(1);
                    let rows = HostRows::whole(piece);
                    self.join.prepare_admitted(
                        &self.build_backend,
                        &self.inputs.metrics,
                        self.options,
                        rows,
                        None,
                        None,
                        None,
                    )
                };
                Ok(BuildNow::Ready(passes.acquire(*pass, prepare).await?))
            }
            BuildSource::Preparing(pending, held) => match pending.placed().await?.as_ref() {
                CollectedBuild::Whole { side, .. } => {
                    held.release()?;
                    Ok(BuildNow::Ready(Arc::clone(side)))
                }
                CollectedBuild::Passes { passes, .. } => Ok(BuildNow::Split(Arc::clone(passes))),
                CollectedBuild::OnCpu { .. } | CollectedBuild::OnCpuPartition { .. } => {
                    internal_err!("GPU join: a join that splits into passes was left to DataFusion's operator")
                }
            },
        }
    }

    /// The probe plan for loading a chunk: a build side being prepared
    /// whole gives it while it is still being prepared.
    async fn plan_now(&self) -> Result<PlanNow<B>> {
        if let BuildSource::Preparing(pending, _) = &self.build
            && let Some(plan) = pending.probe_plan().await?
        {
            return Ok(PlanNow::Ready(plan, None));
        }
        Ok(match self.build_now().await? {
            BuildNow::Ready(build) => PlanNow::Ready(Arc::clone(build.plan()), Some(build)),
            BuildNow::Split(passes) => PlanNow::Split(passes),
        })
    }

    /// Whether a build side that was being prepared whole was split into
    /// passes instead; waits for it to be placed.
    async fn split_instead(&self) -> Result<Option<Arc<BuildPasses<B>>>> {
        match &self.build {
            BuildSource::Preparing(..) => match self.build_now().await? {
                BuildNow::Split(passes) => Ok(Some(passes)),
                BuildNow::Ready(_) => Ok(None),
            },
            _ => Ok(None),
        }
    }

    /// Holds a probe batch read while the build side may still be split.
    fn hold_probe(&self, batch: &RecordBatch) -> Result<()> {
        match &self.build {
            BuildSource::Preparing(_, held) => held.hold(batch),
            _ => Ok(()),
        }
    }

    fn open_backend(&self) -> Result<B> {
        self.join.open_backend(Arc::clone(self.counters))
    }

    /// A shared permit of the device's admission.
    async fn admitted(&self) -> Result<OwnedSemaphorePermit> {
        admitted(&self.inputs.metrics, self.join.admission().shared(self.options.concurrent_tasks)).await
    }
}

/// A probe chunk on its way from the loader to the joiner.
enum Chunk<B: JoinBackend> {
    Loaded(LoadedChunk<B>),
    /// Loading ran out of device memory; the joiner retries it.
    NotLoaded(HostRows, DataFusionError),
}

async fn join_partition<B: JoinBackend>(
    runner: &Arc<Runner<B>>,
    build_backend: B,
    inputs: &PartitionInputs,
    options: &GpuJoinConfig,
    counters: &Arc<DeviceCounters>,
    tx: &Sender<Result<RecordBatch>>,
    handover: Handover,
) -> Result<()> {
    let cell = runner.build_cell(inputs.mode)?;
    let ahead =
        MemoryConsumer::new(format!("GpuJoinProbeAhead[{}]", inputs.partition)).register(inputs.context.memory_pool());
    let collected = runner.pending_build(&cell, inputs, options);
    // Reading ahead pays only for a build side that may still go to
    // DataFusion's operator: a larger one goes to the device, which waits
    // for its collection, and the probe scan would slow it. Nor in
    // `Partitioned` mode, where the probe input is a hash repartition of
    // every probe partition: reading it runs the whole probe side's scan
    // beside the build side's (TPC-H Q12 at SF 10, docs/benchmarks.md).
    let (rows_in, min_build_rows) = (Arc::clone(&cell.rows_in), options.min_build_rows);
    let small_so_far = move || rows_in.load(Ordering::Relaxed) < min_build_rows;
    // Nor where the probe scan reads a dynamic filter: rows read before the
    // build side is in are rows the filter could have dropped. Nor where
    // the probe input is batches in memory, with nothing to hide.
    let read_ahead_rows = match (inputs.mode, &inputs.probe_filter) {
        (PartitionMode::CollectLeft, None) if worth_reading_ahead(&inputs.right) => options.probe_read_ahead_rows,
        _ => 0,
    };
    let (pending, mut probe) =
        read_ahead_while(probe_input(inputs)?, collected, read_ahead_rows, small_so_far, ahead).await;
    let pending = pending?;
    if let Some(filter) = &inputs.probe_filter {
        filter.complete().await;
    }
    let join = runner.join.as_ref();
    let probe_keys = &join.definition.probe_keys;
    let mut output = OutputSender::new(tx, inputs);
    let partition = |build| Partition { join, build, build_backend: build_backend.clone(), inputs, options, counters };
    let in_passes = |passes: &Arc<BuildPasses<B>>| {
        let passes = Arc::clone(passes);
        move |pass| partition(BuildSource::Pass(Arc::clone(&passes), pass))
    };
    // Staging starts before the build side is on the device only where
    // passes are the way out should it not fit: DataFusion's operator, the
    // other, takes the probe input as read ahead and reads on itself.
    let finished = if pending.whole && join.definition.splits_into_passes() {
        let held = Arc::new(HeldProbe::new(inputs));
        let source = BuildSource::Preparing(pending.clone(), Arc::clone(&held));
        match join_probe_side(&partition(source), &mut probe, &mut output).await? {
            ProbeEnd::Joined(finished) => finished,
            ProbeEnd::Split(passes) => {
                let read = futures::stream::iter(held.take()?.into_iter().map(Ok));
                let probe = read.chain(probe).boxed();
                join_in_passes(inputs, probe_keys, &passes, probe, in_passes(&passes), &mut output).await?
            }
        }
    } else {
        match pending.placed().await?.as_ref() {
            CollectedBuild::Whole { side, .. } if join.definition.key_order.is_some() => {
                // Build-side rows included: nothing is left to finish.
                let partition = partition(BuildSource::Whole(Arc::clone(side)));
                return join_partition_in_key_order(&partition, side, probe, &mut output).await;
            }
            CollectedBuild::Whole { side, .. } => {
                let partition = partition(BuildSource::Whole(Arc::clone(side)));
                join_probe_side(&partition, &mut probe, &mut output).await?.joined()?
            }
            CollectedBuild::Passes { passes, .. } => {
                join_in_passes(inputs, probe_keys, passes, probe, in_passes(passes), &mut output).await?
            }
            CollectedBuild::OnCpu { join: shared, probe: slots, swappable, .. } => {
                let batches = match swappable {
                    Some(build) => smaller_side::join_on_cpu(join, build, probe, inputs, Some((shared, slots))).await?,
                    None => {
                        slots.put(inputs.partition, probe)?;
                        shared.execute(inputs.partition, Arc::clone(&inputs.context))?
                    }
                };
                let collected = pending.placed().await?;
                runner.finish_probe(inputs.mode);
                return hand_over(batches, collected, inputs, handover, &mut output).await;
            }
            CollectedBuild::OnCpuPartition { build, .. } => {
                let batches = smaller_side::join_on_cpu(join, build, probe, inputs, None).await?;
                let collected = pending.placed().await?;
                runner.finish_probe(inputs.mode);
                return hand_over(batches, collected, inputs, handover, &mut output).await;
            }
        }
    };
    if !finished {
        return Ok(());
    }
    // Also where no probe row needed it: an error placing the build side
    // reaches every partition.
    let collected = pending.placed().await?;
    let last = runner.finish_probe(inputs.mode);
    let emitted = match (collected.as_ref(), last) {
        (CollectedBuild::Whole { side, .. }, true) if join.definition.tracks_visited_build_rows() => {
            emit_build_side_rows(join, side, inputs, options, counters, &mut output).await
        }
        _ => Ok(()),
    };
    if last {
        // This partition's are the build side's last holders. Freeing it
        // on the worker took 3 to 4 ms after the last output of the
        // operator benchmark's join, before its stream could end
        // (docs/benchmarks.md).
        drop_off_the_workers((collected, pending, cell));
    }
    emitted
}

/// The build-side rows a join emits once every probe partition has
/// finished ([`finish_build_side`]), sent on by the last partition.
async fn emit_build_side_rows<B: JoinBackend>(
    join: &DeviceJoin<B>,
    build: &Arc<BuildSide<B>>,
    inputs: &PartitionInputs,
    options: &GpuJoinConfig,
    counters: &Arc<DeviceCounters>,
    output: &mut OutputSender<'_>,
) -> Result<()> {
    let backend = join.open_backend(Arc::clone(counters))?;
    let (build, definition, timers) = (Arc::clone(build), Arc::clone(&join.definition), inputs.metrics.phases.clone());
    let _permit = admitted(&inputs.metrics, join.admission().shared(options.concurrent_tasks)).await?;
    let _compute = inputs.metrics.baseline.elapsed_compute().timer();
    let rows =
        run_blocking("emitting build-side rows", move || finish_build_side(&backend, &definition, &build, &timers))
            .await?;
    if let Some(rows) = rows {
        output.send(rows).await?;
    }
    Ok(())
}

/// DataFusion's operator's output for the partition: handed over to the
/// partition's consumer, which reads it as it would under DataFusion's
/// plan; sent through the channel where the join has a `fetch` to count.
/// Its batches leave as they come where the join is the one DataFusion
/// planned (cut to `batch_size`), and otherwise in compacted slices of
/// `batch_size` (see `GpuJoinExec::reshaped`). The build side (and its
/// memory reservation) lives as long as the stream.
async fn hand_over<B: JoinBackend>(
    mut batches: SendableRecordBatchStream,
    collected: Arc<CollectedBuild<B>>,
    inputs: &PartitionInputs,
    handover: Handover,
    output: &mut OutputSender<'_>,
) -> Result<()> {
    if inputs.fetch.is_some() {
        let mut wanted = true;
        while let (true, Some(batch)) = (wanted, batches.next().await) {
            wanted = output.send(batch?).await?;
        }
        return Ok(());
    }
    let baseline = inputs.metrics.baseline.clone();
    let schema = batches.schema();
    let (batch_size, as_planned) = (inputs.context.session_config().batch_size().max(1), inputs.as_planned);
    // DataFusion's operator may emit more than `batch_size` rows at once (a
    // left join's unmatched build rows).
    let handed = batches.flat_map(move |batch| {
        let _build = &collected;
        let slices = match batch {
            Ok(batch) if as_planned => shared_slices(&batch, batch_size, &baseline).collect(),
            Ok(batch) => output_slices(&batch, batch_size, usize::MAX, &baseline).collect(),
            Err(e) => vec![Err(e)],
        };
        futures::stream::iter(slices)
    });
    // The consumer has gone (the query was cancelled): nothing to hand on.
    let _ = handover.send(Box::pin(RecordBatchStreamAdapter::new(schema, handed)));
    Ok(())
}

/// The partition's probe input, its rows counted as they are read.
fn probe_input(inputs: &PartitionInputs) -> Result<BoxStream<'static, Result<RecordBatch>>> {
    let rows = inputs.metrics.probe_rows.clone();
    Ok(inputs
        .right
        .execute(inputs.partition, Arc::clone(&inputs.context))?
        .inspect_ok(move |batch| rows.add(batch.num_rows()))
        .boxed())
}

/// How a partition's probe pipeline ended.
enum ProbeEnd<B: JoinBackend> {
    /// Every chunk joined; false when no more output is wanted.
    Joined(bool),
    /// The build side being prepared whole was split into passes instead;
    /// no chunk was joined.
    Split(Arc<BuildPasses<B>>),
}

impl<B: JoinBackend> ProbeEnd<B> {
    /// The end of a pipeline over a build side already placed.
    fn joined(self) -> Result<bool> {
        match self {
            ProbeEnd::Joined(finished) => Ok(finished),
            ProbeEnd::Split(_) => internal_err!("GPU join: a build side already placed was split into passes"),
        }
    }
}

/// Joins the probe side with a build side on the device, chunk by chunk:
/// the assembler, the loader and the joiner run side by side.
async fn join_probe_side<B: JoinBackend>(
    partition: &Partition<'_, B>,
    probe: &mut BoxStream<'_, Result<RecordBatch>>,
    output: &mut OutputSender<'_>,
) -> Result<ProbeEnd<B>> {
    let (assembled_tx, assembled_rx) = channel(1);
    let (chunk_tx, chunk_rx) = channel(1);
    let (assembled, loaded, joined) = futures::join!(
        assemble_chunks(partition, probe, assembled_tx),
        load_chunks(partition, assembled_rx, chunk_tx),
        join_chunks(partition, chunk_rx, output)
    );
    // The joiner's error explains the others' (a closed channel), not the
    // other way round; the loader's explains the assembler's, which stops
    // without one when the loader stops first.
    let finished = joined?;
    let split = loaded?;
    assembled?;
    Ok(match split {
        Some(passes) => ProbeEnd::Split(passes),
        None => ProbeEnd::Joined(finished),
    })
}

/// A partition's probe rows split by pass, held on the host (in
/// DataFusion's memory pool) until their pass is joined.
struct ProbeByPass {
    pieces: Vec<Vec<RecordBatch>>,
    reservation: MemoryReservation,
}

/// Reads the probe side and splits it into `passes` passes, batches
/// gathered into splits of [`SPLIT_ROWS`] rows.
async fn split_probe_by_pass(
    inputs: &PartitionInputs,
    probe_keys: &[PhysicalExprRef],
    passes: usize,
    mut probe: BoxStream<'_, Result<RecordBatch>>,
) -> Result<ProbeByPass> {
    let reservation =
        MemoryConsumer::new(format!("GpuJoinProbePasses[{}]", inputs.partition)).register(inputs.context.memory_pool());
    let mut pieces: Vec<Vec<RecordBatch>> = vec![vec![]; passes];
    let schema = inputs.right.schema();
    let mut split = |batches: &mut Vec<RecordBatch>| -> Result<()> {
        let by_pass = split_by_pass(&schema, batches, probe_keys, passes)?;
        for (pass, piece) in by_pass.into_iter().enumerate().filter(|(_, piece)| piece.num_rows() > 0) {
            reservation.try_grow(held_bytes(&piece))?;
            pieces[pass].push(piece);
        }
        reservation.shrink(batches.drain(..).map(|batch| held_bytes(&batch)).sum());
        Ok(())
    };
    let (mut unsplit, mut unsplit_rows) = (vec![], 0);
    while let Some(batch) = probe.next().await {
        let batch = batch?;
        reservation.try_grow(held_bytes(&batch))?;
        unsplit_rows += batch.num_rows();
        unsplit.push(batch);
        if unsplit_rows >= SPLIT_ROWS {
            split(&mut unsplit)?;
            unsplit_rows = 0;
        }
    }
    split(&mut unsplit)?;
    Ok(ProbeByPass { pieces, reservation })
}

/// Splits a partition's probe rows by pass, then joins them pass by pass,
/// a pass already on the device first. Every pass counts as needed by the
/// partition from the start, so that partitions still splitting do not see
/// the first passes evicted by those done. False when no more output is
/// wanted.
async fn join_in_passes<'a, B: JoinBackend>(
    inputs: &PartitionInputs,
    probe_keys: &[PhysicalExprRef],
    passes: &BuildPasses<B>,
    probe: BoxStream<'_, Result<RecordBatch>>,
    partition: impl Fn(usize) -> Partition<'a, B>,
    output: &mut OutputSender<'_>,
) -> Result<bool> {
    let mut to_join = passes.to_join();
    let ProbeByPass { mut pieces, reservation } =
        split_probe_by_pass(inputs, probe_keys, passes.count(), probe).await?;
    for pass in (0..pieces.len()).filter(|&pass| pieces[pass].is_empty()) {
        to_join.done(pass);
    }
    while let Some(pass) = to_join.next() {
        let batches = std::mem::take(&mut pieces[pass]);
        // The loader accounts for the batches from here on.
        reservation.shrink(batches.iter().map(held_bytes).sum());
        let mut probe = futures::stream::iter(batches.into_iter().map(Ok)).boxed();
        let finished = join_probe_side(&partition(pass), &mut probe, output).await?.joined()?;
        to_join.done(pass);
        if !finished {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Stages probe batches into chunks and assembles them on the host, one
/// ahead of the loader.
async fn assemble_chunks<B: JoinBackend>(
    partition: &Partition<'_, B>,
    probe: &mut BoxStream<'_, Result<RecordBatch>>,
    assembled_tx: Sender<(HostRows, ProbeColumns)>,
) -> Result<()> {
    let inputs = partition.inputs;
    // Only its transfer memory is used: no instance (stream) of its own.
    let backend = &partition.build_backend;
    let reservation =
        MemoryConsumer::new(format!("GpuJoinProbe[{}]", inputs.partition)).register(inputs.context.memory_pool());
    let chunk_rows = partition.options.probe_chunk_rows.clamp(1, MAX_RELATION_ROWS);
    let mut staging = ProbeStaging::new(inputs.right.schema(), chunk_rows);
    let probe_yield = &partition.join.probe_yield;
    let mut input_done = false;
    while !input_done {
        let chunks = match probe.next().await {
            Some(batch) => {
                let batch = batch?;
                partition.hold_probe(&batch)?;
                reservation.try_grow(held_bytes(&batch))?;
                staging.resize(probe_yield.chunk_rows(chunk_rows, MAX_CANDIDATES));
                staging.push(batch)
            }
            None => {
                input_done = true;
                staging.finish().into_iter().collect()
            }
        };
        for staged in chunks {
            if assembled_tx.is_closed() {
                // The loader has stopped: no use assembling more.
                return Ok(());
            }
            let chunk = assemble_chunk(partition, backend, staged).await?;
            reservation.resize(0);
            if assembled_tx.send(chunk).await.is_err() {
                // The loader has stopped: the joiner stopped, or it failed.
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Encodes and uploads assembled probe chunks, one ahead of the joiner.
/// Returns the passes a build side being prepared whole was split into
/// instead, if it was.
async fn load_chunks<B: JoinBackend>(
    partition: &Partition<'_, B>,
    mut assembled_rx: Receiver<(HostRows, ProbeColumns)>,
    chunk_tx: Sender<Chunk<B>>,
) -> Result<Option<Arc<BuildPasses<B>>>> {
    let backend = partition.open_backend()?;
    while let Some((chunk, columns)) = assembled_rx.recv().await {
        let (plan, build) = match partition.plan_now().await? {
            PlanNow::Ready(plan, build) => (plan, build),
            // Nothing is joined yet: the partition joins in passes instead.
            PlanNow::Split(passes) => return Ok(Some(passes)),
        };
        let (chunk, columns) = placed_as_measured(partition, chunk, columns).await?;
        let permit = partition.admitted().await?;
        let loaded = load_chunk(partition, &backend, &plan, chunk, columns).await?;
        // Neither is held while the joiner is busy: it may need the device
        // alone, or another pass of the build side.
        drop((permit, build));
        if chunk_tx.send(loaded).await.is_err() {
            // The joiner has stopped: fetch reached, cancelled, or failed.
            return Ok(None);
        }
    }
    // Chunks loaded by the plan of a build side split since were dropped
    // by the joiner: the partition joins them in passes too.
    partition.split_instead().await
}

/// Assembles a staged chunk on the host, in memory `backend` moves
/// without another copy: the output columns it will upload, where the
/// join's chunks so far had enough output rows per probe row to pay for
/// uploading them; none otherwise, which are placed after matching.
async fn assemble_chunk<B: JoinBackend>(
    partition: &Partition<'_, B>,
    backend: &B,
    staged: StagedChunk,
) -> Result<(HostRows, ProbeColumns)> {
    let _compute = partition.inputs.metrics.baseline.elapsed_compute().timer();
    let _staging = partition.inputs.metrics.probe_staging_time.timer();
    let (columns, to_device) = probe_columns(partition, backend);
    let backend = backend.clone();
    let rows = run_blocking("assembling a probe chunk", move || staged.assemble(&backend, &to_device)).await?;
    Ok((rows, columns))
}

/// How the next probe chunk's output columns are placed, and those of them
/// to assemble for the upload.
fn probe_columns<B: JoinBackend>(partition: &Partition<'_, B>, backend: &B) -> (ProbeColumns, Vec<usize>) {
    let definition = &partition.join.definition;
    match partition.join.probe_yield.columns_to_device(definition.probe_device_gather_ratio) {
        true => (
            ProbeColumns::Upload,
            columns_held(backend, &partition.inputs.right.schema(), &definition.probe_output_columns()),
        ),
        false => (ProbeColumns::AfterMatching, vec![]),
    }
}

/// A chunk assembled to be placed after matching, before the join had
/// measured enough output rows, as the chunks joined since have measured
/// them: its columns are assembled now, before it is loaded, so that their
/// upload overlaps the previous chunk's join rather than following its own
/// matching.
async fn placed_as_measured<B: JoinBackend>(
    partition: &Partition<'_, B>,
    chunk: HostRows,
    columns: ProbeColumns,
) -> Result<(HostRows, ProbeColumns)> {
    let backend = &partition.build_backend;
    let (ProbeColumns::AfterMatching, (ProbeColumns::Upload, to_device)) = (columns, probe_columns(partition, backend))
    else {
        return Ok((chunk, columns));
    };
    let _compute = partition.inputs.metrics.baseline.elapsed_compute().timer();
    let _staging = partition.inputs.metrics.probe_staging_time.timer();
    let backend = backend.clone();
    let rows = run_blocking("assembling a probe chunk", move || chunk.with_whole_columns(&backend, &to_device)).await?;
    Ok((rows, ProbeColumns::Upload))
}

/// Loads a probe chunk by `plan`, in one blocking job; a chunk that runs
/// out of device memory comes back not loaded.
async fn load_chunk<B: JoinBackend>(
    partition: &Partition<'_, B>,
    backend: &B,
    plan: &Arc<ProbePlan>,
    chunk: HostRows,
    columns: ProbeColumns,
) -> Result<Chunk<B>> {
    let inputs = partition.inputs;
    let _compute = inputs.metrics.baseline.elapsed_compute().timer();
    let (backend, definition, timers) =
        (backend.clone(), Arc::clone(&partition.join.definition), inputs.metrics.phases.clone());
    let plan = Arc::clone(plan);
    let batch_rows = inputs.context.session_config().batch_size().max(1);
    run_blocking("loading a probe chunk", move || {
        match load_probe_chunk(&backend, &definition, &plan, chunk.clone(), columns, batch_rows, &timers) {
            Ok(loaded) => Ok(Chunk::Loaded(loaded)),
            Err(e) if is_out_of_memory(&e) => Ok(Chunk::NotLoaded(chunk, e)),
            Err(e) => Err(e),
        }
    })
    .await
}

/// Joins loaded chunks and sends their output while the next one is
/// awaited and joined: a probe input that stalls does not hold back the
/// output of what it gave. False when no more output is wanted.
async fn join_chunks<B: JoinBackend>(
    partition: &Partition<'_, B>,
    mut chunk_rx: Receiver<Chunk<B>>,
    output: &mut OutputSender<'_>,
) -> Result<bool> {
    let backend = partition.open_backend()?;
    let mut previous: Vec<RecordBatch> = vec![];
    loop {
        // The build side is let go as soon as the chunk is joined, not
        // held while the output waits for its consumer.
        let next = async {
            let Some(chunk) = chunk_rx.recv().await else {
                return Ok(None);
            };
            match partition.build_now().await? {
                BuildNow::Ready(build) => join_chunk(partition, &backend, &build, chunk).await.map(Some),
                // Loaded while the build side was prepared whole, which was
                // split into passes instead: the loader says so once done.
                BuildNow::Split(_) => Ok(Some(ChunkJoined::Output(vec![]))),
            }
        };
        let (joined, sent) = futures::join!(next, output.send_all(std::mem::take(&mut previous)));
        if !sent? {
            return Ok(false);
        }
        match joined? {
            Some(ChunkJoined::Output(joined)) => previous = joined,
            Some(ChunkJoined::InPieces { rows, error, build }) => {
                if !join_in_pieces(partition, &backend, &build, rows, error, output).await? {
                    return Ok(false);
                }
            }
            None => return Ok(true),
        }
    }
}

/// What joining a probe chunk gave.
enum ChunkJoined<B: JoinBackend> {
    Output(Vec<RecordBatch>),
    /// Device memory ran out, or the chunk matched more pairs than one
    /// match call makes ([`MAX_CANDIDATES`]): its rows are to be joined
    /// again in pieces.
    InPieces {
        rows: HostRows,
        error: DataFusionError,
        build: Arc<BuildSide<B>>,
    },
}

/// The output of one chunk, joined on the device; or its rows, where it
/// must be joined in pieces (see [`join_in_pieces`]).
async fn join_chunk<B: JoinBackend>(
    partition: &Partition<'_, B>,
    backend: &B,
    build: &Arc<BuildSide<B>>,
    chunk: Chunk<B>,
) -> Result<ChunkJoined<B>> {
    let join = partition.join;
    let chunk = match chunk {
        // Loaded by the plan of a preparation since redone (alone on the
        // device): loaded again by this one's.
        Chunk::Loaded(loaded) if !loaded.loaded_for(build) => {
            let (rows, columns) = (loaded.chunk().clone(), loaded.columns());
            drop(loaded);
            let _permit = partition.admitted().await?;
            load_chunk(partition, backend, build.plan(), rows, columns).await?
        }
        chunk => chunk,
    };
    let (rows, error) = match chunk {
        Chunk::Loaded(loaded) => {
            let chunk = loaded.chunk().clone();
            let _permit = partition.admitted().await?;
            match join_loaded(partition, backend, build, loaded, Settle::ProbeChunk).await {
                Ok(joined) => {
                    let output_rows = joined.batches.iter().map(RecordBatch::num_rows).sum();
                    let passed_through = joined.probe_columns == ProbeOutput::PassedThrough;
                    join.probe_yield.record(chunk.rows(), output_rows, passed_through);
                    return Ok(ChunkJoined::Output(joined.batches));
                }
                Err(e) if is_out_of_memory(&e) => (chunk, e),
                Err(e) => return Err(e),
            }
        }
        Chunk::NotLoaded(chunk, error) => (chunk, error),
    };
    Ok(ChunkJoined::InPieces { rows, error, build: Arc::clone(build) })
}

/// Joins a chunk's rows alone on the device, then in halves, and below
/// [`SMALLEST_RETRY_ROWS`] by DataFusion's operator. Each piece's output is
/// sent before the next piece is joined, so that the output of a chunk of a
/// many-to-many join, which may be far larger than memory, is never held
/// whole. False when no more output is wanted.
async fn join_in_pieces<B: JoinBackend>(
    partition: &Partition<'_, B>,
    backend: &B,
    build: &Arc<BuildSide<B>>,
    rows: HostRows,
    error: DataFusionError,
    output: &mut OutputSender<'_>,
) -> Result<bool> {
    let join = partition.join;
    let batch = run_blocking("assembling a probe chunk to retry", move || rows.whole_batch()).await?;
    log::info!("gpu_join: retrying a probe chunk of {} rows alone on the device: {error}", batch.num_rows());
    let retries = &partition.inputs.metrics.out_of_memory_retries;
    retries.add(1);
    let mut pending = vec![batch];
    while let Some(piece) = pending.pop() {
        let permit = admitted(&partition.inputs.metrics, join.admission().exclusive()).await?;
        let rows = HostRows::whole(piece.clone());
        let error = match load_and_join(partition, backend, build, rows, ProbeColumns::Upload, Settle::ProbeChunk).await
        {
            Ok(batches) => {
                // The device is not held while the consumer takes the output.
                drop(permit);
                join.probe_yield.record(piece.num_rows(), batches.iter().map(RecordBatch::num_rows).sum(), false);
                if !output.send_all(batches).await? {
                    return Ok(false);
                }
                continue;
            }
            Err(e) if is_out_of_memory(&e) => e,
            Err(e) => return Err(e),
        };
        drop(permit);
        retries.add(1);
        let rows = piece.num_rows();
        if rows <= SMALLEST_RETRY_ROWS {
            let context = Arc::clone(&partition.inputs.context);
            let whole = Arc::clone(build);
            let host_build =
                run_blocking("assembling the build side for DataFusion's operator", move || whole.whole_batch())
                    .await?;
            let batches = join_chunk_on_cpu(&join.twin, &join.definition, &host_build, piece, context, error).await?;
            if !output.send_all(batches).await? {
                return Ok(false);
            }
        } else {
            // Halves in probe order: the later half is joined last.
            pending.push(piece.slice(rows / 2, rows - rows / 2));
            pending.push(piece.slice(0, rows / 2));
        }
    }
    Ok(true)
}

/// Loads `rows` and joins them, under whatever admission the caller holds;
/// an out-of-memory error from either step comes back as it is.
async fn load_and_join<B: JoinBackend>(
    partition: &Partition<'_, B>,
    backend: &B,
    build: &Arc<BuildSide<B>>,
    rows: HostRows,
    columns: ProbeColumns,
    settle: Settle,
) -> Result<Vec<RecordBatch>> {
    match load_chunk(partition, backend, build.plan(), rows, columns).await? {
        Chunk::Loaded(loaded) => Ok(join_loaded(partition, backend, build, loaded, settle).await?.batches),
        Chunk::NotLoaded(_, error) => Err(error),
    }
}

async fn join_loaded<B: JoinBackend>(
    partition: &Partition<'_, B>,
    backend: &B,
    build: &Arc<BuildSide<B>>,
    loaded: LoadedChunk<B>,
    settle: Settle,
) -> Result<JoinedChunk> {
    let inputs = partition.inputs;
    let (backend, definition, timers) =
        (backend.clone(), Arc::clone(&partition.join.definition), inputs.metrics.phases.clone());
    let build = Arc::clone(build);
    let _compute = inputs.metrics.baseline.elapsed_compute().timer();
    let joined = run_blocking("joining a probe chunk", move || {
        join_loaded_chunk(&backend, &definition, &build, loaded, &timers, settle)
    })
    .await?;
    match joined.probe_columns {
        ProbeOutput::TakenOnHost => inputs.metrics.probe_chunks_on_host.add(1),
        ProbeOutput::PassedThrough => inputs.metrics.probe_chunks_passed_through.add(1),
        ProbeOutput::Gathered => {}
    }
    Ok(joined)
}

/// Joins the whole probe side of a partition as one chunk and sends every
/// output row of the partition in key order (see
/// [`crate::algorithms::KeyOrder`]). A partition that runs out of device
/// memory, even alone on the device, is joined by DataFusion's operator
/// and sorted.
async fn join_partition_in_key_order<B: JoinBackend>(
    partition: &Partition<'_, B>,
    build: &Arc<BuildSide<B>>,
    mut probe: BoxStream<'_, Result<RecordBatch>>,
    output: &mut OutputSender<'_>,
) -> Result<()> {
    let inputs = partition.inputs;
    let reservation =
        MemoryConsumer::new(format!("GpuJoinProbe[{}]", inputs.partition)).register(inputs.context.memory_pool());
    let mut staging = ProbeStaging::new(inputs.right.schema(), usize::MAX);
    while let Some(batch) = probe.next().await {
        let batch = batch?;
        reservation.try_grow(held_bytes(&batch))?;
        if !staging.push(batch).is_empty() {
            return internal_err!("GPU join: a probe side of more than {} rows", usize::MAX);
        }
    }
    let (chunk, columns) = match staging.finish() {
        Some(staged) => assemble_chunk(partition, &partition.build_backend, staged).await?,
        None => (HostRows::whole(RecordBatch::new_empty(inputs.right.schema())), ProbeColumns::Upload),
    };
    let backend = partition.open_backend()?;
    let mut error = None;
    // Beside other jobs first, then alone on the device.
    for exclusive in [false, true] {
        let _permit = match exclusive {
            false => partition.admitted().await?,
            true => admitted(&inputs.metrics, partition.join.admission().exclusive()).await?,
        };
        match load_and_join(partition, &backend, build, chunk.clone(), columns, Settle::KeyOrder).await {
            Ok(batches) => {
                output.send_all(batches).await?;
                return Ok(());
            }
            Err(e) if is_out_of_memory(&e) => {
                log::info!(
                    "gpu_join: a probe side of {} rows in key order ran out of device memory: {e}",
                    chunk.rows()
                );
                inputs.metrics.out_of_memory_retries.add(1);
                error = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    let error = error.ok_or_else(|| internal_datafusion_err!("GPU join: no attempt joined the probe side"))?;
    let (build, context) = (Arc::clone(build), Arc::clone(&inputs.context));
    let (build, probe) = run_blocking("assembling both sides for DataFusion's operator", move || {
        Ok((build.whole_batch()?, chunk.whole_batch()?))
    })
    .await?;
    let join = partition.join;
    let batches = join_partition_on_cpu(&join.twin, &join.definition, &build, probe, context, error).await?;
    output.send_all(batches).await?;
    Ok(())
}

/// An output batch as the partition's consumer gets it: its first `limit`
/// rows in slices of at most `batch_size`, made one at a time, each over
/// its own memory (a slice of a chunk would count the whole chunk's
/// memory) and counted in `baseline`.
fn output_slices<'a>(
    batch: &'a RecordBatch,
    batch_size: usize,
    limit: usize,
    baseline: &'a BaselineMetrics,
) -> impl Iterator<Item = Result<RecordBatch>> + 'a {
    let end = batch.num_rows().min(limit);
    (0..end).step_by(batch_size).map(move |offset| {
        let len = batch_size.min(end - offset);
        let slice = match len == batch.num_rows() {
            true => compacted(batch)?,
            false => owned_slice(batch, offset, len)?,
        };
        Ok(slice.record_output(baseline))
    })
}

/// `batch`'s rows in slices of at most `batch_size` rows over its buffers,
/// each recorded as output: `batch` itself where it is no larger.
fn shared_slices<'a>(
    batch: &'a RecordBatch,
    batch_size: usize,
    baseline: &'a BaselineMetrics,
) -> impl Iterator<Item = Result<RecordBatch>> + 'a {
    let rows = batch.num_rows();
    (0..rows).step_by(batch_size).map(move |offset| {
        let slice = match rows <= batch_size {
            true => batch.clone(),
            false => batch.slice(offset, batch_size.min(rows - offset)),
        };
        Ok(slice.record_output(baseline))
    })
}

/// Sends output in `batch_size` slices and stops at the join's `fetch`.
struct OutputSender<'a> {
    tx: &'a Sender<Result<RecordBatch>>,
    batch_size: usize,
    remaining: Option<usize>,
    inputs: &'a PartitionInputs,
}

impl<'a> OutputSender<'a> {
    fn new(tx: &'a Sender<Result<RecordBatch>>, inputs: &'a PartitionInputs) -> Self {
        let batch_size = inputs.context.session_config().batch_size().max(1);
        Self { tx, batch_size, remaining: inputs.fetch, inputs }
    }

    async fn send_all(&mut self, batches: Vec<RecordBatch>) -> Result<bool> {
        for batch in batches {
            if !self.send(batch).await? {
                return Ok(false);
            }
        }
        Ok(self.remaining != Some(0))
    }

    /// False once no more output is wanted: the fetch is reached or the
    /// consumer has gone (the query was cancelled).
    async fn send(&mut self, batch: RecordBatch) -> Result<bool> {
        let limit = self.remaining.unwrap_or(usize::MAX);
        for slice in output_slices(&batch, self.batch_size, limit, &self.inputs.metrics.baseline) {
            let slice = slice?;
            if let Some(remaining) = self.remaining.as_mut() {
                *remaining -= slice.num_rows();
            }
            if self.tx.send(Ok(slice)).await.is_err() {
                return Ok(false);
            }
        }
        Ok(self.remaining != Some(0))
    }
}
