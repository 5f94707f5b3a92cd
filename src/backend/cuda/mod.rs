//! The CUDA backend: the join primitives as CUDA kernels (in `kernels/`),
//! compiled at run time by NVRTC, with cudarc loading the driver and NVRTC
//! dynamically, so that the same binary runs with or without a GPU.

mod column;
mod compaction;
mod device;
mod directory;
mod filter;
mod kernels;
mod matching;
mod memory;
mod pinned;
mod transform;
mod uncached;

use std::sync::Arc;

use arrow::array::{Array, ArrayRef};
use arrow::buffer::Buffer;
use arrow::datatypes::DataType;
use cudarc::driver::{LaunchConfig, PushKernelArg};
use datafusion::common::exec_datafusion_err;
use datafusion::error::Result;

pub use column::CudaColumn;
pub use device::CudaDevice;
pub use kernels::compile_kernels;
pub use matching::CudaHashTables;
pub use memory::DeviceBuffer;

use super::{
    Admission, Candidates, ColumnRows, Comparison, DeviceCounters, Element, Fill, JoinBackend, MAX_CANDIDATES,
    PartitionSpec, SortSpec, Space, TransferMemory, Transformed, check_candidates_within,
};
use crate::config::GpuJoinConfig;
use crate::keys::{NormalizedKey, RawCodes};
use memory::Instance;
use transform::Digits;

/// Threads per block of every kernel (BLOCK in common.cuh).
const BLOCK: u32 = 256;
/// Build partitions are sized to fill about a third of a work unit's hash
/// table on average, so that few partitions need splitting.
const PARTITION_TARGET_ROWS: usize = 2048;

/// Why no CUDA device can be used, or `Ok` when the driver and NVRTC load.
pub(crate) fn probe_libraries() -> Result<(), String> {
    // cudarc panics on first use when a library is missing, so look first.
    // SAFETY: only tries to load the shared libraries by name.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("the CUDA driver library (libcuda) was not found".into());
    }
    // SAFETY: as above.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err("the NVRTC library (libnvrtc) was not found".into());
    }
    Ok(())
}

/// The session's CUDA device, opened once per process.
pub(crate) fn open_device(options: &GpuJoinConfig) -> Result<Arc<CudaDevice>, String> {
    device::device(options.device, options.memory_limit, options.pinned_pool_bytes as u64)
}

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
    instance: Instance,
    /// The most candidate pairs one match call produces.
    candidate_limit: usize,
}

impl CudaBackend {
    /// This instance with match calls of up to `limit` pairs, for joins of
    /// whole relations in device memory (the kernel benchmark's). The
    /// operator sizes its probe chunks by [`crate::backend::MAX_CANDIDATES`],
    /// the limit an instance opens with, which bounds the memory one
    /// chunk's pairs take.
    pub fn with_candidate_limit(self, limit: usize) -> Self {
        Self { candidate_limit: limit, ..self }
    }

    /// A resource error when `total` candidate pairs are more than one
    /// match call of this instance may produce.
    fn check_candidates(&self, total: u64) -> Result<usize> {
        check_candidates_within(total, self.candidate_limit)
    }

    /// Launches `kernel` over `threads` threads.
    fn launch(&self, kernel: &str, threads: u64, shared: u32, args: &[Arg]) -> Result<()> {
        self.launch_blocks(kernel, threads.div_ceil(u64::from(BLOCK)), shared, threads, args)
    }

    /// Launches `kernel` with `blocks` blocks; `rows` is for error messages.
    fn launch_blocks(&self, kernel: &str, blocks: u64, shared: u32, rows: u64, args: &[Arg]) -> Result<()> {
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
    fn synchronize(&self, what: &str) -> Result<()> {
        self.instance.synchronize(what)
    }
}

impl JoinBackend for CudaBackend {
    type Vector<T: Element> = DeviceBuffer<T>;
    type Column = CudaColumn;
    type Flags = DeviceBuffer<u8>;
    type Device = Arc<CudaDevice>;
    type HashTables = CudaHashTables;

    /// GFTR: the GFTR paper finds it best for most joins on GPUs.
    const PREFERRED_GATHER_SPACE: Space = Space::Transformed;

    fn open(device: &Arc<CudaDevice>, counters: Arc<DeviceCounters>) -> Result<Self> {
        let instance = Instance::new(Arc::clone(device), Arc::new(device.stream()?), counters);
        Ok(Self { instance, candidate_limit: MAX_CANDIDATES })
    }

    fn detached(&self) -> Result<Self> {
        Self::open(&self.instance.device, Arc::new(DeviceCounters::default()))
    }

