//! The build side of a join: collected once from its input, then placed by
//! a task of its own, so that probe partitions stage their first chunks
//! while it is prepared on the device, and load them once its host work is
//! done (see [`prepare_build_side`]), while it is transformed.
//!
//! A build side estimated to fit the device is prepared whole; a larger one
//! is split into passes ([`super::passes`]), or, for a join that cannot be
//! split, handed with the probe side to DataFusion's operator. One that was
//! estimated to fit and still runs out of memory, even alone on the device,
//! is split then. A build side that, as collected, makes the join smaller
//! than `gpu_join.min_rows` also goes to DataFusion's operator: the plan's
//! statistics, which passed it, were only an estimate. So does a build side
//! (a partition's, in `Partitioned` mode) with fewer rows than
//! `gpu_join.min_build_rows`, whose hash table DataFusion probes from the
//! CPU's caches faster than the probe side crosses PCIe; a probe partition
//! that turns out the smaller side builds that table instead
//! ([`super::smaller_side`]).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use arrow::datatypes::{Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::{JoinSide, exec_datafusion_err};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::joins::PartitionMode;
use datafusion::physical_plan::metrics::Time;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, StreamExt};
use tokio::sync::watch;

use super::device_build::DeviceBuild;
use super::device_join::DeviceJoin;
use super::fallback::{concatenated_last_first, hash_join_over, in_key_order};
use super::filters_from_above::RowReduction;
use super::inputs::PartitionInputs;
use super::metrics::GpuJoinMetrics;
use super::passes::{BuildPasses, pass_count, split_into_passes};
use super::probe_filter::ProbeFilter;
use super::read_ahead::SlotJoin;
use super::runtime::{CancelOnDrop, admitted, is_out_of_memory, run_blocking};
use super::smaller_side::{SwappableBuild, may_swap_sides};
use super::staging::assemble_rows;
use crate::algorithms::{
    BuildSide, CollectedKeys, HostRows, JoinDefinition, ProbePlan, choice, columns_held, evaluate_keys,
    prepare_build_side,
};
use crate::arrays::PARALLEL_CONCAT_ROWS;
use crate::backend::{DeviceCounters, JoinBackend};
use crate::config::GpuJoinConfig;
use crate::keys::{KeyEncoder, KeyRanges};
use crate::testing::InjectedAllocationFailures;

/// What a build side became once placed.
pub(crate) enum CollectedBuild<B: JoinBackend> {
    /// Prepared on the device in one piece.
    Whole { side: Arc<DeviceBuild<B>>, _reservation: Arc<MemoryReservation> },
    /// Split into passes, each prepared when partitions need it.
    Passes { passes: Arc<BuildPasses<B>>, _reservation: Arc<MemoryReservation> },
    /// Too small for the device to win, or too large for it in a join that
    /// cannot be split: DataFusion's operator joins each probe partition
    /// with the build side's host copy, reading the probe partition from
    /// `probe`.
    /// `swappable` where a probe partition smaller than the build side may
    /// build the hash table instead ([`super::smaller_side`]).
    OnCpu { join: SlotJoin, swappable: Option<SwappableBuild>, _reservation: Arc<MemoryReservation> },
    /// A partition's own build side (`Partitioned` mode) too small for the
    /// device to win, as collected: DataFusion's operator joins it with the
    /// partition's probe rows, the smaller side building the hash table
    /// ([`super::smaller_side`]).
    OnCpuPartition { build: SwappableBuild, _reservation: Arc<MemoryReservation> },
}

impl<B: JoinBackend> CollectedBuild<B> {
    /// Whether the device joins the probe rows with it, whole or in
    /// passes, rather than DataFusion's operator.
    pub fn on_device(&self) -> bool {
        matches!(self, Self::Whole { .. } | Self::Passes { .. })
    }
}

type SharedBuild<B> = std::result::Result<Arc<CollectedBuild<B>>, Arc<DataFusionError>>;

/// Where the preparation of a build side announces its probe plan: set
/// when known, cleared should the build side not end up whole.
pub(crate) type PlanSender = watch::Sender<Option<Arc<ProbePlan>>>;

