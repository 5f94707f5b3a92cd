//! Device buffers and host transfers.
//!
//! Buffers come from the device's stream-ordered memory pool, within the
//! GPU join's memory budget, and go back to it when dropped. Uploads are
//! written by their producer (a copy, or the key encoder) straight into
//! pinned memory, by stores that bypass the CPU's caches, so that no host
//! copy of their values is made on the way: into a block of the pinned
//! pool when it has one to spare, a slice at a time, each slice's transfer
//! only enqueued, else into two pinned staging buffers; either way filling
//! one part overlaps the transfer of the one before. Large downloads go
//! through the staging buffers unless their target is pinned.

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use arrow::buffer::Buffer;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaEvent, result};
use datafusion::common::resources_datafusion_err;
use datafusion::error::Result;
use rayon::prelude::*;

use super::device::{CudaDevice, PooledStream};
use super::driver::cuda_error;
use super::staging::STAGING_BYTES;
use super::uncached::fill_uncached;
use crate::backend::{DeviceCounters, Fill, TransferMemory};

/// Transfers up to this size skip the staging buffers.
pub(crate) const DIRECT_TRANSFER_BYTES: usize = 1 << 20;
/// Bytes of a staging buffer each rayon task fills or empties: a multiple
/// of every element size, so that pieces hold whole elements.
const PIECE_BYTES: usize = 1 << 20;
/// An upload through a pinned block is filled, and its transfer enqueued,
/// this many bytes at a time: a multiple of [`PIECE_BYTES`].
const UPLOAD_SLICE_BYTES: usize = 32 << 20;

/// What a backend instance allocates and transfers with: its device, its
/// stream, and the counters of the join it serves.
#[derive(Debug, Clone)]
pub(crate) struct Instance {
    pub device: Arc<CudaDevice>,
    pub stream: Arc<PooledStream>,
    pub counters: Arc<DeviceCounters>,
    /// Host memory that transfers enqueued on the stream still read.
    pub reads: Arc<PendingReads>,
}

impl Instance {
    pub fn new(device: Arc<CudaDevice>, stream: Arc<PooledStream>, counters: Arc<DeviceCounters>) -> Self {
        let reads = Arc::new(PendingReads { stream: Arc::clone(&stream), buffers: Mutex::default() });
        Self { device, stream, counters, reads }
    }

    /// Waits for the stream's work; the host memory its transfers read is
    /// let go.
    pub fn synchronize(&self, what: &str) -> Result<()> {
        self.stream.synchronize().map_err(|e| cuda_error(what, e))?;
        self.reads.release();
        Ok(())
    }
}

/// Pinned host buffers read by transfers that were enqueued without being
/// waited for, kept alive until the stream is waited for: until then their
/// blocks must not go back to the pool, where another user would write them.
#[derive(Debug)]
pub(crate) struct PendingReads {
    stream: Arc<PooledStream>,
    buffers: Mutex<Vec<Buffer>>,
}

impl PendingReads {
    fn hold(&self, buffer: Buffer) {
        if let Ok(mut buffers) = self.buffers.lock() {
            buffers.push(buffer);
        }
    }

    fn release(&self) {
        if let Ok(mut buffers) = self.buffers.lock() {
            buffers.clear();
        }
    }
}

impl Drop for PendingReads {
    fn drop(&mut self) {
        let held = self.buffers.get_mut().map(|b| !b.is_empty()).unwrap_or(true);
        if held && let Err(e) = self.stream.synchronize() {
            log::warn!("gpu_join: waiting for transfers from host memory failed: {e}");
        }
    }
}

/// A typed array in device memory.
#[derive(Debug)]
pub struct DeviceBuffer<T> {
    pointer: CUdeviceptr,
    len: usize,
    bytes: u64,
    instance: Instance,
    known: KnownPositions,
    _element: PhantomData<T>,
}

/// What the writer of a buffer of positions knows of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KnownPositions {
    Nothing,
    /// Each of 0, 1, .., len - 1 once: scattering by them needs no check.
    EachOnce,
    /// 0, 1, .., len - 1 in order: gathers by them return their source.
    Sequence,
}

/// Makes the device's context current on the calling thread, as the driver
/// calls below need (work runs on whichever blocking thread tokio picks).
fn bind(instance: &Instance, what: &str) -> Result<()> {
    instance.device.context.bind_to_thread().map_err(|e| cuda_error(what, e))
}

