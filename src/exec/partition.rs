//! One output partition of a GPU join, from its build side's collection to
//! its last output batch, as an explicit state machine.
//!
//! ```text
//!  CollectBuild ──► ProbeWhilePreparing ──(every chunk joined)─────────────► FinishBuildSide ──► Done
//!       │                  │                                                      ▲
//!       │                  └──(split into passes after all)──► ProbeInPasses ─────┤
//!       │                                                           ▲             │
//!       └──► Placed ──(split into passes)───────────────────────────┘             │
//!               ├──(whole)─────────────────────────────────► ProbeWhole ──────────┘
//!               ├──(whole, output in key order)────────────► ProbeInKeyOrder ────────────────► Done
//!               └──(DataFusion's operator joins it)────────► OnDataFusion ───────────────────► Done
//!
//!  any state ──(no more output wanted: the fetch is reached, or the consumer has gone)──► Done
//! ```
//!
//! - **CollectBuild**: the build side is collected, by this partition or by
//!   the one that collects the build side all partitions share; probe rows
//!   are read ahead meanwhile where that pays ([`read_ahead_while`]).
//! - **ProbeWhilePreparing**: a build side estimated to fit the device is
//!   being prepared whole, in a join that could be split into passes should
//!   it not fit after all. The probe stages start at once: chunks are
//!   staged and assembled while it is prepared, and the probe rows read so
//!   far are held, so that none is lost if it is split instead.
//! - **Placed**: the build side is placed; what it became decides the way.
//! - **ProbeWhole**, **ProbeInPasses**: the probe stages
//!   ([`super::probe_stages`]) join the probe side with the whole build
//!   side, or pass by pass with a build side split by key hash.
//! - **ProbeInKeyOrder**: the whole probe side as one chunk, every output
//!   row, build-side rows included, in key order ([`super::in_key_order`]).
//! - **OnDataFusion**: DataFusion's operator joins the build side's host
//!   copy, and its stream is handed over to the partition's consumer.
//! - **FinishBuildSide**: every probe row of the partition is joined; the
//!   last partition to get here emits the build-side rows the join owes
//!   (unmatched, semi, anti, mark) and lets go of the build side.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use arrow::record_batch::RecordBatch;
use datafusion::common::internal_err;
use datafusion::error::Result;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::joins::PartitionMode;
use datafusion::physical_plan::stream::RecordBatchReceiverStreamBuilder;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use tokio::sync::mpsc::Sender;
use tokio::sync::oneshot;

use super::build::{CollectedBuild, PendingBuild, SharedCollection};
use super::device_build::DeviceBuild;
use super::device_join::DeviceJoin;
use super::fallback::context_for;
use super::filters_from_above::reduced;
use super::handoff::{DataFusionJoin, HandedOver, Handover, hand_over};
use super::in_key_order::join_partition_in_key_order;
use super::inputs::PartitionInputs;
use super::metrics::GpuJoinMetrics;
use super::output::OutputSender;
use super::passes::{BuildPasses, ProbeByPass, split_probe_by_pass};
use super::probe_stages::{ProbeEnd, join_probe_side};
use super::probing::{BuildSource, HeldProbe, Probing};
use super::read_ahead::{read_ahead_while, worth_reading_ahead};
use super::runner::{BuildCell, JoinRunner, Runner};
use super::runtime::{CancelOnDrop, admitted, drop_off_the_workers, run_blocking};
use super::smaller_side;
use super::staging::held_bytes;
use crate::algorithms::finish_build_side;
use crate::backend::{DeviceCounters, JoinBackend};
use crate::config::GpuJoinConfig;
use crate::testing::InjectedAllocationFailures;

/// A partition's probe input, as read so far.
type ProbeInput = BoxStream<'static, Result<RecordBatch>>;