/// A collected build side on its way to the device (or to passes). The
/// task placing it is aborted, and its device work stopped, when the last
/// holder lets go: the partitions and the runner's cell, which goes with
/// the plan.
#[derive(Clone)]
pub(crate) struct PendingBuild<B: JoinBackend> {
    /// Estimated to fit the device, and being prepared whole; it is split
    /// into passes after all if the device runs out of memory.
    pub whole: bool,
    placed: Shared<BoxFuture<'static, SharedBuild<B>>>,
    plan: watch::Receiver<Option<Arc<ProbePlan>>>,
}

impl<B: JoinBackend> PendingBuild<B> {
    /// What the build side became, once placed.
    pub async fn placed(&self) -> Result<Arc<CollectedBuild<B>>> {
        self.placed.clone().await.map_err(DataFusionError::Shared)
    }

    /// How probe chunks load for it, as soon as its preparation knows;
    /// `None` once placed other than whole (in passes, or on the CPU).
    pub async fn probe_plan(&self) -> Result<Option<Arc<ProbePlan>>> {
        let mut announced = self.plan.clone();
        tokio::select! {
            biased;
            Ok(plan) = announced.wait_for(Option::is_some) => Ok(plan.clone()),
            placed = self.placed() => Ok(match placed?.as_ref() {
                CollectedBuild::Whole { side, .. } => Some(Arc::clone(side.plan())),
                _ => None,
            }),
        }
    }
}

/// What the task placing a build side takes from the partition that
/// collected it.
struct CollectedInput<B: JoinBackend> {
    backend: B,
    metrics: GpuJoinMetrics,
    options: GpuJoinConfig,
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    /// Its keys evaluated on each batch, where they were as it was collected.
    keys: Option<CollectedKeys>,
    /// The spans of its keys; `None` when it has no batch.
    ranges: Option<KeyRanges>,
    rows: usize,
    /// Device bytes its transform would hold at its peak.
    bytes: u64,
    passes: usize,
    /// Why DataFusion's operator joins it whatever the device could do.
    left_to_datafusion: Option<String>,
    /// Its host memory's, shared by every device that places it.
    reservation: Arc<MemoryReservation>,
    /// The probe input, for DataFusion's operator.
    right: Arc<dyn ExecutionPlan>,
    mode: PartitionMode,
    partition: usize,
    /// The collection the join's devices share, which a build side too
    /// large for one device is split over.
    shared: Option<Arc<SharedCollection<B>>>,
}

/// The build side's host work (assembly, key ranges, key encoding) runs on
/// a rayon pool of its own. On the global pool it would queue behind the
/// probe side's staging, which runs ahead while the build side is prepared
/// although every probe chunk then waits for the build side.
static BUILD_POOL: LazyLock<Option<rayon::ThreadPool>> = LazyLock::new(|| {
    let threads = rayon::current_num_threads();
    rayon::ThreadPoolBuilder::new().num_threads(threads).thread_name(|i| format!("gpu-join-build-{i}")).build().ok()
});

/// Runs `work` with its parallel parts on the build side's pool.
fn on_build_pool<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    match BUILD_POOL.as_ref() {
        Some(pool) => pool.install(work),
        None => work(),
    }
}

/// The build side's columns the host reads, assembled whole before it is
/// prepared: those of types the device does not hold, and those the filter
/// reads. The others are copied from the batches straight into the memory
/// their upload reads as the build side is prepared, so that the link
/// carries them while the host copies.
fn host_read_columns<B: JoinBackend>(definition: &JoinDefinition, backend: &B, schema: &Schema) -> Vec<usize> {
    let on_device = columns_held(backend, schema, &definition.build_output_columns());
    let filtered = definition.filter_columns(JoinSide::Left);
    let read = definition.read_columns(JoinSide::Left);
    read.into_iter().filter(|c| !on_device.contains(c) || filtered.contains(c)).collect()
}

/// Passes tried when a build side estimated to fit runs out of memory alone.
const PASSES_AFTER_OUT_OF_MEMORY: usize = 4;