impl<T: Copy> DeviceBuffer<T> {
    /// `len` uninitialised elements.
    pub(crate) fn alloc(instance: &Instance, len: usize, what: &str) -> Result<Self> {
        // An empty buffer still gets a valid pointer.
        let bytes = (len.max(1) * size_of::<T>()) as u64;
        bind(instance, what)?;
        instance.counters.check_injected_failure(bytes, what)?;
        instance.device.budget.reserve(bytes, what)?;
        // SAFETY: the stream belongs to the device's context.
        match unsafe { result::malloc_async(instance.stream.cu_stream(), bytes as usize) } {
            Ok(pointer) => {
                instance.counters.record_alloc(bytes);
                Ok(Self {
                    pointer,
                    len,
                    bytes,
                    instance: instance.clone(),
                    known: KnownPositions::Nothing,
                    _element: PhantomData,
                })
            }
            Err(e) => {
                instance.device.budget.release(bytes);
                // Out of device memory is a resource error like a spent
                // budget: the operator retries smaller or falls back.
                Err(resources_datafusion_err!("GPU join: allocating {bytes} bytes for {what} failed: {e}"))
            }
        }
    }

    /// `len` elements whose bytes are all `byte`.
    pub(crate) fn filled(instance: &Instance, len: usize, byte: u8, what: &str) -> Result<Self> {
        let mut buffer = Self::alloc(instance, len, what)?;
        buffer.fill(byte, what)?;
        Ok(buffer)
    }

    /// Sets every byte to `byte`, in stream order.
    pub(crate) fn fill(&mut self, byte: u8, what: &str) -> Result<()> {
        self.known = KnownPositions::Nothing;
        bind(&self.instance, what)?;
        // SAFETY: writes within the allocation, on its stream.
        unsafe { result::memset_d8_async(self.pointer, byte, self.bytes as usize, self.instance.stream.cu_stream()) }
            .map_err(|e| cuda_error(&format!("clearing {what}"), e))
    }

    pub fn download(&self, what: &str) -> Result<Vec<T>> {
        let mut host: Vec<T> = Vec::with_capacity(self.len);
        // SAFETY: the bytes are all written by the copy before `set_len`.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(host.as_mut_ptr().cast::<u8>(), self.len * size_of::<T>()) };
        download_bytes(&self.instance, self.pointer, bytes, what)?;
        // SAFETY: initialised above.
        unsafe { host.set_len(self.len) };
        Ok(host)
    }

    /// Copies the whole buffer into `host`, which must have its size in bytes.
    pub fn download_into(&self, host: &mut [u8], what: &str) -> Result<()> {
        if host.len() != self.len * size_of::<T>() {
            return Err(datafusion::common::internal_datafusion_err!(
                "{what}: {} bytes into {}",
                self.len * size_of::<T>(),
                host.len()
            ));
        }
        download_bytes(&self.instance, self.pointer, host, what)
    }

    /// Element `index`, read back to the host.
    pub fn download_at(&self, index: usize, what: &str) -> Result<T> {
        if index >= self.len.max(1) {
            return Err(datafusion::common::internal_datafusion_err!("{what}: element {index} of {}", self.len));
        }
        let mut value = std::mem::MaybeUninit::<T>::uninit();
        // SAFETY: the copy fills all bytes of `value`.
        let bytes = unsafe { std::slice::from_raw_parts_mut(value.as_mut_ptr().cast::<u8>(), size_of::<T>()) };
        download_bytes(&self.instance, self.pointer + (index * size_of::<T>()) as u64, bytes, what)?;
        // SAFETY: initialised by the copy.
        Ok(unsafe { value.assume_init() })
    }

    /// The same memory seen as `len` elements of another type.
    pub fn into_typed<U: Copy>(self, len: usize) -> DeviceBuffer<U> {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped; its fields move into the result.
        let instance = unsafe { std::ptr::read(&this.instance) };
        DeviceBuffer {
            pointer: this.pointer,
            len,
            bytes: this.bytes,
            instance,
            known: KnownPositions::Nothing,
            _element: PhantomData,
        }
    }

