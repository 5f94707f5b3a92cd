//! What the stages probing one build side work with: the join, where each
//! job takes the build side from, and the partition's inputs.

use std::sync::{Arc, Mutex, MutexGuard};

use arrow::record_batch::RecordBatch;
use datafusion::common::{internal_datafusion_err, internal_err};
use datafusion::error::Result;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};

use super::build::{CollectedBuild, PendingBuild};
use super::device_build::DeviceBuild;
use super::device_join::DeviceJoin;
use super::inputs::PartitionInputs;
use super::passes::BuildPasses;
use super::runtime::admitted;
use crate::algorithms::{HostRows, ProbePlan};
use crate::backend::{Admitted, DeviceCounters, JoinBackend};
use crate::config::GpuJoinConfig;

/// Where a partition's jobs take the build side from.
pub(super) enum BuildSource<B: JoinBackend> {
    Whole(Arc<DeviceBuild<B>>),
    /// One pass of a split build side, taken for one job at a time.
    Pass(Arc<BuildPasses<B>>, usize),
    /// A build side still being prepared whole, and the probe rows read
    /// before it was on the device.
    Preparing(PendingBuild<B>, Arc<HeldProbe>),
}

/// The build side as a job finds it.
pub(super) enum BuildForJob<B: JoinBackend> {
    Ready(Arc<DeviceBuild<B>>),
    /// Prepared whole, it did not fit the device: it was split into passes.
    SplitIntoPasses(Arc<BuildPasses<B>>),
}

/// What the loading stage finds to load the next chunk by.
pub(super) enum LoadPlan<B: JoinBackend> {
    /// The plan, and the build side it came from when one is ready, held
    /// while the chunk loads.
    Ready(Arc<ProbePlan>, Option<Arc<DeviceBuild<B>>>),
    SplitIntoPasses(Arc<BuildPasses<B>>),
}

/// Probe batches a partition read while its build side was being prepared
/// whole, held in case it is split into passes after all: the partition
/// then joins every probe row pass by pass, as none has been joined yet.
pub(super) struct HeldProbe {
    /// `None` once the build side is on the device.
    held: Mutex<Option<HeldBatches>>,
}

type HeldBatches = (Vec<RecordBatch>, MemoryReservation);

impl HeldProbe {
    pub fn new(inputs: &PartitionInputs) -> Self {
        let reservation = MemoryConsumer::new(format!("GpuJoinProbeHeld[{}]", inputs.partition))
            .register(inputs.context.memory_pool());
        Self { held: Mutex::new(Some((vec![], reservation))) }
    }

    fn lock(&self) -> Result<MutexGuard<'_, Option<HeldBatches>>> {
        self.held.lock().map_err(|_| internal_datafusion_err!("GPU join: held probe rows lock poisoned"))
    }

    /// Holds `batch`, of `bytes` as `held_bytes` counts them, while the
    /// build side may still be split.
    fn hold(&self, batch: &RecordBatch, bytes: usize) -> Result<()> {
        if let Some((batches, reservation)) = self.lock()?.as_mut() {
            reservation.try_grow(bytes)?;
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
    pub fn take(&self) -> Result<Vec<RecordBatch>> {
        Ok(self.lock()?.take().map(|(batches, _)| batches).unwrap_or_default())
    }
}

/// What every stage probing one build side works with.
pub(super) struct Probing<'a, B: JoinBackend> {
    pub join: &'a DeviceJoin<B>,
    pub build: BuildSource<B>,
    /// The instance that prepares a pass of the build side when this
    /// partition is the first to ask for it, and whose transfer memory the
    /// host stages chunks in.
    pub build_backend: B,
    pub inputs: &'a PartitionInputs,
    pub options: &'a GpuJoinConfig,
    /// Counters of the probe-chunk instances.
    pub counters: &'a Arc<DeviceCounters>,
}

impl<B: JoinBackend> Probing<'_, B> {
    /// The build side for one job; a job holds it no longer than it runs.
    pub async fn build_for_job(&self) -> Result<BuildForJob<B>> {
        match &self.build {
            BuildSource::Whole(build) => Ok(BuildForJob::Ready(Arc::clone(build))),
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
                Ok(BuildForJob::Ready(passes.acquire(*pass, prepare).await?))
            }
            BuildSource::Preparing(pending, held) => match pending.placed().await?.as_ref() {
                CollectedBuild::Whole { side, .. } => {
                    held.release()?;
                    Ok(BuildForJob::Ready(Arc::clone(side)))
                }
                CollectedBuild::Passes { passes, .. } => Ok(BuildForJob::SplitIntoPasses(Arc::clone(passes))),
                CollectedBuild::OnCpu { .. } | CollectedBuild::OnCpuPartition { .. } => {
                    internal_err!("GPU join: a join that splits into passes was left to DataFusion's operator")
                }
            },
        }
    }

    /// The probe plan for loading a chunk: a build side being prepared
    /// whole gives it while it is still being prepared.
    pub async fn load_plan(&self) -> Result<LoadPlan<B>> {
        if let BuildSource::Preparing(pending, _) = &self.build
            && let Some(plan) = pending.probe_plan().await?
        {
            return Ok(LoadPlan::Ready(plan, None));
        }
        Ok(match self.build_for_job().await? {
            BuildForJob::Ready(build) => LoadPlan::Ready(Arc::clone(build.plan()), Some(build)),
            BuildForJob::SplitIntoPasses(passes) => LoadPlan::SplitIntoPasses(passes),
        })
    }

    /// Whether a build side that was being prepared whole was split into
    /// passes instead; waits for it to be placed.
    pub async fn split_instead(&self) -> Result<Option<Arc<BuildPasses<B>>>> {
        match &self.build {
            BuildSource::Preparing(..) => match self.build_for_job().await? {
                BuildForJob::SplitIntoPasses(passes) => Ok(Some(passes)),
                BuildForJob::Ready(_) => Ok(None),
            },
            _ => Ok(None),
        }
    }

    /// Holds a probe batch of `bytes` read while the build side may still
    /// be split.
    pub fn hold_probe(&self, batch: &RecordBatch, bytes: usize) -> Result<()> {
        match &self.build {
            BuildSource::Preparing(_, held) => held.hold(batch, bytes),
            _ => Ok(()),
        }
    }

    /// A probe-chunk instance, its match calls within the partition's
    /// limit of pairs.
    pub fn open_backend(&self) -> Result<B> {
        Ok(self.join.open_backend(Arc::clone(self.counters))?.with_candidate_limit(self.inputs.limits.pairs))
    }

    /// A shared permit of the device's admission.
    pub async fn admitted(&self) -> Result<Admitted> {
        admitted(&self.inputs.metrics, self.join.admission().shared(self.options.concurrent_tasks)).await
    }

    /// The device to itself: a job that ran out of memory beside others.
    pub async fn admitted_alone(&self) -> Result<Admitted> {
        admitted(&self.inputs.metrics, self.join.admission().exclusive()).await
    }
}