/// Device bytes the transform of a build side of `rows` rows holds at its
/// peak: keys (at most 8 bytes), device-held payloads and row ids, in and
/// out, and the columns the backend compares for the filter.
fn transform_bytes(definition: &JoinDefinition, schema: &Schema, rows: usize) -> u64 {
    let width = |columns: Vec<usize>| -> usize {
        columns.iter().filter_map(|&i| schema.fields().get(i).and_then(|f| f.data_type().primitive_width())).sum()
    };
    let (payload, compared) =
        (width(definition.build_output_columns()), width(definition.pair_filter_columns(JoinSide::Left)));
    rows as u64 * (2 * (8 + payload) + 4 + compared) as u64
}

/// The batches of partition `partition` of the build input, in host memory
/// accounted in `reservation` and counted in `rows_in` as they come, and
/// their keys and the spans of those, as `keys` asks. A
/// build input coalesced from several partitions is read one task per
/// partition, rather than batch by batch through the coalescing channel,
/// which costs more than the copy for DataFusion's small batches. Each task
/// also starts its partition, as the coalescing operator's tasks do: a
/// hash join below takes a quarter of a millisecond to start a partition,
/// and sixteen started in turn held up the build side by 4 ms (TPC-DS Q61).
/// A single partition is read on the calling partition's task, as
/// DataFusion's operator reads its own: read by a task of its own, the scan
/// below a `Partitioned` join straggled, its last partition ending 4 to
/// 6 ms after the median one instead of 1.5 ms (TPC-DS Q19 at SF 10).
async fn collect_input(
    left: &Arc<dyn ExecutionPlan>,
    partition: usize,
    context: &Arc<TaskContext>,
    reservation: &Arc<MemoryReservation>,
    keys: &KeyReading,
    rows_in: RowsIn,
) -> Result<Collected> {
    let coalesced = match left.downcast_ref::<CoalescePartitionsExec>() {
        Some(coalesce) if coalesce.fetch().is_none() => coalesce.input(),
        _ => return read_partition(left, partition, context, reservation, keys, &rows_in, false).await,
    };
    let tasks = (0..coalesced.output_partitioning().partition_count())
        .map(|p| {
            let (plan, context) = (Arc::clone(coalesced), Arc::clone(context));
            let (reservation, keys, rows_in) = (Arc::clone(reservation), keys.clone(), rows_in.clone());
            SpawnedTask::spawn(
                async move { read_partition(&plan, p, &context, &reservation, &keys, &rows_in, true).await },
            )
        })
        .collect::<Vec<_>>();
    let mut collected = Collected::default();
    for task in tasks {
        let part =
            task.join().await.map_err(|e| exec_datafusion_err!("GPU join: collecting the build side: {e}"))??;
        collected.batches.extend(part.batches);
        collected.keys.extend(part.keys);
        collected.ranges = KeyRanges::merge_known(collected.ranges, part.ranges);
    }
    Ok(collected)
}

/// Where the rows of a build side are counted as they are collected: the
/// cell the join's partitions share, and the join's dynamic filter, for
/// the joins below that wait for it ([`ProbeFilter::collecting`]).
#[derive(Clone)]
struct RowsIn {
    cell: Arc<AtomicUsize>,
    filter: Option<Arc<ProbeFilter>>,
}

impl RowsIn {
    fn add(&self, rows: usize) {
        self.cell.fetch_add(rows, Ordering::Relaxed);
        if let Some(filter) = &self.filter {
            filter.collecting(rows);
        }
    }
}

/// What the tasks reading a build input do with each batch's keys.
#[derive(Clone)]
struct KeyReading {
    expressions: Vec<PhysicalExprRef>,
    /// Keep them, for the build side's preparation.
    keep: bool,
    /// Gather their spans.
    spans: bool,
}

