//! Pinned host buffers for transfers staged through them, kept by the
//! device for the next transfer.

use cudarc::driver::{CudaContext, result};
use datafusion::error::Result;

use super::driver::cuda_error;

/// Size of each of the two pinned staging buffers.
pub(super) const STAGING_BYTES: usize = 16 << 20;

/// Two pinned host buffers for staged transfers.
#[derive(Debug)]
pub(crate) struct Staging {
    buffers: [*mut u8; 2],
}

// SAFETY: the buffers are plain host memory owned by this value.
unsafe impl Send for Staging {}

impl Staging {
    pub(super) fn new(context: &CudaContext) -> Result<Self> {
        context.bind_to_thread().map_err(|e| cuda_error("allocating pinned staging memory", e))?;
        let mut buffers = [std::ptr::null_mut(); 2];
        for buffer in buffers.iter_mut() {
            // SAFETY: allocates page-locked host memory.
            *buffer = unsafe { result::malloc_host(STAGING_BYTES, 0) }
                .map_err(|e| cuda_error("allocating pinned staging memory", e))?
                .cast();
        }
        Ok(Self { buffers })
    }

    pub(super) fn buffer(&mut self, index: usize, len: usize) -> &mut [u8] {
        // SAFETY: each buffer holds STAGING_BYTES bytes and `len` is at most that.
        unsafe { std::slice::from_raw_parts_mut(self.buffers[index], len.min(STAGING_BYTES)) }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        for buffer in self.buffers {
            // SAFETY: allocated by malloc_host and no longer used.
            if let Err(e) = unsafe { result::free_host(buffer.cast()) } {
                log::warn!("gpu_join: freeing pinned staging memory failed: {e}");
            }
        }
    }
}
