//! The backend a join was planned for, and the session's CUDA device.

use std::sync::Arc;

use super::cpu::CpuBackend;
use super::cuda::{self, CudaBackend, CudaDevice};
use super::{JoinBackend, Space};
use crate::config::GpuJoinConfig;

/// The backend a join was planned for. Cheap to clone; the operator opens
/// one backend instance per output partition from it.
#[derive(Debug, Clone)]
pub enum BackendHandle {
    Cpu,
    Cuda(Arc<CudaDevice>),
}

impl BackendHandle {
    pub fn name(&self) -> &'static str {
        match self {
            BackendHandle::Cpu => "cpu",
            BackendHandle::Cuda(_) => "cuda",
        }
    }

    /// Device memory the GPU join holds now, over every join of the
    /// process (none on the CPU backend).
    pub fn device_memory_in_use(&self) -> u64 {
        match self {
            BackendHandle::Cpu => 0,
            BackendHandle::Cuda(device) => device.budget.used(),
        }
    }

    pub fn preferred_gather_space(&self) -> Space {
        match self {
            BackendHandle::Cpu => CpuBackend::PREFERRED_GATHER_SPACE,
            BackendHandle::Cuda(_) => CudaBackend::PREFERRED_GATHER_SPACE,
        }
    }
}

/// The CUDA backend for the session's device, or why there is none. The
/// device is opened once per process (kernels compiled or read from the
/// cache); its memory budget follows `gpu_join.memory_limit`.
pub fn cuda_backend(options: &GpuJoinConfig) -> std::result::Result<BackendHandle, String> {
    cuda::open_device(options, options.device).map(BackendHandle::Cuda)
}

/// The devices a join spreads its partitions over, in the order
/// `gpu_join.devices` lists them, each with its ordinal; all of one
/// backend. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Devices {
    devices: Arc<[(usize, BackendHandle)]>,
}

impl Devices {
    /// The devices of `gpu_join.devices` on the CUDA backend, or why one
    /// of them is not usable.
    pub fn cuda(options: &GpuJoinConfig) -> std::result::Result<Self, String> {
        let ordinals = options.devices.ordinals(options.device, || cuda::visible_devices().unwrap_or(1));
        let devices = ordinals
            .into_iter()
            .map(|ordinal| cuda::open_device(options, ordinal).map(|device| (ordinal, BackendHandle::Cuda(device))))
            .collect::<std::result::Result<Vec<_>, String>>()?;
        Ok(Self { devices: devices.into() })
    }

    /// The devices of `gpu_join.devices` on the CPU reference backend: an
    /// instance of its own for each, as separate devices would be, under
    /// the CPU's one admission queue.
    pub fn cpu(options: &GpuJoinConfig) -> Self {
        let ordinals = options.devices.ordinals(options.device, || 1);
        Self { devices: ordinals.into_iter().map(|ordinal| (ordinal, BackendHandle::Cpu)).collect() }
    }

    /// The first device: the one whose profile plans the join.
    pub fn first(&self) -> &BackendHandle {
        &self.devices[0].1
    }

    pub fn len(&self) -> usize {
        self.devices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// The `index`-th device, with its ordinal.
    pub fn get(&self, index: usize) -> Option<&(usize, BackendHandle)> {
        self.devices.get(index)
    }

    pub fn iter(&self) -> impl Iterator<Item = &(usize, BackendHandle)> {
        self.devices.iter()
    }

    pub fn ordinals(&self) -> Vec<usize> {
        self.devices.iter().map(|(ordinal, _)| *ordinal).collect()
    }
}

impl From<BackendHandle> for Devices {
    /// The one device of `backend`.
    fn from(backend: BackendHandle) -> Self {
        let ordinal = match &backend {
            BackendHandle::Cpu => 0,
            BackendHandle::Cuda(device) => device.ordinal,
        };
        Self { devices: Arc::new([(ordinal, backend)]) }
    }
}
