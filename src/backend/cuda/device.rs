//! CUDA devices: found without panicking, one context per device per
//! process, with its kernels and its memory budget.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, sys};
use datafusion::common::{DataFusionError, resources_datafusion_err};
use datafusion::error::Result;

use super::driver::{cuda_error, probe_libraries};
use super::kernels::Kernels;
use super::pinned::PinnedPool;
use super::staging::Staging;
use crate::backend::{Admission, TransferMemory};
use crate::config::MemoryLimit;

/// How many bytes of device memory the GPU join may hold at once.
#[derive(Debug, Default)]
pub(crate) struct MemoryBudget {
    limit: AtomicU64,
    used: AtomicU64,
}

impl MemoryBudget {
    pub fn set_limit(&self, bytes: u64) {
        self.limit.store(bytes, Ordering::Relaxed);
    }

    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `bytes` from the budget, or says that it is spent.
    pub fn reserve(&self, bytes: u64, what: &str) -> Result<()> {
        let limit = self.limit();
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            if used.saturating_add(bytes) > limit {
                return Err(resources_datafusion_err!(
                    "GPU join: {what} needs {bytes} bytes of device memory, but {used} of the {limit}-byte budget \
                     are in use; raise gpu_join.memory_limit or lower gpu_join.probe_chunk_rows"
                ));
            }
            match self.used.compare_exchange_weak(used, used + bytes, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(now) => used = now,
            }
        }
    }

    pub fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// One CUDA device, shared by every join of the process.
#[derive(Debug)]
pub struct CudaDevice {
    pub(crate) context: Arc<CudaContext>,
    kernels: Kernels,
    pub(crate) budget: MemoryBudget,
    pub(crate) name: String,
    /// The device's name and the build of its kernels, naming its cost
    /// profile.
    pub(crate) label: String,
    /// Largest dynamic shared memory one block may use.
    pub(crate) max_shared_bytes: u32,
    pub(crate) staging: Mutex<Vec<Staging>>,
    /// Pinned blocks that inputs are assembled in and outputs downloaded
    /// into.
    pub(crate) pinned: Arc<PinnedPool>,
    pub(crate) admission: Admission,
    /// Streams no backend instance holds, kept for the next ones.
    idle_streams: Mutex<Vec<Arc<CudaStream>>>,
    /// The driver's ordinal of the device.
    pub(crate) ordinal: usize,
}

/// Idle streams kept at most: more than the partitions of every join of a
/// query at once, each of which holds one.
const IDLE_STREAMS: usize = 256;

impl CudaDevice {
    /// `bytes` of pinned memory outside the pool's limit, kept until the
    /// buffer over it is dropped: a table's column that joins read where it
    /// lies ([`crate::GpuJoinContextExt::gpu_join_pin_batches`]).
    pub(crate) fn keep_transfer_memory(&self, bytes: usize) -> Result<Box<dyn TransferMemory>> {
        let block = self.pinned.keep(bytes).map_err(|e| {
            e.context(format!(
                "keeping a table's column of {bytes} bytes in pinned memory: free host memory, or join the batches as they are"
            ))
        })?;
        Ok(Box::new(block))
    }

    /// A stream for one backend instance: an idle one if there is, else a
    /// new one. Each partition of each join holds one, and creating and
    /// destroying streams takes the driver's lock: a query's joins opened
    /// theirs at once, in 0.08 ms at the median and up to 4 ms, and so
    /// started late (TPC-DS Q61).
    pub(crate) fn stream(self: &Arc<Self>) -> Result<PooledStream> {
        let idle = self.idle_streams.lock().ok().and_then(|mut idle| idle.pop());
        let stream = match idle {
            Some(stream) => stream,
            None => self.context.new_stream().map_err(|e| cuda_error("creating a stream", e))?,
        };
        Ok(PooledStream { stream, device: Arc::clone(self) })
    }

    pub(crate) fn kernel(&self, name: &str) -> Result<&CudaFunction> {
        self.kernels.get(name).ok_or_else(|| DataFusionError::Internal(format!("GPU join kernel {name} is not loaded")))
    }

    /// Total and free device memory in bytes.
    pub(crate) fn memory_info(&self) -> Result<(u64, u64)> {
        let (free, total) = self.context.mem_get_info().map_err(|e| cuda_error("querying device memory", e))?;
        Ok((total as u64, free as u64))
    }
}

/// A stream of the device's, given back to its idle streams when dropped.
/// Work still enqueued on it stays ordered before whatever its next holder
/// enqueues.
#[derive(Debug)]
pub(crate) struct PooledStream {
    stream: Arc<CudaStream>,
    device: Arc<CudaDevice>,
}

impl std::ops::Deref for PooledStream {
    type Target = Arc<CudaStream>;

    fn deref(&self) -> &Self::Target {
        &self.stream
    }
}