    fn admission(device: &Arc<CudaDevice>) -> &Admission {
        &device.admission
    }

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn device_label(&self) -> Option<String> {
        Some(self.instance.device.label.clone())
    }

    fn counters(&self) -> &DeviceCounters {
        &self.instance.counters
    }

    fn finish(&self) -> Result<()> {
        self.synchronize("finishing GPU work")
    }

    fn partition_target_rows(&self) -> usize {
        PARTITION_TARGET_ROWS
    }

    fn memory_budget(&self) -> Option<u64> {
        Some(self.instance.device.budget.limit())
    }

    fn upload_with<T: Element>(&self, len: usize, fill: Fill<'_, T>) -> Result<DeviceBuffer<T>> {
        DeviceBuffer::upload_with(&self.instance, len, fill, "a vector")
    }

    fn download<T: Element>(&self, vector: &DeviceBuffer<T>) -> Result<Vec<T>> {
        vector.download("a vector")
    }

    fn len<T: Element>(&self, vector: &DeviceBuffer<T>) -> usize {
        vector.len()
    }

    /// Transfers of 1 MiB or less skip the pool: a block would stay lent
    /// for as long as the small column over it is kept.
    fn transfer_memory(&self, bytes: usize) -> Option<Box<dyn TransferMemory>> {
        if bytes <= memory::DIRECT_TRANSFER_BYTES {
            return None;
        }
        let loan = self.instance.device.pinned.lend(bytes)?;
        Some(Box::new(loan))
    }

    fn joined_in_place(&self, arrays: &[&dyn Array], width: usize) -> Option<Buffer> {
        self.instance.device.pinned.joined(&self.pieces_in_place(arrays, width)?)
    }

    fn upload_values_in_place<T: Element>(&self, arrays: &[&dyn Array]) -> Result<Option<DeviceBuffer<T>>> {
        let Some(pieces) = self.pieces_in_place(arrays, size_of::<T>()) else {
            return Ok(None);
        };
        // Each piece holds whole values of `T`, so their bytes end to end do.
        let in_place = DeviceBuffer::<u8>::upload_in_place(&self.instance, &pieces, "values in place")?;
        Ok(in_place.map(|bytes| {
            let len = bytes.len() / size_of::<T>();
            bytes.into_typed(len)
        }))
    }

    fn upload_column(&self, array: &ArrayRef) -> Result<CudaColumn> {
        self.upload_array(array)
    }

    fn upload_values(
        &self,
        data_type: &DataType,
        rows: usize,
        fill: Fill<'_, u8>,
        arrays: &[&dyn Array],
    ) -> Result<CudaColumn> {
        self.upload_filled_array(data_type, rows, fill, arrays)
    }

    fn download_column(&self, column: &CudaColumn) -> Result<ArrayRef> {
        self.download_array(column)
    }

    fn partition<K: NormalizedKey>(
        &self,
        keys: &DeviceBuffer<K>,
        payloads: &[&CudaColumn],
        with_row_ids: bool,
        spec: PartitionSpec,
    ) -> Result<Transformed<Self, K>> {
        self.transform(keys, payloads, with_row_ids, Digits::Partition(spec))
    }

    fn sort<K: NormalizedKey>(
        &self,
        keys: &DeviceBuffer<K>,
        payloads: &[&CudaColumn],
        with_row_ids: bool,
        spec: SortSpec,
    ) -> Result<Transformed<Self, K>> {
        self.transform(keys, payloads, with_row_ids, Digits::Key(spec))
    }

    fn hash_tables<K: NormalizedKey>(&self, build: &Transformed<Self, K>) -> Result<CudaHashTables> {
        self.hash_tables_of(build)
    }

    fn hash_match<K: NormalizedKey>(
        &self,
        build: &Transformed<Self, K>,
        tables: &CudaHashTables,
        probe: &Transformed<Self, K>,
        spaces: (Space, Space),
    ) -> Result<Candidates<Self>> {
        self.hash_match_keys(build, tables, probe, spaces)
    }

    fn merge_match<K: NormalizedKey>(
        &self,
        build: &Transformed<Self, K>,
        probe: &Transformed<Self, K>,
        spaces: (Space, Space),
    ) -> Result<Candidates<Self>> {
        self.merge_match_keys(build, probe, spaces)
    }

    fn directory<K: NormalizedKey>(&self, build: &Transformed<Self, K>, codes: u32) -> Result<DeviceBuffer<u32>> {
        self.directory_of(build, codes)
    }

    fn directory_match<K: NormalizedKey>(
        &self,
        build: &Transformed<Self, K>,
        directory: &DeviceBuffer<u32>,
        probe: &DeviceBuffer<K>,
        build_space: Space,
    ) -> Result<Candidates<Self>> {
        self.directory_match_keys(build, directory, probe, build_space)
    }

