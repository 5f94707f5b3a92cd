//! Runs a GPU join's partitions on one backend.
//!
//! The operator is not generic over the backend; it holds a [`JoinRunner`]
//! whose implementation, [`Runner`], is. The runner also owns the state the
//! partitions of one execution share in `CollectLeft` mode: the build side,
//! collected and transformed once, and the count of probe partitions still
//! running, so that the last one emits the build-side rows.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow::compute::concat_batches;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_plan::joins::PartitionMode;
use datafusion::physical_plan::stream::RecordBatchReceiverStreamBuilder;
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream};
use futures::TryStreamExt;
use tokio::sync::OnceCell;

use super::metrics::GpuJoinMetrics;
use super::stream::{run_blocking, run_partition};
use crate::algorithms::{BuildSide, JoinDefinition, prepare_build_side};
use crate::backend::cuda::CudaBackend;
use crate::backend::{BackendHandle, JoinBackend, cpu::CpuBackend};

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
    probe_partitions: usize,
) -> Arc<dyn JoinRunner> {
    match backend {
        BackendHandle::Cpu => Arc::new(Runner::<CpuBackend>::new((), definition, probe_partitions)),
        BackendHandle::Cuda(device) => {
            Arc::new(Runner::<CudaBackend>::new(Arc::clone(device), definition, probe_partitions))
        }
    }
}

/// A build side together with the host memory it holds in DataFusion's pool.
pub(crate) struct PreparedBuild<B: JoinBackend> {
    pub side: BuildSide<B>,
    _reservation: MemoryReservation,
}

type SharedBuild<B> = std::result::Result<Arc<PreparedBuild<B>>, Arc<DataFusionError>>;

pub(crate) struct Runner<B: JoinBackend> {
    device: B::Device,
    pub definition: Arc<JoinDefinition>,
    collected_build: OnceCell<SharedBuild<B>>,
    probes_running: AtomicUsize,
}

impl<B: JoinBackend> fmt::Debug for Runner<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runner").field("device", &self.device).finish_non_exhaustive()
    }
}

impl<B: JoinBackend> Runner<B> {
    fn new(device: B::Device, definition: Arc<JoinDefinition>, probe_partitions: usize) -> Self {
        Self {
            device,
            definition,
            collected_build: OnceCell::new(),
            probes_running: AtomicUsize::new(probe_partitions),
        }
    }

    pub fn open_backend(&self, counters: Arc<crate::backend::DeviceCounters>) -> Result<B> {
        B::open(&self.device, counters)
    }

    /// The build side of a partition: collected once and shared in
    /// `CollectLeft` mode, or this partition's own in `Partitioned` mode.
    pub async fn build_side(&self, backend: &B, inputs: &PartitionInputs) -> Result<Arc<PreparedBuild<B>>> {
        match inputs.mode {
            PartitionMode::CollectLeft => self
                .collected_build
                .get_or_init(|| async { self.collect_build(backend, inputs, 0).await.map_err(Arc::new) })
                .await
                .clone()
                .map_err(DataFusionError::Shared),
            _ => self.collect_build(backend, inputs, inputs.partition).await,
        }
    }

    async fn collect_build(
        &self,
        backend: &B,
        inputs: &PartitionInputs,
        partition: usize,
    ) -> Result<Arc<PreparedBuild<B>>> {
        let timer = inputs.metrics.build_collect_time.timer();
        let reservation =
            MemoryConsumer::new(format!("GpuJoinBuild[{partition}]")).register(inputs.context.memory_pool());
        let stream = inputs.left.execute(partition, Arc::clone(&inputs.context))?;
        let batches: Vec<_> = stream
            .and_then(|batch| {
                let grown = reservation.try_grow(batch.get_array_memory_size());
                async move { grown.map(|_| batch) }
            })
            .try_collect()
            .await?;
        let batch = concat_batches(&inputs.left.schema(), &batches)?;
        drop(batches);
        inputs.metrics.build_rows.add(batch.num_rows());
        timer.done();

        let (backend, definition, timers) =
            (backend.clone(), Arc::clone(&self.definition), inputs.metrics.phases.clone());
        let _compute = inputs.metrics.baseline.elapsed_compute().timer();
        let side =
            run_blocking("preparing the build side", move || prepare_build_side(&backend, &definition, batch, &timers))
                .await?;
        Ok(Arc::new(PreparedBuild { side, _reservation: reservation }))
    }

    /// Records that a probe partition has seen all its input; true for the
    /// partition that must emit the build-side rows.
    pub fn finish_probe(&self, mode: PartitionMode) -> bool {
        match mode {
            PartitionMode::CollectLeft => self.probes_running.fetch_sub(1, Ordering::AcqRel) == 1,
            _ => true,
        }
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
