//! Runs a GPU join's partitions on one backend.
//!
//! The operator is not generic over the backend; it holds a [`JoinRunner`]
//! whose implementation, [`Runner`], is. The runner also owns the state the
//! partitions of one execution share in `CollectLeft` mode: the build side,
//! collected and transformed once, and the count of probe partitions still
//! running, so that the last one emits the build-side rows.
//!
//! Once collected, a build side that fits the device is prepared whole; a
//! larger one is split into passes ([`super::passes`]), or, for a join that
//! cannot be split, handed with the probe side to DataFusion's operator.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrow::datatypes::Schema;
use arrow::record_batch::RecordBatch;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::{JoinSide, exec_datafusion_err};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::stream::RecordBatchReceiverStreamBuilder;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, SendableRecordBatchStream};
use futures::TryStreamExt;
use tokio::sync::{OnceCell, OwnedSemaphorePermit};

use super::fallback::hash_join_over;
use super::metrics::GpuJoinMetrics;
use super::passes::{BuildPasses, pass_count, split_by_pass};
use super::staging::{assemble_rows, concat_in_parallel};
use super::stream::{is_out_of_memory, run_blocking, run_partition};
use crate::algorithms::{BuildSide, HostRows, JoinDefinition, prepare_build_side};
use crate::backend::cuda::CudaBackend;
use crate::backend::{Admission, BackendHandle, JoinBackend, cpu::CpuBackend};
use crate::config::GpuJoinConfig;

/// What one output partition needs to run.
pub(crate) struct PartitionInputs {
    pub partition: usize,
    pub context: Arc<TaskContext>,
    pub left: Arc<dyn ExecutionPlan>,
    pub right: Arc<dyn ExecutionPlan>,
    pub mode: PartitionMode,
    pub fetch: Option<usize>,
    pub metrics: GpuJoinMetrics,
}

pub(crate) trait JoinRunner: Send + Sync + fmt::Debug {
    fn execute(self: Arc<Self>, inputs: PartitionInputs) -> Result<SendableRecordBatchStream>;
}

/// The runner for a backend, with fresh shared state.
pub(crate) fn runner_for(
    backend: &BackendHandle,
    definition: Arc<JoinDefinition>,
    twin: Arc<HashJoinExec>,
    probe_partitions: usize,
) -> Arc<dyn JoinRunner> {
    match backend {
        BackendHandle::Cpu => Arc::new(Runner::<CpuBackend>::new((), definition, twin, probe_partitions)),
        BackendHandle::Cuda(device) => {
            Arc::new(Runner::<CudaBackend>::new(Arc::clone(device), definition, twin, probe_partitions))
        }
    }
}

/// What a build side became once collected.
pub(crate) enum CollectedBuild<B: JoinBackend> {
    /// Prepared on the device in one piece.
    Whole { side: Arc<BuildSide<B>>, _reservation: MemoryReservation },
    /// Split into passes, each prepared when partitions need it.
    Passes { passes: Arc<BuildPasses<B>>, _reservation: MemoryReservation },
    /// Too large for the device, for a join that cannot be split: DataFusion's
    /// operator joins each probe partition with the build side's host copy.
    OnCpu { join: Arc<dyn ExecutionPlan>, _reservation: MemoryReservation },
}

type SharedBuild<B> = std::result::Result<Arc<CollectedBuild<B>>, Arc<DataFusionError>>;

/// Device bytes the transform of a build side of `rows` rows holds at its
/// peak: keys (at most 8 bytes), device-held payloads and row ids, in and
/// out.
fn transform_bytes(definition: &JoinDefinition, schema: &Schema, rows: usize) -> u64 {
    let payload: usize = definition
        .build_output_columns()
        .iter()
        .filter_map(|&i| schema.fields().get(i).and_then(|f| f.data_type().primitive_width()))
        .sum();
    rows as u64 * (2 * (8 + payload) + 4) as u64
}