    fn gather_positions(&self, values: &DeviceBuffer<u32>, positions: &DeviceBuffer<u32>) -> Result<DeviceBuffer<u32>> {
        let out = DeviceBuffer::<u32>::alloc(&self.instance, positions.len(), "gathered positions")?;
        let n = positions.len() as u64;
        self.launch(
            "gather_positions",
            n,
            0,
            &[values.pointer().into(), positions.pointer().into(), n.into(), out.pointer().into()],
        )?;
        Ok(out)
    }

    fn gather_column(
        &self,
        column: &CudaColumn,
        positions: &DeviceBuffer<u32>,
        may_hold_nulls: bool,
    ) -> Result<CudaColumn> {
        self.gather_array(column, positions, may_hold_nulls)
    }

    fn select(&self, values: &DeviceBuffer<u32>, keep: &DeviceBuffer<u8>) -> Result<DeviceBuffer<u32>> {
        self.compact(keep, true, Some(values))
    }

    fn sequence(&self, len: usize) -> Result<DeviceBuffer<u32>> {
        let mut out = DeviceBuffer::<u32>::alloc(&self.instance, len, "a sequence")?;
        let n = len as u64;
        self.launch("sequence", n, 0, &[out.pointer().into(), n.into()])?;
        out.mark_sequence();
        Ok(out)
    }

    fn raw_codes(&self, mut values: DeviceBuffer<u32>, codes: RawCodes) -> Result<DeviceBuffer<u32>> {
        let n = values.len() as u64;
        let RawCodes { lo, span, shift } = codes;
        self.launch("raw_codes_u32", n, 0, &[values.pointer().into(), n.into(), lo.into(), span.into(), shift.into()])?;
        values.mark_rewritten();
        Ok(values)
    }

    fn null_positions(&self, len: usize) -> Result<DeviceBuffer<u32>> {
        DeviceBuffer::filled(&self.instance, len, 0xFF, "null positions")
    }

    fn concat(&self, first: &DeviceBuffer<u32>, second: &DeviceBuffer<u32>) -> Result<DeviceBuffer<u32>> {
        let mut out = DeviceBuffer::<u32>::alloc(&self.instance, first.len() + second.len(), "concatenated positions")?;
        out.copy_from(0, first, "concatenating positions")?;
        out.copy_from(first.len(), second, "concatenating positions")?;
        Ok(out)
    }

    fn compare_rows(
        &self,
        op: Comparison,
        left: ColumnRows<'_, Self>,
        right: ColumnRows<'_, Self>,
        and: Option<&DeviceBuffer<u8>>,
    ) -> Result<DeviceBuffer<u8>> {
        self.compare_columns(op, left, right, and)
    }

    fn scatter_permutation(
        &self,
        positions: &DeviceBuffer<u32>,
        values: &DeviceBuffer<u32>,
        len: usize,
    ) -> Result<Option<DeviceBuffer<u32>>> {
        self.scatter_if_permutation(positions, values, len)
    }

    fn sort_pairs(
        &self,
        keys: &DeviceBuffer<u32>,
        values: &DeviceBuffer<u32>,
    ) -> Result<(DeviceBuffer<u32>, DeviceBuffer<u32>)> {
        let (sorted_keys, mut moved, _) =
            self.radix_transform(keys, &[(values.pointer(), 4)], false, Digits::Key(SortSpec::full::<u32>()))?;
        let sorted_values = moved.pop().ok_or_else(|| exec_datafusion_err!("sort_pairs lost its values"))?;
        Ok((sorted_keys, sorted_values.into_typed(keys.len())))
    }

    fn new_flags(&self, len: usize) -> Result<DeviceBuffer<u8>> {
        DeviceBuffer::filled(&self.instance, len, 0, "flags")
    }

    fn set_flags(&self, flags: &DeviceBuffer<u8>, positions: &DeviceBuffer<u32>) -> Result<()> {
        let n = positions.len() as u64;
        self.launch("set_flags", n, 0, &[flags.pointer().into(), positions.pointer().into(), n.into()])
    }

    fn flagged(&self, flags: &DeviceBuffer<u8>, value: bool) -> Result<DeviceBuffer<u32>> {
        self.compact(flags, value, None)
    }

    fn download_flags(&self, flags: &DeviceBuffer<u8>) -> Result<Vec<bool>> {
        // The flags are read on the stream of the instance that allocated
        // them (a build side's); wait for the flags this instance set.
        self.finish()?;
        Ok(flags.download("flags")?.into_iter().map(|f| f != 0).collect())
    }
}
