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
    cuda::open_device(options).map(BackendHandle::Cuda)
}