impl Drop for PooledStream {
    fn drop(&mut self) {
        // Held elsewhere too, it is not idle: it goes when they let go.
        if Arc::strong_count(&self.stream) > 1 {
            return;
        }
        if let Ok(mut idle) = self.device.idle_streams.lock()
            && idle.len() < IDLE_STREAMS
        {
            idle.push(Arc::clone(&self.stream));
        }
    }
}

/// How many CUDA devices the driver makes visible.
pub(crate) fn visible_devices() -> std::result::Result<usize, String> {
    probe_libraries()?;
    // cudarc panics when a driver symbol is missing; treat that as "none".
    catch_unwind(CudaContext::device_count)
        .map_err(|_| "the CUDA driver could not be initialised".to_string())?
        .map(|count| count.max(0) as usize)
        .map_err(|e| format!("counting CUDA devices: {e}"))
}

fn open(ordinal: usize) -> std::result::Result<CudaDevice, String> {
    probe_libraries()?;
    // cudarc panics when a driver symbol is missing; treat that as "no device".
    let context = catch_unwind(|| {
        wait_without_spinning(ordinal);
        CudaContext::new(ordinal)
    })
    .map_err(|_| format!("the CUDA driver could not be initialised for device {ordinal}"))?
    .map_err(|e| format!("CUDA device {ordinal} is not usable: {e}"))?;
    let opened = catch_unwind(AssertUnwindSafe(|| -> std::result::Result<CudaDevice, String> {
        // Streams are synchronised explicitly (build sides before sharing,
        // probe chunks by their downloads), so cudarc need not record events.
        // SAFETY: no CudaSlice of this context is shared between streams.
        unsafe { context.disable_event_tracking() };
        keep_freed_memory_pooled(&context)?;
        let kernels = Kernels::load(&context)?;
        let name = context.name().unwrap_or_else(|_| format!("CUDA device {ordinal}"));
        let max_shared_bytes = context
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(|e| format!("querying shared memory: {e}"))? as u32;
        // Set once, before any launch: changing it while other partitions
        // launch the same kernel could fail their launches.
        let table_bytes = super::kernels::table_limit(max_shared_bytes);
        for name in super::kernels::TABLE_KERNELS {
            let function = kernels.get(name).ok_or_else(|| format!("kernel {name} is not loaded"))?;
            // SAFETY: the function belongs to the module loaded above.
            unsafe {
                cudarc::driver::result::function::set_function_attribute(
                    function.cu_function(),
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    table_bytes as i32,
                )
            }
            .map_err(|e| format!("kernel {name}: {table_bytes} bytes of shared memory: {e}"))?;
        }
        // Kernels whose occupancy is bounded by shared memory get all of it
        // that the L1 cache can give up.
        let shared_bound = super::kernels::TABLE_KERNELS.iter().chain(super::kernels::SCATTER_KERNELS.iter());
        for name in shared_bound {
            let function = kernels.get(name).ok_or_else(|| format!("kernel {name} is not loaded"))?;
            // SAFETY: as above.
            unsafe {
                cudarc::driver::result::function::set_function_attribute(
                    function.cu_function(),
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                    100,
                )
            }
            .map_err(|e| format!("kernel {name}: preferring shared memory: {e}"))?;
        }
        let label = format!("{name}, kernels {:016x}", super::kernels::kernel_fingerprint());
        Ok(CudaDevice {
            pinned: Arc::new(PinnedPool::new(Arc::clone(&context))),
            context,
            kernels,
            budget: MemoryBudget::default(),
            name,
            label,
            max_shared_bytes,
            staging: Mutex::default(),
            admission: Admission::default(),
            idle_streams: Mutex::default(),
            ordinal,
        })
    }));
    opened.map_err(|_| format!("CUDA device {ordinal} failed while loading the join kernels"))?
}

/// Threads that wait for the device sleep instead of spinning. With fewer
/// contexts than cores the driver otherwise spins one core per waiting
/// thread, and a query's partitions wait at once, taking the cores that
/// DataFusion's scans and aggregations, and other queries, would use. Set
/// before the primary context is created; a driver that refuses leaves its
/// default, which changes speed only, not results.
fn wait_without_spinning(ordinal: usize) {
    let set = || -> std::result::Result<(), cudarc::driver::DriverError> {
        cudarc::driver::result::init()?;
        let device = cudarc::driver::result::device::get(ordinal as i32)?;
        let flags = sys::CUctx_flags::CU_CTX_SCHED_BLOCKING_SYNC as u32;
        // SAFETY: the device handle comes from cuDeviceGet above.
        unsafe { sys::cuDevicePrimaryCtxSetFlags_v2(device, flags).result() }
    };
    if let Err(e) = set() {
        log::info!("gpu_join: CUDA device {ordinal} keeps the driver's default wait: {e}");
    }
}