/// Where one output partition stands; see the module's diagram.
enum PartitionState<B: JoinBackend> {
    CollectBuild,
    ProbeWhilePreparing(PendingBuild<B>, ProbeInput),
    Placed(PendingBuild<B>, ProbeInput),
    ProbeWhole(PendingBuild<B>, Arc<DeviceBuild<B>>, ProbeInput),
    ProbeInKeyOrder(Arc<DeviceBuild<B>>, ProbeInput),
    ProbeInPasses(PendingBuild<B>, Arc<BuildPasses<B>>, ProbeInput),
    OnDataFusion(PendingBuild<B>, ProbeInput),
    FinishBuildSide(PendingBuild<B>),
    Done,
}

impl<B: JoinBackend> JoinRunner for Runner<B> {
    fn execute(self: Arc<Self>, inputs: PartitionInputs) -> Result<SendableRecordBatchStream> {
        self.execute_sharing(inputs, None)
    }
}

impl<B: JoinBackend> Runner<B> {
    /// Runs one output partition; `shared`: the collection of the one
    /// build side that the devices of a `CollectLeft` join spread over
    /// share ([`super::spread`]).
    pub(super) fn execute_sharing(
        self: Arc<Self>,
        inputs: PartitionInputs,
        shared: Option<Arc<SharedCollection<B>>>,
    ) -> Result<SendableRecordBatchStream> {
        let schema = Arc::clone(&self.join.definition.output_schema);
        let mut builder = RecordBatchReceiverStreamBuilder::new(schema, 2);
        let tx = builder.tx();
        let (handover, handed) = oneshot::channel();
        builder.spawn(async move { run_partition(self, inputs, shared, tx, handover).await });
        Ok(Box::pin(HandedOver::new(builder.build(), handed)))
    }
}

/// Runs one output partition on its own task, its output sent to `tx` or
/// handed over whole through `handover`.
async fn run_partition<B: JoinBackend>(
    runner: Arc<Runner<B>>,
    inputs: PartitionInputs,
    shared: Option<Arc<SharedCollection<B>>>,
    tx: Sender<Result<RecordBatch>>,
    handover: Handover,
) -> Result<()> {
    let options = GpuJoinConfig::from_config(inputs.context.session_config().options());
    // Injected failures hit probe chunks; the build side's preparation has
    // its own (see `super::build`).
    let (counters, build_counters) = (Arc::new(DeviceCounters::default()), Arc::new(DeviceCounters::default()));
    counters.inject_allocation_failures(0, InjectedAllocationFailures::of(inputs.context.session_config()).probe);
    let _cancel = (CancelOnDrop(Arc::clone(&counters)), CancelOnDrop(Arc::clone(&build_counters)));
    let driven = async {
        let driver = PartitionDriver {
            runner: &runner,
            build_backend: runner.join.open_backend(Arc::clone(&build_counters))?,
            cell: runner.build_cell(inputs.mode)?,
            shared,
            inputs: &inputs,
            options: &options,
            counters: &counters,
            handover: Some(handover),
        };
        driver.run(&mut OutputSender::new(&tx, &inputs)).await
    };
    let result = driven.await;
    inputs.metrics.record_device(&counters);
    inputs.metrics.record_device(&build_counters);
    inputs.metrics.done();
    // The plan's inputs first, so that the runner holds what is left of it.
    drop(inputs);
    Runner::release(runner);
    result
}

/// What one output partition works with while it moves from state to state.
struct PartitionDriver<'a, B: JoinBackend> {
    runner: &'a Arc<Runner<B>>,
    inputs: &'a PartitionInputs,
    options: &'a GpuJoinConfig,
    /// Counters of the probe-chunk instances.
    counters: &'a Arc<DeviceCounters>,
    /// The instance that prepares passes of the build side this partition
    /// is the first to need, and stages probe chunks.
    build_backend: B,
    /// Where the build side will be: shared by every partition in
    /// `CollectLeft` mode, the partition's own otherwise.
    cell: BuildCell<B>,
    /// The collection of a build side the join's devices share.
    shared: Option<Arc<SharedCollection<B>>>,
    /// `None` once a stream is handed over.
    handover: Option<Handover>,
}

