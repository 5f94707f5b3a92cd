//! One CUDA backend instance, and how it launches kernels on its stream.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use datafusion::common::exec_datafusion_err;
use datafusion::error::Result;

use super::memory::Instance;
use crate::backend::check_candidates_within;

/// Threads per block of every kernel (BLOCK in common.cuh).
pub(super) const BLOCK: u32 = 256;
/// A kernel argument, passed by value.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg {
    U8(u8),
    U32(u32),
    U64(u64),
}

impl From<u32> for Arg {
    fn from(value: u32) -> Self {
        Arg::U32(value)
    }
}

impl From<u64> for Arg {
    fn from(value: u64) -> Self {
        Arg::U64(value)
    }
}

/// The CUDA backend for one partition of one join: a device, a stream of
/// its own, and the join's counters.
#[derive(Debug, Clone)]
pub struct CudaBackend {
    pub(super) instance: Instance,
    /// The most candidate pairs one match call produces.
    pub(super) candidate_limit: usize,
}

impl CudaBackend {
    /// A resource error when `total` candidate pairs are more than one
    /// match call of this instance may produce.
    pub(super) fn check_candidates(&self, total: u64) -> Result<usize> {
        check_candidates_within(total, self.candidate_limit)
    }

    /// Launches `kernel` over `threads` threads.
    pub(super) fn launch(&self, kernel: &str, threads: u64, shared: u32, args: &[Arg]) -> Result<()> {
        self.launch_blocks(kernel, threads.div_ceil(u64::from(BLOCK)), shared, threads, args)
    }

    /// Launches `kernel` with `blocks` blocks; `rows` is for error messages.
    pub(super) fn launch_blocks(&self, kernel: &str, blocks: u64, shared: u32, rows: u64, args: &[Arg]) -> Result<()> {
        if blocks == 0 {
            return Ok(());
        }
        self.instance.counters.check_cancelled(kernel)?;
        let function = self.instance.device.kernel(kernel)?;
        let grid = u32::try_from(blocks)
            .map_err(|_| exec_datafusion_err!("GPU join kernel {kernel}: {blocks} blocks are too many"))?;
        let config = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: shared };
        let mut builder = self.instance.stream.launch_builder(function);
        for arg in args {
            match arg {
                Arg::U8(v) => builder.arg(v),
                Arg::U32(v) => builder.arg(v),
                Arg::U64(v) => builder.arg(v),
            };
        }
        // SAFETY: the argument list matches the kernel's signature in kernels/.
        unsafe { builder.launch(config) }
            .map(drop)
            .map_err(|e| exec_datafusion_err!("GPU join kernel {kernel} failed to launch on {rows} rows: {e}"))
    }

    /// Waits for the stream's work; a kernel fault surfaces here.
    pub(super) fn synchronize(&self, what: &str) -> Result<()> {
        self.instance.synchronize(what)
    }
}
