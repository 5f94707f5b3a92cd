//! Pinned host memory that Arrow buffers live in: output columns downloaded
//! into it, probe chunks and build sides assembled in it on the host, and
//! tables kept in it for as long as their batches live.
//!
//! A transfer from or to pageable memory runs at a fraction of the PCIe
//! speed and needs a copy through a staging buffer, into memory whose pages
//! fault in one by one when it is fresh; from or to a pinned block it runs
//! at full speed and no copy is made. Blocks are lent to Arrow buffers and
//! come back to the device's pool when the last buffer over them is
//! dropped, so that a stream of chunks and output batches reuses the same
//! few blocks. The pool never holds more than its limit: when it is spent,
//! data goes the slower way.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arrow::alloc::Allocation;
use arrow::buffer::Buffer;
use cudarc::driver::{CudaContext, result};
use datafusion::common::internal_datafusion_err;
use datafusion::error::Result;

use crate::arrays::runs_in_blocks;
use crate::backend::TransferMemory;

use super::driver::cuda_error;

/// Blocks are lent in powers of two from this size up, so that outputs of
/// slightly different sizes reuse each other's blocks.
const SMALLEST_BLOCK: usize = 1 << 20;

/// A page-locked host allocation.
#[derive(Debug)]
struct Block {
    address: NonNull<u8>,
    bytes: usize,
}

// SAFETY: plain host memory, used by one owner at a time (the pool's free
// list, or the one loan that holds it).
unsafe impl Send for Block {}
// SAFETY: as above; the loan only hands out reads through Arrow buffers.
unsafe impl Sync for Block {}

/// The device's pinned blocks.
#[derive(Debug)]
pub(crate) struct PinnedPool {
    context: Arc<CudaContext>,
    state: Mutex<PoolState>,
    limit: AtomicU64,
}

#[derive(Debug, Default)]
struct PoolState {
    free: Vec<Block>,
    /// Bytes of every block, free or lent.
    allocated: u64,
    /// Address and size of every block, free or lent.
    blocks: BTreeMap<usize, usize>,
}

impl PoolState {
    /// The block at or below `address` (its address and bytes), the only
    /// one that can hold it.
    fn block_of(&self, address: usize) -> Option<(usize, usize)> {
        self.blocks.range(..=address).next_back().map(|(&block, &size)| (block, size))
    }
}

/// How a request for a block is met.
enum Supply {
    Reused(Block),
    /// Room was taken in the pool for a new block of this size.
    New(usize),
    Spent,
}

/// A pinned block lent out; back to its pool when dropped, or freed if it
/// was kept for a table.
#[derive(Debug)]
pub(crate) struct PinnedLoan {
    block: Option<Block>,
    pool: Arc<PinnedPool>,
    kept: bool,
}

impl PinnedPool {
    pub fn new(context: Arc<CudaContext>) -> Self {
        Self { context, state: Mutex::default(), limit: AtomicU64::new(0) }
    }

    /// The most pinned bytes the pool may hold.
    pub fn set_limit(&self, bytes: u64) {
        self.limit.store(bytes, Ordering::Relaxed);
    }

    /// A block of at least `bytes` bytes, or `None` when the pool is spent
    /// (or pinned memory cannot be had).
    pub fn lend(self: &Arc<Self>, bytes: usize) -> Option<PinnedLoan> {
        let size = bytes.max(SMALLEST_BLOCK).checked_next_power_of_two()?;
        let limit = self.limit.load(Ordering::Relaxed);
        let mut evicted = vec![];
        let supply = {
            let mut state = self.state.lock().ok()?;
            match state.free.iter().position(|block| block.bytes == size) {
                Some(found) => Supply::Reused(state.free.swap_remove(found)),
                None => {
                    // Free blocks of other sizes make room for this one.
                    while state.allocated + size as u64 > limit
                        && let Some(block) = state.free.pop()
                    {
                        state.allocated -= block.bytes as u64;
                        evicted.push(block);
                    }
                    if state.allocated + size as u64 > limit {
                        Supply::Spent
                    } else {
                        state.allocated += size as u64;
                        Supply::New(size)
                    }
                }
            }
        };
        evicted.into_iter().for_each(|block| self.free_block(block));
        let block = match supply {
            Supply::Reused(block) => block,
            Supply::New(size) => self.allocate(size)?,
            Supply::Spent => return None,
        };
        Some(PinnedLoan { block: Some(block), pool: Arc::clone(self), kept: false })
    }

    /// A block of `bytes` bytes for data that stays as long as the buffers
    /// over it (a table's columns), outside the limit, which bounds what the
    /// joins themselves hold; freed, not kept for reuse, once dropped.
    pub fn keep(self: &Arc<Self>, bytes: usize) -> Result<PinnedLoan> {
        let size = bytes.max(1);
        let block = self.allocate_block(size)?;
        if let Ok(mut state) = self.state.lock() {
            state.blocks.insert(block.address.as_ptr() as usize, size);
        }
        Ok(PinnedLoan { block: Some(block), pool: Arc::clone(self), kept: true })
    }