/// Flags of events that threads wait on: they sleep, as in
/// `wait_without_spinning`. cudarc takes one flag, so these events record
/// timing too; the runs that measured sleeping against spinning saw no
/// cost beyond their spread (docs/benchmarks.md).
pub(crate) const SLEEPING_EVENT: sys::CUevent_flags = sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC;

fn memory_pool(context: &Arc<CudaContext>) -> std::result::Result<sys::CUmemoryPool, String> {
    // SAFETY: the device handle comes from a live context.
    unsafe { cudarc::driver::result::device::get_default_mem_pool(context.cu_device()) }
        .map_err(|e| format!("memory pool: {e}"))
}

/// Freed device memory stays in the device's stream-ordered pool instead of
/// going back to the driver, so allocations after the first cost little.
fn keep_freed_memory_pooled(context: &Arc<CudaContext>) -> std::result::Result<(), String> {
    let pool = memory_pool(context)?;
    let mut threshold = u64::MAX;
    // SAFETY: the attribute takes a u64.
    unsafe {
        cudarc::driver::result::mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
    }
    .map_err(|e| format!("memory pool: {e}"))
}

/// Grows the device's pool to hold `bytes` by allocating the difference and
/// freeing it again (the pool keeps freed memory). Joins then carve their
/// buffers out of memory the pool already holds: a pool that grows while a
/// join runs maps new memory, which costs about 0.7 ms per GiB, as much as
/// a gather of that size.
fn reserve_pool(context: &Arc<CudaContext>, bytes: u64) -> std::result::Result<(), String> {
    let pool = memory_pool(context)?;
    let mut reserved = 0u64;
    // SAFETY: the attribute is a u64.
    unsafe {
        cudarc::driver::result::mem_pool::get_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
            (&mut reserved as *mut u64).cast(),
        )
    }
    .map_err(|e| format!("memory pool: {e}"))?;
    if reserved >= bytes {
        return Ok(());
    }
    context.bind_to_thread().map_err(|e| format!("memory pool: {e}"))?;
    let stream = context.new_stream().map_err(|e| format!("memory pool: {e}"))?;
    let missing = (bytes - reserved) as usize;
    // SAFETY: the memory is freed on the same stream, unused in between.
    unsafe {
        let pointer = cudarc::driver::result::malloc_async(stream.cu_stream(), missing)
            .map_err(|e| format!("reserving {missing} bytes in the memory pool: {e}"))?;
        cudarc::driver::result::free_async(pointer, stream.cu_stream()).map_err(|e| format!("memory pool: {e}"))?;
    }
    stream.synchronize().map_err(|e| format!("memory pool: {e}"))
}

type DeviceTable = Mutex<HashMap<usize, std::result::Result<Arc<CudaDevice>, String>>>;

/// The device `ordinal`, opened on first use (kernels compiled or read from
/// the cache), with its budget set from `memory_limit` and its pinned pool
/// limited to `pinned_bytes`.
pub(crate) fn device(
    ordinal: usize,
    memory_limit: MemoryLimit,
    pinned_bytes: u64,
) -> std::result::Result<Arc<CudaDevice>, String> {
    static DEVICES: OnceLock<DeviceTable> = OnceLock::new();
    let table = DEVICES.get_or_init(Default::default);
    let device = {
        let mut table = table.lock().map_err(|_| "the CUDA device table is poisoned".to_string())?;
        table
            .entry(ordinal)
            .or_insert_with(|| {
                let opened = open(ordinal).map(Arc::new);
                match &opened {
                    Ok(device) => {
                        log::info!("gpu_join: CUDA device {ordinal} ({}) ready", device.name)
                    }
                    Err(why) => log::info!("gpu_join: CUDA device {ordinal} not usable: {why}"),
                }
                opened
            })
            .clone()?
    };
    device.pinned.set_limit(pinned_bytes);
    let (total, free) = device.memory_info().map_err(|e| e.to_string())?;
    if device.budget.limit() == 0 || memory_limit != MemoryLimit::Auto {
        device.budget.set_limit(memory_limit.resolve(total, free + device.budget.used()));
        // Without the reservation joins still run, growing the pool as they go.
        if let Err(why) = reserve_pool(&device.context, device.budget.limit()) {
            log::info!("gpu_join: device memory pool not reserved: {why}");
        }
    }
    Ok(device)
}

impl CudaDevice {
    /// Staging buffers from the device's pool, or new ones.
    pub(crate) fn take_staging(&self) -> Result<Staging> {
        match self.staging.lock().ok().and_then(|mut pool| pool.pop()) {
            Some(staging) => Ok(staging),
            None => Staging::new(&self.context),
        }
    }

    pub(crate) fn return_staging(&self, staging: Staging) {
        if let Ok(mut pool) = self.staging.lock() {
            pool.push(staging);
        }
    }
}
