//! The CUDA backend: the join primitives as CUDA kernels (in `kernels/`),
//! compiled at run time by NVRTC, with cudarc loading the driver and NVRTC
//! dynamically, so that the same binary runs with or without a GPU.

mod column;
mod compaction;
mod device;
mod directory;
mod driver;
mod filter;
mod grouping;
mod kernels;
mod launch;
mod matching;
mod memory;
mod pinned;
mod primitives;
mod staging;
mod transform;
mod uncached;

use std::sync::Arc;

pub use column::CudaColumn;
pub use device::CudaDevice;
pub use kernels::compile_kernels;
pub use launch::CudaBackend;
pub use matching::CudaHashTables;
pub use memory::DeviceBuffer;

use crate::config::GpuJoinConfig;

/// The session's CUDA device `ordinal`, opened once per process.
pub(crate) fn open_device(options: &GpuJoinConfig, ordinal: usize) -> Result<Arc<CudaDevice>, String> {
    device::device(ordinal, options.memory_limit, options.pinned_pool_bytes as u64)
}

pub(crate) use device::visible_devices;