    pub fn pointer(&self) -> u64 {
        self.pointer
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Records that the buffer holds 0, 1, .., len - 1, as its writer knows.
    pub(crate) fn mark_sequence(&mut self) {
        self.known = KnownPositions::Sequence;
    }

    /// Whether the buffer is known to hold 0, 1, .., len - 1.
    pub(crate) fn is_sequence(&self) -> bool {
        self.known == KnownPositions::Sequence
    }

    /// Records that the buffer holds each of 0, 1, .., len - 1 once, in
    /// some order, as its writer knows.
    pub(crate) fn mark_each_once(&mut self) {
        self.known = KnownPositions::EachOnce;
    }

    /// Whether the buffer is known to hold each of 0, 1, .., len - 1 once.
    pub(crate) fn holds_each_once(&self) -> bool {
        self.known != KnownPositions::Nothing
    }

    /// Records that the buffer's values were changed in place.
    pub(crate) fn mark_rewritten(&mut self) {
        self.known = KnownPositions::Nothing;
    }

    /// Keeps the first `len` elements (the allocation stays).
    pub fn truncate(&mut self, len: usize) {
        // The first elements of a sequence are one; of a permutation, not.
        if len < self.len && self.known == KnownPositions::EachOnce {
            self.known = KnownPositions::Nothing;
        }
        self.len = self.len.min(len);
    }

    /// Copies `source` into this buffer from element `at` on.
    pub fn copy_from(&mut self, at: usize, source: &DeviceBuffer<T>, what: &str) -> Result<()> {
        if at + source.len > self.len {
            return Err(datafusion::common::internal_datafusion_err!("{what}: copy past the end of a buffer"));
        }
        let bytes = source.len * size_of::<T>();
        self.known = KnownPositions::Nothing;
        bind(&self.instance, what)?;
        // SAFETY: both ranges lie within their allocations.
        unsafe {
            result::memcpy_dtod_async(
                self.pointer + (at * size_of::<T>()) as u64,
                source.pointer,
                bytes,
                self.instance.stream.cu_stream(),
            )
        }
        .map_err(|e| cuda_error(what, e))
    }
}

impl<T: Copy + Sync> DeviceBuffer<T> {
    /// `host` through the staging buffers; memory of the pinned pool goes
    /// by [`DeviceBuffer::upload_buffer`] instead.
    pub(crate) fn upload(instance: &Instance, host: &[T], what: &str) -> Result<Self> {
        Self::upload_with(
            instance,
            host.len(),
            &|first, out| {
                out.copy_from_slice(&host[first..first + out.len()]);
                Ok(())
            },
            what,
        )
    }

    /// `len` elements whose host values `fill` writes, in parallel pieces,
    /// straight into the memory the transfer reads.
    pub(crate) fn upload_with(instance: &Instance, len: usize, fill: Fill<'_, T>, what: &str) -> Result<Self> {
        let buffer = Self::alloc(instance, len, what)?;
        let width = size_of::<T>();
        let fill_bytes = |offset: usize, bytes: &mut [u8]| {
            // SAFETY: pieces start at multiples of the element size (of
            // PIECE_BYTES, or of the scratch size of `fill_uncached`) in
            // buffers aligned for any element, and every bit pattern of the
            // bytes is overwritten by `fill`.
            let out = unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<T>(), bytes.len() / width) };
            fill(offset / width, out)
        };
        upload_bytes(instance, len * width, buffer.pointer, &fill_bytes, what)?;
        Ok(buffer)
    }
}

impl DeviceBuffer<u8> {
    /// Bytes `range` of an Arrow buffer. From pinned memory the transfer is
    /// only enqueued, and `host` is held until the stream is next waited
    /// for, so that transfers of several columns, and the encoding of keys
    /// on the host, overlap; from other memory the bytes are copied first,
    /// as [`DeviceBuffer::upload`] copies them.
    pub(crate) fn upload_buffer(instance: &Instance, host: &Buffer, range: Range<usize>, what: &str) -> Result<Self> {
        let bytes = host
            .as_slice()
            .get(range.clone())
            .ok_or_else(|| datafusion::common::internal_datafusion_err!("{what}: bytes {range:?} of {}", host.len()))?;
        if !instance.device.pinned.holds(bytes) {
            return Self::upload(instance, bytes, what);
        }
        let buffer = Self::alloc(instance, bytes.len(), what)?;
        bind(instance, what)?;
        instance.counters.record_upload(bytes.len() as u64);
        // SAFETY: the destination holds bytes.len() bytes; the source stays
        // alive and unwritten (held below) until the stream is waited for.
        unsafe { result::memcpy_htod_async(buffer.pointer, bytes, instance.stream.cu_stream()) }
            .map_err(|e| cuda_error(what, e))?;
        instance.reads.hold(host.clone());
        Ok(buffer)
    }