impl<'a, B: JoinBackend> PartitionDriver<'a, B> {
    /// Moves from state to state until the partition is done.
    async fn run(mut self, output: &mut OutputSender<'_>) -> Result<()> {
        let mut state = PartitionState::CollectBuild;
        loop {
            state = match state {
                PartitionState::CollectBuild => self.collect_build().await?,
                PartitionState::ProbeWhilePreparing(pending, probe) => {
                    self.probe_while_preparing(pending, probe, output).await?
                }
                PartitionState::Placed(pending, probe) => self.placed(pending, probe).await?,
                PartitionState::ProbeWhole(pending, build, probe) => {
                    self.probe_whole(pending, build, probe, output).await?
                }
                PartitionState::ProbeInKeyOrder(build, probe) => self.probe_in_key_order(build, probe, output).await?,
                PartitionState::ProbeInPasses(pending, passes, probe) => {
                    self.probe_in_passes(pending, passes, probe, output).await?
                }
                PartitionState::OnDataFusion(pending, probe) => self.on_datafusion(pending, probe, output).await?,
                PartitionState::FinishBuildSide(pending) => self.finish_build_side(pending, output).await?,
                PartitionState::Done => return Ok(()),
            }
        }
    }

    fn join(&self) -> &'a DeviceJoin<B> {
        self.runner.join.as_ref()
    }

    fn probing(&self, build: BuildSource<B>) -> Probing<'a, B> {
        Probing {
            join: self.join(),
            build,
            build_backend: self.build_backend.clone(),
            inputs: self.inputs,
            options: self.options,
            counters: self.counters,
        }
    }

    /// As [`Self::probing`], on `other`, another of the join's devices,
    /// whose instances count in `elsewhere`.
    fn probing_on<'b>(
        &self,
        other: &'b DeviceJoin<B>,
        elsewhere: &'b mut Elsewhere<B>,
        build: BuildSource<B>,
    ) -> Result<Probing<'b, B>>
    where
        'a: 'b,
    {
        let (counters, build_backend) = elsewhere.on(other)?;
        Ok(Probing { join: other, build, build_backend, inputs: self.inputs, options: self.options, counters })
    }

    /// Collects the build side, reading the probe side ahead where that
    /// pays: only for a build side that may still go to DataFusion's
    /// operator. A larger one goes to the device, which waits for its
    /// collection, and the probe scan would slow it. Nor in `Partitioned`
    /// mode, where the probe input is a hash repartition of every probe
    /// partition: reading it runs the whole probe side's scan beside the
    /// build side's (TPC-H Q12 at SF 10). Nor where the probe scan reads a
    /// dynamic filter: rows read before the build side is in are rows the
    /// filter could have dropped. Nor where the probe input is batches in
    /// memory, with nothing to hide.
    async fn collect_build(&mut self) -> Result<PartitionState<B>> {
        let (inputs, options) = (self.inputs, self.options);
        let ahead = MemoryConsumer::new(format!("GpuJoinProbeAhead[{}]", inputs.partition))
            .register(inputs.context.memory_pool());
        let collected = self.runner.pending_build(&self.cell, inputs, options, self.shared.as_ref());
        let (rows_in, min_build_rows) = (Arc::clone(&self.cell.rows_in), options.min_build_rows);
        let small_so_far = move || rows_in.load(Ordering::Relaxed) < min_build_rows;
        let read_ahead_rows = match (inputs.mode, &inputs.probe_filter) {
            (PartitionMode::CollectLeft, None) if worth_reading_ahead(&inputs.right) => options.probe_read_ahead_rows,
            _ => 0,
        };
        let (pending, probe) =
            read_ahead_while(probe_input(inputs)?, collected, read_ahead_rows, small_so_far, ahead).await;
        let pending = pending?;
        if let Some(filter) = &inputs.probe_filter {
            filter.complete().await;
        }
        // Staging starts before the build side is on the device only where
        // passes are the way out should it not fit: DataFusion's operator,
        // the other, takes the probe input as read ahead and reads on itself.
        Ok(match pending.whole && self.join().definition.splits_into_passes() {
            true => PartitionState::ProbeWhilePreparing(pending, joined_probe(inputs, probe, true)),
            false => PartitionState::Placed(pending, probe),
        })
    }

    async fn probe_while_preparing(
        &self,
        pending: PendingBuild<B>,
        mut probe: ProbeInput,
        output: &mut OutputSender<'_>,
    ) -> Result<PartitionState<B>> {
        let held = Arc::new(HeldProbe::new(self.inputs));
        let probing = self.probing(BuildSource::Preparing(pending.clone(), Arc::clone(&held)));
        Ok(match join_probe_side(&probing, &mut probe, output).await? {
            ProbeEnd::Joined(true) => PartitionState::FinishBuildSide(pending),
            ProbeEnd::Joined(false) => PartitionState::Done,
            ProbeEnd::SplitIntoPasses(passes) => {
                let read = futures::stream::iter(held.take()?.into_iter().map(Ok));
                PartitionState::ProbeInPasses(pending, passes, read.chain(probe).boxed())
            }
        })
    }

    async fn placed(&self, pending: PendingBuild<B>, probe: ProbeInput) -> Result<PartitionState<B>> {
        let collected = pending.placed().await?;
        let in_key_order = self.join().definition.key_order.is_some();
        let probe = joined_probe(self.inputs, probe, collected.on_device());
        Ok(match collected.as_ref() {
            CollectedBuild::Whole { side, .. } if in_key_order => {
                PartitionState::ProbeInKeyOrder(Arc::clone(side), probe)
            }
            CollectedBuild::Whole { side, .. } => PartitionState::ProbeWhole(pending, Arc::clone(side), probe),
            CollectedBuild::Passes { passes, .. } => PartitionState::ProbeInPasses(pending, Arc::clone(passes), probe),
            CollectedBuild::OnCpu { .. } | CollectedBuild::OnCpuPartition { .. } => {
                PartitionState::OnDataFusion(pending, probe)
            }
        })
    }

    async fn probe_whole(
        &self,
        pending: PendingBuild<B>,
        build: Arc<DeviceBuild<B>>,
        mut probe: ProbeInput,
        output: &mut OutputSender<'_>,
    ) -> Result<PartitionState<B>> {
        let probing = self.probing(BuildSource::Whole(build));
        Ok(match join_probe_side(&probing, &mut probe, output).await?.joined()? {
            true => PartitionState::FinishBuildSide(pending),
            false => PartitionState::Done,
        })
    }

    /// Build-side rows included: nothing is left to finish.
    async fn probe_in_key_order(
        &self,
        build: Arc<DeviceBuild<B>>,
        probe: ProbeInput,
        output: &mut OutputSender<'_>,
    ) -> Result<PartitionState<B>> {
        let probing = self.probing(BuildSource::Whole(Arc::clone(&build)));
        join_partition_in_key_order(&probing, &build, probe, output).await?;
        Ok(PartitionState::Done)
    }

    /// Splits the partition's probe rows by pass, then joins them pass by
    /// pass, a pass already on its device first, each on the device that
    /// holds it (another of the join's devices where the build side is
    /// split over them). Every pass counts as needed by the partition from
    /// the start, so that partitions still splitting do not see the first
    /// passes evicted by those done.
    async fn probe_in_passes(
        &self,
        pending: PendingBuild<B>,
        passes: Arc<BuildPasses<B>>,
        probe: ProbeInput,
        output: &mut OutputSender<'_>,
    ) -> Result<PartitionState<B>> {
        let probe_keys = &self.join().definition.probe_keys;
        let mut to_join = passes.to_join();
        let ProbeByPass { mut pieces, reservation } =
            split_probe_by_pass(self.inputs, probe_keys, passes.count(), probe).await?;
        for pass in (0..pieces.len()).filter(|&pass| pieces[pass].is_empty()) {
            to_join.done(pass);
        }
        let mut elsewhere = Elsewhere::default();
        let joined = async {
            while let Some(pass) = to_join.next() {
                let batches = std::mem::take(&mut pieces[pass]);
                // The probe stages account for the batches from here on.
                reservation.shrink(batches.iter().map(held_bytes).sum());
                let mut probe = futures::stream::iter(batches.into_iter().map(Ok)).boxed();
                let finished = self.join_pass(&passes, pass, &mut probe, &mut elsewhere, output).await?;
                to_join.done(pass);
                if !finished {
                    return Ok(false);
                }
            }
            Ok(true)
        };
        let joined: Result<bool> = joined.await;
        // Wherever it ended, as the partition's own device's counters are.
        elsewhere.record(&self.inputs.metrics);
        Ok(match joined? {
            true => PartitionState::FinishBuildSide(pending),
            false => PartitionState::Done,
        })
    }

    /// Joins `probe`, the partition's rows of pass `pass`, on the device
    /// holding the pass; on another of the join's devices, whose share of
    /// the metrics gets the output rows and the time. False where no more
    /// output is wanted.
    async fn join_pass(
        &self,
        passes: &Arc<BuildPasses<B>>,
        pass: usize,
        probe: &mut ProbeInput,
        elsewhere: &mut Elsewhere<B>,
        output: &mut OutputSender<'_>,
    ) -> Result<bool> {
        let build = BuildSource::Pass(Arc::clone(passes), pass);
        let device = passes.device_of(pass)?;
        if device.index == self.join().index {
            return join_probe_side(&self.probing(build), probe, output).await?.joined();
        }
        let (metrics, baseline) = (&self.inputs.metrics, &self.inputs.metrics.baseline);
        let (rows, time) = (baseline.output_rows().value(), baseline.elapsed_compute().value());
        let finished = join_probe_side(&self.probing_on(device, elsewhere, build)?, probe, output).await?.joined()?;
        let rows = baseline.output_rows().value().saturating_sub(rows);
        let time = Duration::from_nanos(baseline.elapsed_compute().value().saturating_sub(time) as u64);
        metrics.credit(device.index, rows, time);
        Ok(finished)
    }

    /// DataFusion's operator joins the build side's host copy with the
    /// probe input; its output stream is handed over.
    async fn on_datafusion(
        &mut self,
        pending: PendingBuild<B>,
        probe: ProbeInput,
        output: &mut OutputSender<'_>,
    ) -> Result<PartitionState<B>> {
        let (join, inputs) = (self.join(), self.inputs);
        let collected = pending.placed().await?;
        let (batches, plan) = match collected.as_ref() {
            CollectedBuild::OnCpu { join: shared, swappable, .. } => match swappable {
                Some(build) => smaller_side::join_on_cpu(join, build, probe, inputs, Some(shared)).await?,
                None => (
                    shared.execute(inputs.partition, probe, context_for(&join.definition, &inputs.context))?,
                    Arc::clone(shared.plan()),
                ),
            },
            CollectedBuild::OnCpuPartition { build, .. } => {
                smaller_side::join_on_cpu(join, build, probe, inputs, None).await?
            }
            CollectedBuild::Whole { .. } | CollectedBuild::Passes { .. } => {
                return internal_err!("GPU join: a build side on the device was handed to DataFusion's operator");
            }
        };
        self.runner.finish_probe(inputs.mode);
        if let Some(handover) = self.handover.take() {
            hand_over(DataFusionJoin { batches, plan }, collected, inputs, handover, output).await?;
        }
        Ok(PartitionState::Done)
    }

    /// Also where no probe row needed the build side: an error placing it
    /// reaches every partition.
    async fn finish_build_side(
        &mut self,
        pending: PendingBuild<B>,
        output: &mut OutputSender<'_>,
    ) -> Result<PartitionState<B>> {
        let collected = pending.placed().await?;
        let last = self.runner.finish_probe(self.inputs.mode);
        let emitted = match (collected.as_ref(), last) {
            (CollectedBuild::Whole { side, .. }, true) if self.join().definition.tracks_visited_build_rows() => {
                self.emit_build_side_rows(side, output).await
            }
            _ => Ok(()),
        };
        if last {
            // This partition's are the build side's last holders. Freeing it
            // on the worker took 3 to 4 ms after the last output of the
            // operator benchmark's join, before its stream could end.
            drop_off_the_workers((collected, pending, std::mem::take(&mut self.cell)));
        }
        emitted.map(|()| PartitionState::Done)
    }

    /// The build-side rows the join emits once every probe partition has
    /// finished ([`finish_build_side`]).
    async fn emit_build_side_rows(&self, build: &Arc<DeviceBuild<B>>, output: &mut OutputSender<'_>) -> Result<()> {
        let (join, inputs) = (self.join(), self.inputs);
        let backend = join.open_backend(Arc::clone(self.counters))?;
        let (build, definition, timers) =
            (Arc::clone(build), Arc::clone(&join.definition), inputs.metrics.phases.clone());
        let limits = inputs.output_limits();
        let permit = admitted(&inputs.metrics, join.admission().shared(self.options.concurrent_tasks)).await?;
        let compute = inputs.metrics.baseline.elapsed_compute().timer();
        // The device is let go once its part is done, and not held while
        // the consumer takes the output.
        let batches = run_blocking("emitting build-side rows", move || {
            finish_build_side(&backend, &definition, &build, &timers, limits, permit)
        })
        .await?;
        drop(compute);
        output.send_all(batches).await?;
        Ok(())
    }
}