impl KeyReading {
    /// Adds `batch` to `collected`, with its keys and their spans as asked.
    fn read(&self, batch: RecordBatch, collected: &mut Collected) -> Result<()> {
        if self.keep || self.spans {
            let evaluated = evaluate_keys(&self.expressions, &batch)?;
            if self.spans {
                collected.ranges =
                    KeyRanges::merge_known(collected.ranges.take(), Some(KeyRanges::of_piece(&evaluated)));
            }
            if self.keep {
                collected.keys.push(evaluated);
            }
        }
        collected.batches.push(batch);
        Ok(())
    }
}

/// The collected build side less the rows that the filters of joins above
/// drop, its keys and their spans read again where any was; and how many
/// were.
async fn reduced(
    reduction: &RowReduction,
    collected: Collected,
    reading: &KeyReading,
    compute: &Time,
) -> Result<(Collected, usize)> {
    let (batches, dropped) = reduction.reduce(collected.batches, compute).await?;
    if dropped == 0 {
        return Ok((Collected { batches, ..collected }, 0));
    }
    let mut reduced = Collected::default();
    for batch in batches {
        reading.read(batch, &mut reduced)?;
    }
    Ok((reduced, dropped))
}

/// How long a task reading a build input keeps its worker: after as long,
/// it counts what it read into the reservation and `rows_in`, and yields if
/// asked. Counted and yielding after every batch, sixteen tasks reading
/// 1,024 batches in memory each wrote the same two counters and handed
/// their workers back 1,024 times: 4.0 to 6.1 ms per task, against 3.2 to
/// 4.0 ms counted every 50 µs (operator benchmark).
const COUNT_EVERY: Duration = Duration::from_micros(50);

/// Reads partition `partition` of `plan` whole, as [`collect_input`] says;
/// `yields`: whether to yield every [`COUNT_EVERY`], for a task that reads
/// one of several partitions.
async fn read_partition(
    plan: &Arc<dyn ExecutionPlan>,
    partition: usize,
    context: &Arc<TaskContext>,
    reservation: &MemoryReservation,
    keys: &KeyReading,
    rows_in: &RowsIn,
    yields: bool,
) -> Result<Collected> {
    let mut input = plan.execute(partition, Arc::clone(context))?;
    let mut collected = Collected::default();
    let (mut bytes, mut rows, mut counted) = (0, 0, Instant::now());
    while let Some(batch) = input.next().await.transpose()? {
        (bytes, rows) = (bytes + batch.get_array_memory_size(), rows + batch.num_rows());
        keys.read(batch, &mut collected)?;
        if counted.elapsed() < COUNT_EVERY {
            continue;
        }
        reservation.try_grow(std::mem::take(&mut bytes))?;
        rows_in.add(std::mem::take(&mut rows));
        // The input is often always ready (batches in memory, a join
        // below handing them on), and a task that never yields keeps one
        // woken on its worker from running: the build input's other
        // partitions, read by tasks like this one, then ran one after
        // another (TPC-DS Q20).
        if yields {
            tokio::task::yield_now().await;
        }
        counted = Instant::now();
    }
    reservation.try_grow(bytes)?;
    rows_in.add(rows);
    Ok(collected)
}

/// Batches collected so far, their keys where kept, and the spans of those
/// where gathered.
#[derive(Default)]
struct Collected {
    batches: Vec<RecordBatch>,
    keys: CollectedKeys,
    ranges: Option<KeyRanges>,
}

/// A build side collected into host memory, before it is placed.
#[derive(Clone)]
struct HostBuild {
    batches: Vec<RecordBatch>,
    /// Its keys evaluated on each batch, where they were as it was collected.
    keys: Option<CollectedKeys>,
    /// The spans of its keys; `None` when it has no batch.
    ranges: Option<KeyRanges>,
    rows: usize,
    reservation: Arc<MemoryReservation>,
}

/// The host collection of a `CollectLeft` build side that the devices a
/// join spreads over share ([`super::spread`]): collected once, by the
/// first partition that asks, then taken by each device to place on itself,
/// or, where it does not fit one device, split once into passes over all of
/// them. Its batches are the ones each device's host rows of a whole build
/// side keep anyway; beside a build side split into passes they stay held
/// until the join's partitions end.
pub(crate) struct SharedCollection<B: JoinBackend> {
    host: tokio::sync::OnceCell<std::result::Result<HostBuild, Arc<DataFusionError>>>,
    passes: tokio::sync::OnceCell<std::result::Result<Arc<BuildPasses<B>>, Arc<DataFusionError>>>,
    /// The join's devices, in the order of `gpu_join.devices`.
    devices: Arc<[Arc<DeviceJoin<B>>]>,
}