/// The batches of partition `partition` of the build input, in host memory
/// accounted in `reservation`. A build input coalesced from several
/// partitions is read one task per partition, rather than batch by batch
/// through the coalescing channel, which costs more than the copy for
/// DataFusion's small batches.
async fn collect_input(
    left: &Arc<dyn ExecutionPlan>,
    partition: usize,
    context: &Arc<TaskContext>,
    reservation: &Arc<MemoryReservation>,
) -> Result<Vec<RecordBatch>> {
    let (plan, partitions) = match left.downcast_ref::<CoalescePartitionsExec>() {
        Some(coalesce) if coalesce.fetch().is_none() => {
            (coalesce.input(), 0..coalesce.input().output_partitioning().partition_count())
        }
        _ => (left, partition..partition + 1),
    };
    let tasks = partitions
        .map(|p| {
            let stream = plan.execute(p, Arc::clone(context))?;
            let reservation = Arc::clone(reservation);
            Ok(SpawnedTask::spawn(async move {
                stream
                    .and_then(|batch| {
                        let grown = reservation.try_grow(batch.get_array_memory_size());
                        async move { grown.map(|_| batch) }
                    })
                    .try_collect::<Vec<_>>()
                    .await
            }))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut batches = vec![];
    for task in tasks {
        let collected =
            task.join().await.map_err(|e| exec_datafusion_err!("GPU join: collecting the build side: {e}"))?;
        batches.extend(collected?);
    }
    Ok(batches)
}

/// Passes tried when a build side estimated to fit runs out of memory alone.
const PASSES_AFTER_OUT_OF_MEMORY: usize = 4;

/// Where a partition finds its build side once it is prepared. Partitions
/// hold it while they run, so that the build side's memory is freed when
/// the last of them ends, finished or cancelled.
pub(crate) type BuildCell<B> = Arc<OnceCell<SharedBuild<B>>>;

pub(crate) struct Runner<B: JoinBackend> {
    device: B::Device,
    pub definition: Arc<JoinDefinition>,
    /// DataFusion's join, for chunks the device cannot take.
    pub twin: Arc<HashJoinExec>,
    /// The build side shared in `CollectLeft` mode; replaced by an empty
    /// cell once every probe partition has finished.
    collected_build: Mutex<BuildCell<B>>,
    probe_partitions: usize,
    probes_running: AtomicUsize,
}

impl<B: JoinBackend> fmt::Debug for Runner<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runner").field("device", &self.device).finish_non_exhaustive()
    }
}

impl<B: JoinBackend> Runner<B> {
    fn new(
        device: B::Device,
        definition: Arc<JoinDefinition>,
        twin: Arc<HashJoinExec>,
        probe_partitions: usize,
    ) -> Self {
        Self {
            device,
            definition,
            twin,
            collected_build: Mutex::default(),
            probe_partitions,
            probes_running: AtomicUsize::new(probe_partitions),
        }
    }

    pub fn open_backend(&self, counters: Arc<crate::backend::DeviceCounters>) -> Result<B> {
        B::open(&self.device, counters)
    }

    pub fn admission(&self) -> &Admission {
        B::admission(&self.device)
    }

    /// Where a partition's build side will be: the one shared by every
    /// partition in `CollectLeft` mode, the partition's own otherwise.
    pub fn build_cell(&self, mode: PartitionMode) -> Result<BuildCell<B>> {
        match mode {
            PartitionMode::CollectLeft => self
                .collected_build
                .lock()
                .map(|cell| Arc::clone(&cell))
                .map_err(|_| DataFusionError::Internal("GPU join build side lock poisoned".into())),
            _ => Ok(BuildCell::default()),
        }
    }

    /// The build side in `cell`, collected and prepared by the first
    /// partition that asks.
    pub async fn collected_build(
        &self,
        cell: &BuildCell<B>,
        backend: &B,
        inputs: &PartitionInputs,
        options: &GpuJoinConfig,
    ) -> Result<Arc<CollectedBuild<B>>> {
        let partition = match inputs.mode {
            PartitionMode::CollectLeft => 0,
            _ => inputs.partition,
        };
        cell.get_or_init(|| async { self.collect_build(backend, inputs, options, partition).await.map_err(Arc::new) })
            .await
            .clone()
            .map_err(DataFusionError::Shared)
    }

