//! Runs a GPU join's partitions on one device.
//!
//! The operator is not generic over the backend; it holds a [`JoinRunner`]
//! whose implementation, [`Runner`], is. The runner also owns the state the
//! partitions of one execution share in `CollectLeft` mode: the build side,
//! collected and placed once ([`super::build`]), and the count of probe
//! partitions still running, so that the last one emits the build-side
//! rows.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use datafusion::error::{DataFusionError, Result};
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use tokio::sync::OnceCell;

use super::build::{PendingBuild, SharedCollection};
use super::chosen::ChosenStrategies;
use super::device_join::DeviceJoin;
use super::inputs::PartitionInputs;
use super::runtime::drop_off_the_workers;
use super::spread::{Spread, device_of, spreads_one_build_side};
use crate::algorithms::{JoinDefinition, ProbeChunkPolicy};
use crate::backend::cuda::CudaBackend;
use crate::backend::{BackendHandle, Devices, JoinBackend, cpu::CpuBackend};
use crate::config::GpuJoinConfig;

pub(crate) trait JoinRunner: Send + Sync + fmt::Debug {
    fn execute(self: Arc<Self>, inputs: PartitionInputs) -> Result<SendableRecordBatchStream>;
}

/// The runner for a join's devices, with fresh shared state: one device's
/// own, or one for each device that spreads the partitions over them.
pub(crate) fn runner_for(
    devices: &Devices,
    definition: Arc<JoinDefinition>,
    twin: Arc<HashJoinExec>,
    probe_partitions: usize,
    chosen: Arc<ChosenStrategies>,
) -> Arc<dyn JoinRunner> {
    let join = JoinParts { definition, twin, probe_partitions, chosen };
    // A join's devices are all of one backend.
    match devices.first() {
        BackendHandle::Cpu => runner_over::<CpuBackend>(devices.iter().map(|_| ()).collect(), join),
        BackendHandle::Cuda(_) => {
            let cuda = devices.iter().filter_map(|(_, backend)| match backend {
                BackendHandle::Cuda(device) => Some(Arc::clone(device)),
                BackendHandle::Cpu => None,
            });
            runner_over::<CudaBackend>(cuda.collect(), join)
        }
    }
}

/// What every device's runner of a join is made of.
struct JoinParts {
    definition: Arc<JoinDefinition>,
    twin: Arc<HashJoinExec>,
    probe_partitions: usize,
    chosen: Arc<ChosenStrategies>,
}

fn runner_over<B: JoinBackend>(devices: Vec<B::Device>, join: JoinParts) -> Arc<dyn JoinRunner> {
    let JoinParts { definition, twin, probe_partitions, chosen } = join;
    let (mode, count) = (*twin.partition_mode(), devices.len());
    let spreads = spreads_one_build_side(&definition);
    // The probe partitions each device runs, of which its last emits what a
    // shared build side's flags say.
    let partitions_on =
        |device| (0..probe_partitions).filter(|&p| device_of(p, mode, count, spreads) == device).count();
    let mut runners: Vec<Arc<Runner<B>>> = devices
        .into_iter()
        .enumerate()
        .map(|(index, device)| {
            let probe_chunks = ProbeChunkPolicy::for_join(&definition);
            let (definition, twin, chosen) = (Arc::clone(&definition), Arc::clone(&twin), Arc::clone(&chosen));
            let join = DeviceJoin::<B> { device, index, definition, twin, chosen, probe_chunks };
            Arc::new(Runner::new(join, partitions_on(index)))
        })
        .collect();
    match runners.len() {
        1 => runners.remove(0),
        _ => Arc::new(Spread::new(runners, spreads, probe_partitions)),
    }
}

/// Where a partition finds its build side once it is collected. Partitions
/// hold it while they run, so that the build side's memory is freed when
/// the last of them ends, finished or cancelled.
pub(crate) type BuildCell<B> = Arc<BuildSlot<B>>;

pub(crate) struct BuildSlot<B: JoinBackend> {
    pending: OnceCell<std::result::Result<PendingBuild<B>, Arc<DataFusionError>>>,
    /// Build rows collected so far.
    pub rows_in: Arc<AtomicUsize>,
}

impl<B: JoinBackend> Default for BuildSlot<B> {
    fn default() -> Self {
        Self { pending: OnceCell::new(), rows_in: Arc::default() }
    }
}

pub(crate) struct Runner<B: JoinBackend> {
    pub join: Arc<DeviceJoin<B>>,
    /// The build side shared in `CollectLeft` mode; replaced by an empty
    /// cell once every probe partition has finished.
    collected_build: Mutex<BuildCell<B>>,
    probe_partitions: usize,
    probes_running: AtomicUsize,
}

impl<B: JoinBackend> fmt::Debug for Runner<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runner").field("device", &self.join.device).finish_non_exhaustive()
    }
}

impl<B: JoinBackend> Runner<B> {
    fn new(join: DeviceJoin<B>, probe_partitions: usize) -> Self {
        Self {
            join: Arc::new(join),
            collected_build: Mutex::default(),
            probe_partitions,
            probes_running: AtomicUsize::new(probe_partitions),
        }
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

    /// The build side in `cell`, collected by the first partition that
    /// asks (or taken from the collection `shared` by the join's devices)
    /// and placed by a task of its own.
    pub async fn pending_build(
        &self,
        cell: &BuildCell<B>,
        inputs: &PartitionInputs,
        options: &GpuJoinConfig,
        shared: Option<&Arc<SharedCollection<B>>>,
    ) -> Result<PendingBuild<B>> {
        let partition = match inputs.mode {
            PartitionMode::CollectLeft => 0,
            _ => inputs.partition,
        };
        let rows_in = Arc::clone(&cell.rows_in);
        cell.pending
            .get_or_init(|| async {
                self.join.collect_build(inputs, options, partition, rows_in, shared).await.map_err(Arc::new)
            })
            .await
            .clone()
            .map_err(DataFusionError::Shared)
    }

    /// Lets go of a partition's hold on the runner. Once DataFusion has let
    /// go of the plan, the last holder also holds the plan below the join,
    /// through DataFusion's join kept for what the device cannot take, and
    /// dropping that releases every batch of the in-memory tables under it:
    /// 4 ms for TPC-DS Q61 at SF 10. On a worker, that held up the consumer
    /// the partition had just handed its stream to, which tokio runs next on
    /// the same worker; so the last holder drops it on the blocking pool.
    pub fn release(runner: Arc<Self>) {
        if let Some(runner) = Arc::into_inner(runner) {
            drop_off_the_workers(runner);
        }
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