impl<B: JoinBackend> SharedCollection<B> {
    pub fn new(devices: Arc<[Arc<DeviceJoin<B>>]>) -> Self {
        Self { host: Default::default(), passes: Default::default(), devices }
    }

    /// The collected build side, collected by `collect` if no device has
    /// asked before.
    async fn take(&self, collect: impl Future<Output = Result<HostBuild>>) -> Result<HostBuild> {
        let host = self.host.get_or_init(|| async { collect.await.map_err(Arc::new) }).await;
        host.clone().map_err(DataFusionError::Shared)
    }

    /// The build side in passes over every device, pass `j` on the
    /// `j mod n`-th: split by `split` into at least `passes` passes, as
    /// many on each device, if no device has split it before.
    async fn passes<F, Fut>(&self, passes: usize, split: F) -> Result<Arc<BuildPasses<B>>>
    where
        F: FnOnce(usize) -> Fut,
        Fut: Future<Output = Result<Vec<RecordBatch>>>,
    {
        let devices = self.devices.len().max(1);
        let passes = passes.max(devices).next_multiple_of(devices);
        let split = || async {
            let pieces = split(passes).await.map_err(Arc::new)?;
            Ok(Arc::new(BuildPasses::new(pieces, Arc::clone(&self.devices))))
        };
        self.passes.get_or_init(split).await.clone().map_err(DataFusionError::Shared)
    }
}

impl<B: JoinBackend> DeviceJoin<B> {
    /// Collects partition `partition` of the build input (`inputs.left`),
    /// counting its rows in `rows_in` as they come, or takes it from the
    /// devices' shared collection, and starts placing it; returns once its
    /// rows are in.
    pub async fn collect_build(
        self: &Arc<Self>,
        inputs: &PartitionInputs,
        options: &GpuJoinConfig,
        partition: usize,
        rows_in: Arc<AtomicUsize>,
        shared: Option<&Arc<SharedCollection<B>>>,
    ) -> Result<PendingBuild<B>> {
        let host = match shared {
            Some(shared) => shared.take(self.collect_host(inputs, partition, rows_in)).await?,
            None => self.collect_host(inputs, partition, rows_in).await?,
        };
        self.start_placing(host, inputs, options, partition, shared.cloned())
    }

    /// Partition `partition` of the build input in host memory, less the
    /// rows the filters of joins above drop, its spans sent to the join's
    /// dynamic filter.
    async fn collect_host(
        &self,
        inputs: &PartitionInputs,
        partition: usize,
        rows_in: Arc<AtomicUsize>,
    ) -> Result<HostBuild> {
        let timer = inputs.metrics.build_collect_time.timer();
        let reservation =
            MemoryConsumer::new(format!("GpuJoinBuild[{partition}]")).register(inputs.context.memory_pool());
        let reservation = Arc::new(reservation);
        // Sent whatever the build side becomes: the spans bound what it can
        // match, on the device or in DataFusion's operator.
        let report = inputs.probe_filter.as_ref().map(|filter| filter.report());
        // Keys that go up as their raw bits have their spans gathered on
        // the way, unless the probe side's scan waits for them: one read of
        // them less before the build side goes up.
        let spans = report.is_some() || !self.definition.build_keys_may_go_up_raw(&inputs.left.schema());
        // Keys that are columns cost an array's reference each to evaluate;
        // evaluated here, the thousands of DataFusion's batches of a large
        // build side are spread over the tasks reading them, not left to
        // its preparation, which waited 0.55 to 4 ms for them (traced in
        // the operator benchmark).
        let keep = self.definition.build_keys.iter().all(|key| key.downcast_ref::<Column>().is_some());
        let reading = KeyReading { expressions: self.definition.build_keys.clone(), keep, spans };
        let rows_in = RowsIn { cell: rows_in, filter: inputs.probe_filter.clone() };
        let mut collected =
            collect_input(&inputs.left, partition, &inputs.context, &reservation, &reading, rows_in).await?;
        if let Some(reduction) = &inputs.reductions.build {
            let dropped;
            let compute = inputs.metrics.baseline.elapsed_compute();
            (collected, dropped) = reduced(reduction, collected, &reading, compute).await?;
            if dropped > 0 {
                inputs.metrics.rows_filtered_from_above.add(dropped);
                reservation.try_resize(collected.batches.iter().map(RecordBatch::get_array_memory_size).sum())?;
            }
        }
        let Collected { batches, keys, ranges } = collected;
        if let Some(report) = report {
            let options = inputs.context.session_config().options();
            report.send(ranges.as_ref(), &batches, &self.definition.build_keys, options);
        }
        let rows = batches.iter().map(RecordBatch::num_rows).sum();
        inputs.metrics.build_rows.add(rows);
        timer.done();
        Ok(HostBuild { batches, keys: keep.then_some(keys), ranges, rows, reservation })
    }