/// The instances a partition opened on the join's other devices, for the
/// passes they hold, each device's with counters of its own.
struct Elsewhere<B: JoinBackend> {
    devices: Vec<(usize, Arc<DeviceCounters>, B, CancelOnDrop)>,
}

impl<B: JoinBackend> Default for Elsewhere<B> {
    fn default() -> Self {
        Self { devices: vec![] }
    }
}

impl<B: JoinBackend> Elsewhere<B> {
    /// The counters and build-side instance on `device`, opened when first
    /// asked for.
    fn on(&mut self, device: &DeviceJoin<B>) -> Result<(&Arc<DeviceCounters>, B)> {
        let at = match self.devices.iter().position(|(index, ..)| *index == device.index) {
            Some(at) => at,
            None => {
                let counters = Arc::new(DeviceCounters::default());
                let backend = device.open_backend(Arc::clone(&counters))?;
                let cancel = CancelOnDrop(Arc::clone(&counters));
                self.devices.push((device.index, counters, backend, cancel));
                self.devices.len() - 1
            }
        };
        let (_, counters, backend, _) = &self.devices[at];
        Ok((counters, backend.clone()))
    }

    /// Adds what each device counted to its share of the partition's
    /// metrics.
    fn record(&self, metrics: &GpuJoinMetrics) {
        for (index, counters, ..) in &self.devices {
            metrics.record_device_on(*index, counters);
        }
    }
}