    /// The bytes of `pieces` end to end, moved from where they lie, where
    /// each lies in a pinned block (a table kept in pinned memory); `None`,
    /// with nothing moved, where one does not. Each run of them that lies
    /// end to end within one block goes in one transfer, enqueued and not
    /// waited for, its pieces held as [`DeviceBuffer::upload_buffer`] holds
    /// its source.
    pub(crate) fn upload_in_place(instance: &Instance, pieces: &[Buffer], what: &str) -> Result<Option<Self>> {
        let runs = match instance.device.pinned.runs(pieces) {
            Some(runs) if !runs.is_empty() => runs,
            _ => return Ok(None),
        };
        let len = runs.iter().map(Buffer::len).sum();
        let buffer = Self::alloc(instance, len, what)?;
        bind(instance, what)?;
        instance.counters.record_upload(len as u64);
        let mut at = 0;
        for run in runs {
            // SAFETY: the destination holds the runs' bytes end to end; the
            // run stays alive and unwritten (held below) until the stream is
            // waited for.
            unsafe {
                result::memcpy_htod_async(buffer.pointer + at as u64, run.as_slice(), instance.stream.cu_stream())
            }
            .map_err(|e| cuda_error(what, e))?;
            at += run.len();
            instance.reads.hold(run);
        }
        Ok(Some(buffer))
    }
}

impl<T> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        let freed = bind(&self.instance, "freeing device memory").and_then(|_| {
            // SAFETY: allocated on this stream; work that used it is ordered before.
            unsafe { result::free_async(self.pointer, self.instance.stream.cu_stream()) }
                .map_err(|e| cuda_error("freeing device memory", e))
        });
        if let Err(e) = freed {
            log::warn!("gpu_join: freeing {} bytes of device memory failed: {e}", self.bytes);
        }
        self.instance.device.budget.release(self.bytes);
        self.instance.counters.record_free(self.bytes);
    }
}

fn parallel_copy(from: &[u8], to: &mut [u8]) {
    to.par_chunks_mut(PIECE_BYTES).zip(from.par_chunks(PIECE_BYTES)).for_each(|(t, f)| t.copy_from_slice(f));
}

/// Fills pinned `bytes` in pieces on rayon's threads, past the caches (see
/// [`fill_uncached`]); piece offsets are relative to `first`, the offset of
/// `bytes` in the whole transfer.
fn parallel_fill(first: usize, bytes: &mut [u8], fill: &(dyn Fn(usize, &mut [u8]) -> Result<()> + Sync)) -> Result<()> {
    bytes
        .par_chunks_mut(PIECE_BYTES)
        .enumerate()
        .try_for_each(|(i, piece)| fill_uncached(first + i * PIECE_BYTES, piece, fill))
}

fn staging_events(instance: &Instance) -> Result<[CudaEvent; 2]> {
    let flags = Some(super::device::SLEEPING_EVENT);
    let context = &instance.device.context;
    Ok([
        context.new_event(flags).map_err(|e| cuda_error("creating an event", e))?,
        context.new_event(flags).map_err(|e| cuda_error("creating an event", e))?,
    ])
}

fn synchronize(instance: &Instance, what: &str) -> Result<()> {
    instance.synchronize(what)
}

/// One transfer of pageable `host` to `destination`, enqueued, not waited
/// for: the driver has staged pageable bytes by the time the call returns,
/// so `host` may go at once. Waiting held a join's thread, at each of its
/// radix passes (whose column descriptors come this way), behind every
/// transfer that other streams had queued on the copy engine.
fn upload_direct(instance: &Instance, host: &[u8], destination: CUdeviceptr, what: &str) -> Result<()> {
    // SAFETY: the destination holds at least host.len() bytes; the source
    // is read before the call returns (pageable memory is staged).
    unsafe { result::memcpy_htod_async(destination, host, instance.stream.cu_stream()) }
        .map_err(|e| cuda_error(what, e))
}