    /// Starts placing a collected build side on the device (or in passes,
    /// or with DataFusion's operator) on a task of its own; `shared`, the
    /// collection of one the join's devices share.
    fn start_placing(
        self: &Arc<Self>,
        host: HostBuild,
        inputs: &PartitionInputs,
        options: &GpuJoinConfig,
        partition: usize,
        shared: Option<Arc<SharedCollection<B>>>,
    ) -> Result<PendingBuild<B>> {
        let counters = Arc::new(DeviceCounters::default());
        let faults = InjectedAllocationFailures::of(inputs.context.session_config());
        counters.inject_allocation_failures(faults.build_spared, faults.build);
        let backend = self.open_backend(Arc::clone(&counters))?;
        let HostBuild { batches, keys, ranges, rows, reservation } = host;
        let schema = inputs.left.schema();
        let bytes = transform_bytes(&self.definition, &schema, rows);
        let pass_bytes = backend.memory_budget().map(|budget| budget / 4);
        let passes = pass_count(rows, bytes, pass_bytes, options.build_pass_rows);
        let left_to_datafusion = choice::below_min_rows(&self.definition.planned, rows, options.min_rows)
            .or_else(|| choice::below_min_build_rows(rows, options.min_build_rows));
        let whole = passes == 1 && left_to_datafusion.is_none();
        let input = CollectedInput {
            backend,
            metrics: inputs.metrics.clone(),
            options: options.clone(),
            schema,
            batches,
            keys,
            ranges,
            rows,
            bytes,
            passes,
            left_to_datafusion,
            reservation,
            right: Arc::clone(&inputs.right),
            mode: inputs.mode,
            partition,
            shared,
        };
        // The task holds the join's parts, not the runner: dropping the plan
        // drops the runner's cell and with it the last holder of the task.
        let join = Arc::clone(self);
        let (plan_tx, plan) = watch::channel(None);
        let task = SpawnedTask::spawn(async move {
            let _cancel = CancelOnDrop(Arc::clone(&counters));
            let metrics = input.metrics.clone();
            let placed = join.place(input, &plan_tx).await;
            if !matches!(placed.as_deref(), Ok(CollectedBuild::Whole { .. })) {
                plan_tx.send_replace(None);
            }
            metrics.record_device(&counters);
            placed
        });
        let placed = task
            .map(|joined| match joined {
                Ok(placed) => placed.map_err(Arc::new),
                Err(e) => Err(Arc::new(exec_datafusion_err!("GPU join: placing the build side: {e}"))),
            })
            .boxed()
            .shared();
        Ok(PendingBuild { whole, placed, plan })
    }