    async fn collect_build(
        &self,
        backend: &B,
        inputs: &PartitionInputs,
        options: &GpuJoinConfig,
        partition: usize,
    ) -> Result<Arc<CollectedBuild<B>>> {
        let mut timer = inputs.metrics.build_collect_time.timer();
        let reservation =
            MemoryConsumer::new(format!("GpuJoinBuild[{partition}]")).register(inputs.context.memory_pool());
        let reservation = Arc::new(reservation);
        let batches = collect_input(&inputs.left, partition, &inputs.context, &reservation).await?;
        let reservation = Arc::into_inner(reservation)
            .ok_or_else(|| DataFusionError::Internal("GPU join: a build input task outlived its collection".into()))?;
        let rows = batches.iter().map(RecordBatch::num_rows).sum();
        inputs.metrics.build_rows.add(rows);
        let schema = inputs.left.schema();

        let pass_bytes = backend.memory_budget().map(|budget| budget / 4);
        let bytes = transform_bytes(&self.definition, &schema, rows);
        let mut passes = pass_count(rows, bytes, pass_bytes, options.build_pass_rows);
        if passes == 1 {
            let (assembler, parts, columns) =
                (backend.clone(), batches.clone(), self.definition.read_columns(JoinSide::Left));
            let schema = Arc::clone(&schema);
            let host_rows = run_blocking("collecting the build side", move || {
                assemble_rows(&assembler, schema, parts, rows, &columns)
            })
            .await?;
            timer.stop();
            match self.prepare_admitted(backend, inputs, options, host_rows).await {
                Ok(side) => {
                    return Ok(Arc::new(CollectedBuild::Whole { side: Arc::new(side), _reservation: reservation }));
                }
                Err(e) if is_out_of_memory(&e) => {
                    log::info!("gpu_join: a build side of {rows} rows does not fit the device: {e}");
                    passes = PASSES_AFTER_OUT_OF_MEMORY;
                    timer.restart();
                }
                Err(e) => return Err(e),
            }
        }
        // Split, or joined by DataFusion's operator: every column whole.
        let assembler = backend.clone();
        let batch =
            run_blocking("collecting the build side", move || concat_in_parallel(&assembler, &schema, &batches, rows))
                .await?;
        timer.done();
        if !self.definition.splits_into_passes() {
            log::warn!(
                "gpu_join: a build side of {rows} rows ({bytes} bytes transformed) is larger than the device \
                 budget allows, and a {} join {} cannot be split into passes: DataFusion's operator joins it",
                self.definition.join_type,
                if self.definition.probe_order_required { "in probe order" } else { "of this type" },
            );
            let join = hash_join_over(&self.twin, &batch, Arc::clone(&inputs.right), inputs.mode, partition)?;
            return Ok(Arc::new(CollectedBuild::OnCpu { join, _reservation: reservation }));
        }
        inputs.metrics.build_passes.add(passes);
        let keys = self.definition.build_keys.clone();
        let pieces =
            run_blocking("splitting the build side into passes", move || split_by_pass(&batch, &keys, passes)).await?;
        Ok(Arc::new(CollectedBuild::Passes { passes: Arc::new(BuildPasses::new(pieces)), _reservation: reservation }))
    }

    /// Prepares a build side (or one pass of it) under the device's
    /// admission; one that runs out of memory is prepared again, alone on
    /// the device. Its host memory is accounted by whoever collected it.
    pub async fn prepare_admitted(
        &self,
        backend: &B,
        inputs: &PartitionInputs,
        options: &GpuJoinConfig,
        rows: HostRows,
    ) -> Result<BuildSide<B>> {
        let _compute = inputs.metrics.baseline.elapsed_compute().timer();
        let admission = self.admission();
        let permit = self.admitted(inputs, admission.shared(options.concurrent_tasks)).await?;
        match self.prepare(backend, inputs, rows.clone()).await {
            Err(e) if is_out_of_memory(&e) => {
                drop(permit);
                log::info!("gpu_join: preparing the build side again, alone on the device: {e}");
                let _permit = self.admitted(inputs, admission.exclusive()).await?;
                self.prepare(backend, inputs, rows).await
            }
            prepared => prepared,
        }
    }

    /// A permit of the device's admission, its wait counted.
    pub async fn admitted(
        &self,
        inputs: &PartitionInputs,
        permit: impl Future<Output = Result<OwnedSemaphorePermit>>,
    ) -> Result<OwnedSemaphorePermit> {
        let _wait = inputs.metrics.admission_wait_time.timer();
        permit.await
    }

    async fn prepare(&self, backend: &B, inputs: &PartitionInputs, rows: HostRows) -> Result<BuildSide<B>> {
        let _prepare = inputs.metrics.build_prepare_time.timer();
        let (backend, definition, timers) =
            (backend.clone(), Arc::clone(&self.definition), inputs.metrics.phases.clone());
        run_blocking("preparing the build side", move || prepare_build_side(&backend, &definition, rows, &timers)).await
    }

    /// Records that a probe partition has seen all its input; true for the
    /// partition that must emit the build-side rows. The last one also
    /// takes the shared build side from the runner, so that it is freed
    /// when the partitions still holding it end.
    pub fn finish_probe(&self, mode: PartitionMode) -> bool {
        if mode != PartitionMode::CollectLeft {
            return true;
        }
        let last = self.probes_running.fetch_sub(1, Ordering::AcqRel) == 1;
        if last {
            if let Ok(mut cell) = self.collected_build.lock() {
                *cell = BuildCell::default();
            }
            self.probes_running.store(self.probe_partitions, Ordering::Release);
        }
        last
    }
}

impl<B: JoinBackend> JoinRunner for Runner<B> {
    fn execute(self: Arc<Self>, inputs: PartitionInputs) -> Result<SendableRecordBatchStream> {
        let schema = Arc::clone(&self.definition.output_schema);
        let mut builder = RecordBatchReceiverStreamBuilder::new(schema, 2);
        let tx = builder.tx();
        builder.spawn(async move { run_partition(self, inputs, tx).await });
        Ok(builder.build())
    }
}