    /// A new block, whose bytes the pool has already counted.
    fn allocate(&self, size: usize) -> Option<Block> {
        let block = self.allocate_block(size).ok();
        if let Ok(mut state) = self.state.lock() {
            match &block {
                Some(block) => drop(state.blocks.insert(block.address.as_ptr() as usize, size)),
                None => state.allocated -= size as u64,
            }
        }
        block
    }

    fn allocate_block(&self, size: usize) -> Result<Block> {
        self.context.bind_to_thread().map_err(|e| cuda_error("binding the device", e))?;
        // SAFETY: allocates page-locked host memory.
        let pointer = unsafe { result::malloc_host(size, 0) }.map_err(|e| cuda_error("allocating pinned memory", e))?;
        let address = NonNull::new(pointer.cast::<u8>())
            .ok_or_else(|| internal_datafusion_err!("allocating {size} bytes of pinned memory gave a null pointer"))?;
        Ok(Block { address, bytes: size })
    }

    /// Whether `bytes` lie wholly in one of the pool's blocks, so that the
    /// device reads or writes them directly.
    pub fn holds(&self, bytes: &[u8]) -> bool {
        let start = bytes.as_ptr() as usize;
        self.state
            .lock()
            .is_ok_and(|state| state.block_of(start).is_some_and(|(block, size)| start + bytes.len() <= block + size))
    }

    /// `pieces` end to end, as one buffer per run of them that lies end to
    /// end in one block (the consecutive batches of a table kept in pinned
    /// memory); `None` where a piece lies in no block.
    pub fn runs(&self, pieces: &[Buffer]) -> Option<Vec<Buffer>> {
        let runs = {
            let state = self.state.lock().ok()?;
            runs_in_blocks(pieces, |address| state.block_of(address))?
        };
        runs.into_iter()
            .map(|(indices, start, len)| {
                let owner: Arc<dyn Allocation> = Arc::new(pieces[indices].to_vec());
                // SAFETY: the range is the run's pieces' bytes end to end,
                // inside one block (checked above), which the pieces, owned
                // by `owner`, keep alive and unchanged as long as the new
                // buffer lives.
                Some(unsafe { Buffer::from_custom_allocation(NonNull::new(start as *mut u8)?, len, owner) })
            })
            .collect()
    }

    /// `pieces` as one buffer, where they lie end to end in one block.
    pub fn joined(&self, pieces: &[Buffer]) -> Option<Buffer> {
        match self.runs(pieces)?.as_slice() {
            [run] => Some(run.clone()),
            _ => None,
        }
    }

    fn give_back(&self, block: Block) {
        let Ok(mut state) = self.state.lock() else {
            return self.free_block(block);
        };
        if state.allocated > self.limit.load(Ordering::Relaxed) {
            // The limit was lowered while the block was lent.
            state.allocated -= block.bytes as u64;
            drop(state);
            return self.free_block(block);
        }
        state.free.push(block);
    }

    fn free_block(&self, block: Block) {
        if let Ok(mut state) = self.state.lock() {
            state.blocks.remove(&(block.address.as_ptr() as usize));
        }
        let freed = self.context.bind_to_thread().map_err(|e| cuda_error("binding the device", e)).and_then(|_| {
            // SAFETY: allocated by malloc_host; no loan refers to it any more.
            unsafe { result::free_host(block.address.as_ptr().cast()) }
                .map_err(|e| cuda_error("freeing pinned memory", e))
        });
        if let Err(e) = freed {
            log::warn!("gpu_join: {e}");
        }
    }
}

impl Drop for PinnedPool {
    fn drop(&mut self) {
        let free = self.state.get_mut().map(|state| std::mem::take(&mut state.free)).unwrap_or_default();
        for block in free {
            self.free_block(block);
        }
    }
}

impl TransferMemory for PinnedLoan {
    fn bytes_mut(&mut self, len: usize) -> Result<&mut [u8]> {
        match &self.block {
            Some(block) if len <= block.bytes => {
                // SAFETY: the block holds `block.bytes` bytes and this loan is its only user.
                Ok(unsafe { std::slice::from_raw_parts_mut(block.address.as_ptr(), len) })
            }
            _ => Err(internal_datafusion_err!("a pinned block is smaller than {len} bytes")),
        }
    }

    fn into_buffer(self: Box<Self>, len: usize) -> Result<Buffer> {
        let address = match &self.block {
            Some(block) if len <= block.bytes => block.address,
            _ => return Err(internal_datafusion_err!("a pinned block is smaller than {len} bytes")),
        };
        // SAFETY: the block is page aligned, holds `len` bytes written by
        // its user and lives as long as the loan, which the buffer owns.
        Ok(unsafe { Buffer::from_custom_allocation(address, len, Arc::new(*self)) })
    }
}

impl Drop for PinnedLoan {
    fn drop(&mut self) {
        if let Some(block) = self.block.take() {
            match self.kept {
                true => self.pool.free_block(block),
                false => self.pool.give_back(block),
            }
        }
    }
}