    /// Prepares a build side that fits whole, splits one that does not;
    /// `planned` hears of the whole one's probe plan.
    async fn place(self: &Arc<Self>, input: CollectedInput<B>, planned: &PlanSender) -> Result<Arc<CollectedBuild<B>>> {
        let CollectedInput {
            backend,
            metrics,
            options,
            schema,
            mut batches,
            keys,
            ranges,
            rows,
            bytes,
            mut passes,
            left_to_datafusion,
            reservation,
            right,
            mode,
            partition,
            shared,
        } = input;
        let mut timer = metrics.build_collect_time.timer();
        let sortable = self.keys_sort_on_device(ranges.as_ref())?;
        if passes == 1 && sortable && left_to_datafusion.is_none() {
            let (assembler, columns) = (backend.clone(), host_read_columns(&self.definition, &backend, &schema));
            let schema = Arc::clone(&schema);
            let host_rows = run_blocking("collecting the build side", move || {
                on_build_pool(|| assemble_rows(&assembler, schema, batches, rows, &columns))
            })
            .await?;
            timer.stop();
            let prepared =
                self.prepare_admitted(&backend, &metrics, &options, host_rows.clone(), ranges, keys, Some(planned));
            match prepared.await {
                Ok(side) => {
                    let side = Arc::new(DeviceBuild::new(side));
                    return Ok(Arc::new(CollectedBuild::Whole { side, _reservation: reservation }));
                }
                Err(e) if is_out_of_memory(&e) => {
                    log::info!("gpu_join: a build side of {rows} rows does not fit the device: {e}");
                    metrics.out_of_memory_retries.add(1);
                    passes = PASSES_AFTER_OUT_OF_MEMORY;
                    batches = host_rows.parts().to_vec();
                    timer.restart();
                }
                Err(e) => return Err(e),
            }
        }
        let small = left_to_datafusion.is_some();
        let reason = match (left_to_datafusion, sortable) {
            (Some(reason), _) => Some(reason),
            (None, false) => Some(
                "the build side's keys span too wide a range to sort into the order the plan relies on".to_string(),
            ),
            (None, true) if !self.definition.splits_into_passes() => Some(format!(
                "a build side of {rows} rows ({bytes} bytes transformed) is larger than the device budget allows, \
                 and a {} join {} cannot be split into passes",
                self.definition.join_type,
                match (self.definition.probe_order_required, &self.definition.key_order) {
                    (true, _) => "in probe order",
                    (_, Some(_)) => "in key order",
                    _ => "of this type",
                },
            )),
            (None, true) => None,
        };
        if let Some(reason) = reason {
            timer.done();
            match small {
                true => log::debug!("gpu_join: DataFusion's operator joins this build side: {reason}"),
                false => log::warn!("gpu_join: DataFusion's operator joins this build side: {reason}"),
            }
            // A build side that may be swapped is recorded by each partition,
            // once it knows which side built.
            let swappable = small && may_swap_sides(&self.definition, &options, mode);
            if swappable && mode == PartitionMode::Partitioned {
                let build = SwappableBuild { batches, reason };
                return Ok(Arc::new(CollectedBuild::OnCpuPartition { build, _reservation: reservation }));
            }
            if !swappable {
                self.chosen.record_datafusion(&reason);
            }
            // A build side of few rows is concatenated here, as DataFusion's
            // operator would concatenate it on its own worker: the hops to
            // the blocking pool and the build side's pool and back cost more
            // than the copy (TPC-DS Q61). So is each partition's own in
            // `Partitioned` mode where it is below `min_rows` or
            // `min_build_rows`: all of them come in at once, and sent to the
            // build side's pool together they were handed on up to 17 ms
            // after their rows were in, against 10 to 13 ms copied here
            // (TPC-DS Q36 at SF 10). Any other is copied on the build side's
            // pool, as one too large for the device may be gigabytes: in
            // parallel where it serves every partition, by one thread where
            // each partition has its own.
            let here = rows < PARALLEL_CONCAT_ROWS || (small && mode == PartitionMode::Partitioned);
            let build = match here {
                true => concatenated_last_first(&schema, batches, false)?,
                false => {
                    let (schema, in_parallel) = (Arc::clone(&schema), mode != PartitionMode::Partitioned);
                    run_blocking("concatenating the build side", move || {
                        on_build_pool(|| concatenated_last_first(&schema, batches, in_parallel))
                    })
                    .await?
                }
            };
            let join = SlotJoin::new(right.schema(), right.output_partitioning().partition_count(), |probe| {
                Ok(in_key_order(&self.definition, hash_join_over(&self.twin, &build, probe, mode, partition)?))
            })?;
            let swappable = swappable.then(|| SwappableBuild { batches: build, reason });
            return Ok(Arc::new(CollectedBuild::OnCpu { join, swappable, _reservation: reservation }));
        }
        let keys = self.definition.build_keys.clone();
        let split = |passes: usize| {
            metrics.build_passes.add(passes);
            run_blocking("splitting the build side into passes", move || {
                on_build_pool(|| split_into_passes(&schema, &batches, &keys, passes))
            })
        };
        let passes = match shared {
            Some(shared) => shared.passes(passes, split).await?,
            None => Arc::new(BuildPasses::new(split(passes).await?, Arc::new([Arc::clone(self)]))),
        };
        timer.done();
        Ok(Arc::new(CollectedBuild::Passes { passes, _reservation: reservation }))
    }