/// Uploads `len` bytes that `fill` writes to `destination`; ordered before
/// later work on the instance's stream, complete once it is waited for.
fn upload_bytes(
    instance: &Instance,
    len: usize,
    destination: CUdeviceptr,
    fill: &(dyn Fn(usize, &mut [u8]) -> Result<()> + Sync),
    what: &str,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    bind(instance, what)?;
    instance.counters.record_upload(len as u64);
    let stream = instance.stream.cu_stream();
    if len <= DIRECT_TRANSFER_BYTES {
        // Small transfers: a pageable copy costs less than the staging.
        let mut host = vec![0u8; len + 16];
        // Aligned for any element, as the staging buffers are.
        let start = host.as_ptr().align_offset(16);
        let host = &mut host[start..start + len];
        fill(0, host)?;
        return upload_direct(instance, host, destination, what);
    }
    if let Some(mut loan) = instance.device.pinned.lend(len) {
        // Pinned memory to spare: filled on every core a slice at a time,
        // each slice's transfer enqueued without waiting as soon as it is
        // filled, so that the link carries one slice while the host fills
        // the next; the memory is held as a column's is (see
        // `upload_buffer`), not sent through the staging buffers, which
        // wait on each.
        let filled = loan.bytes_mut(len)?.chunks_mut(UPLOAD_SLICE_BYTES).enumerate().try_for_each(|(i, slice)| {
            let first = i * UPLOAD_SLICE_BYTES;
            parallel_fill(first, slice, fill)?;
            // SAFETY: the destination holds `len` bytes; the slice stays
            // alive and unwritten (the loan is held below, or waited for on
            // failure) until the stream is waited for.
            unsafe { result::memcpy_htod_async(destination + first as u64, &*slice, stream) }
                .map_err(|e| cuda_error(what, e))
        });
        if let Err(e) = filled {
            // The slices enqueued still read the loan.
            synchronize(instance, what)?;
            return Err(e);
        }
        instance.reads.hold(Box::new(loan).into_buffer(len)?);
        return Ok(());
    }
    let mut staging = instance.device.take_staging()?;
    let events = staging_events(instance)?;
    for (i, first) in (0..len).step_by(STAGING_BYTES).enumerate() {
        let b = i % 2;
        if i >= 2 {
            events[b].synchronize().map_err(|e| cuda_error(what, e))?;
        }
        let pinned = staging.buffer(b, len - first);
        parallel_fill(first, pinned, fill)?;
        // SAFETY: the pinned buffer stays untouched until its event completes.
        unsafe { result::memcpy_htod_async(destination + first as u64, &*pinned, stream) }
            .map_err(|e| cuda_error(what, e))?;
        events[b].record(&instance.stream).map_err(|e| cuda_error(what, e))?;
    }
    synchronize(instance, what)?;
    instance.device.return_staging(staging);
    Ok(())
}

fn download_bytes(instance: &Instance, source: CUdeviceptr, host: &mut [u8], what: &str) -> Result<()> {
    if host.is_empty() {
        return Ok(());
    }
    bind(instance, what)?;
    instance.counters.record_download(host.len() as u64);
    let stream = instance.stream.cu_stream();
    // Small transfers, and pinned memory the device writes as it is, skip
    // the staging buffers.
    if host.len() <= DIRECT_TRANSFER_BYTES || instance.device.pinned.holds(host) {
        // SAFETY: the source holds at least host.len() bytes.
        unsafe { result::memcpy_dtoh_async(host, source, stream) }.map_err(|e| cuda_error(what, e))?;
        return synchronize(instance, what);
    }
    let mut staging = instance.device.take_staging()?;
    let events = staging_events(instance)?;
    let chunks: Vec<&mut [u8]> = host.chunks_mut(STAGING_BYTES).collect();
    let count = chunks.len();
    let mut pending: Option<&mut [u8]> = None;
    for (i, chunk) in chunks.into_iter().enumerate() {
        let b = i % 2;
        let pinned = staging.buffer(b, chunk.len());
        // SAFETY: the pinned buffer is not read until its event completes.
        unsafe { result::memcpy_dtoh_async(pinned, source + (i * STAGING_BYTES) as u64, stream) }
            .map_err(|e| cuda_error(what, e))?;
        events[b].record(&instance.stream).map_err(|e| cuda_error(what, e))?;
        // While chunk i transfers, copy chunk i - 1 out of its buffer.
        if let Some(previous) = pending.take() {
            let p = (i - 1) % 2;
            events[p].synchronize().map_err(|e| cuda_error(what, e))?;
            let len = previous.len();
            parallel_copy(staging.buffer(p, len), previous);
        }
        pending = Some(chunk);
    }
    if let Some(last) = pending {
        let p = (count - 1) % 2;
        events[p].synchronize().map_err(|e| cuda_error(what, e))?;
        let len = last.len();
        parallel_copy(staging.buffer(p, len), last);
    }
    instance.device.return_staging(staging);
    Ok(())
}