/// The partition's probe input, as it is read.
fn probe_input(inputs: &PartitionInputs) -> Result<ProbeInput> {
    Ok(inputs.right.execute(inputs.partition, Arc::clone(&inputs.context))?.boxed())
}

/// `probe`, the rows the partition joins, counted as they come: where it
/// joins them on the device, less those the filters of joins above drop.
/// DataFusion's operator joins them as read. Its probe of a build side
/// that small costs about what checking each row against the joins above
/// costs, and it drops the rows it cannot match by itself; the check pays
/// where it spares the device join its per-row work (the upload, the
/// takes). In TPC-DS Q83 at SF 100, checking the 27.8 M string keys of
/// `store_returns ⋈ item` took 3.2 s summed over partitions, ahead of a
/// semi join with 21 build rows on DataFusion's operator, and made the
/// query 1.6 times DataFusion's time.
fn joined_probe(inputs: &PartitionInputs, probe: ProbeInput, on_device: bool) -> ProbeInput {
    let rows = inputs.metrics.probe_rows.clone();
    let reduction = inputs.reductions.probe.clone().filter(|_| on_device);
    let (dropped, compute) =
        (inputs.metrics.rows_filtered_from_above.clone(), inputs.metrics.baseline.elapsed_compute().clone());
    reduced(probe, reduction, dropped, compute).inspect_ok(move |batch| rows.add(batch.num_rows())).boxed()
}