    /// Whether the build side's keys, of these spans, sort on the device
    /// into the order the output must leave in; true where none is needed.
    fn keys_sort_on_device(&self, ranges: Option<&KeyRanges>) -> Result<bool> {
        match (&self.definition.key_order, ranges) {
            (Some(order), Some(ranges)) => {
                Ok(KeyEncoder::for_ordered_keys(ranges, self.definition.null_equality, &order.sort_options)?.is_some())
            }
            _ => Ok(true),
        }
    }

    /// Prepares a build side (or one pass of it) under the device's
    /// admission; one that runs out of memory is prepared again, alone on
    /// the device, with a probe plan of its own. Its host memory is
    /// accounted by whoever collected it; `ranges`, the spans of its keys,
    /// and `keys`, its keys, by whoever gathered them (the keys are
    /// evaluated again if it is prepared again). `planned`, if any, hears
    /// of each probe plan.
    #[allow(clippy::too_many_arguments)]
    pub async fn prepare_admitted(
        &self,
        backend: &B,
        metrics: &GpuJoinMetrics,
        options: &GpuJoinConfig,
        rows: HostRows,
        ranges: Option<KeyRanges>,
        keys: Option<CollectedKeys>,
        planned: Option<&PlanSender>,
    ) -> Result<BuildSide<B>> {
        let _compute = metrics.baseline.elapsed_compute().timer();
        let (admission, build_rows) = (self.admission(), rows.rows());
        let permit = admitted(metrics, admission.shared(options.concurrent_tasks)).await?;
        let prepared = match self.prepare(backend, metrics, rows.clone(), ranges.clone(), keys, planned).await {
            Err(e) if is_out_of_memory(&e) => {
                drop(permit);
                log::info!("gpu_join: preparing the build side again, alone on the device: {e}");
                metrics.out_of_memory_retries.add(1);
                let _permit = admitted(metrics, admission.exclusive()).await?;
                self.prepare(backend, metrics, rows, ranges, None, planned).await
            }
            prepared => prepared,
        }?;
        self.chosen.record(prepared.choice());
        metrics.built_on(self.index, build_rows);
        Ok(prepared)
    }

    async fn prepare(
        &self,
        backend: &B,
        metrics: &GpuJoinMetrics,
        rows: HostRows,
        ranges: Option<KeyRanges>,
        keys: Option<CollectedKeys>,
        planned: Option<&PlanSender>,
    ) -> Result<BuildSide<B>> {
        let _prepare = metrics.build_prepare_time.timer();
        let (backend, definition, timers) = (backend.clone(), Arc::clone(&self.definition), metrics.phases.clone());
        let planned = planned.cloned();
        run_blocking("preparing the build side", move || {
            let announce = |plan: &Arc<ProbePlan>| {
                if let Some(planned) = &planned {
                    planned.send_replace(Some(Arc::clone(plan)));
                }
            };
            on_build_pool(|| prepare_build_side(&backend, &definition, rows, ranges.as_ref(), keys, &timers, announce))
        })
        .await
    }
}
