//! The join primitives ([`JoinBackend`]) on a CUDA device: each a few
//! kernel launches on the instance's stream, written in the files beside.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef};
use arrow::buffer::Buffer;
use arrow::datatypes::DataType;
use datafusion::common::exec_datafusion_err;
use datafusion::error::Result;

use super::column::CudaColumn;
use super::device::CudaDevice;
use super::launch::CudaBackend;
use super::matching::CudaHashTables;
use super::memory::{DIRECT_TRANSFER_BYTES, DeviceBuffer, Instance};
use super::transform::Digits;
use crate::backend::{
    Admission, Candidates, ColumnRows, Comparison, DeviceCounters, Element, Fill, Groups, JoinBackend, MAX_CANDIDATES,
    MatchFlags, PartitionSpec, Reduction, SortSpec, Space, TransferMemory, Transformed,
};
use crate::keys::{NormalizedKey, RawCodes};

/// Build partitions are sized to fill about a third of a work unit's hash
/// table on average, so that few partitions need splitting.
const PARTITION_TARGET_ROWS: usize = 2048;

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

    fn candidate_limit(&self) -> usize {
        self.candidate_limit
    }

    fn with_candidate_limit(self, limit: usize) -> Self {
        Self { candidate_limit: limit, ..self }
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
        if bytes <= DIRECT_TRANSFER_BYTES {
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

    fn hash_mark<K: NormalizedKey>(
        &self,
        build: &Transformed<Self, K>,
        tables: &CudaHashTables,
        probe: &Transformed<Self, K>,
        spaces: (Space, Space),
        flags: MatchFlags<'_, Self>,
    ) -> Result<()> {
        self.hash_mark_keys(build, tables, probe, spaces, flags)
    }

    fn merge_mark<K: NormalizedKey>(
        &self,
        build: &Transformed<Self, K>,
        probe: &Transformed<Self, K>,
        spaces: (Space, Space),
        flags: MatchFlags<'_, Self>,
    ) -> Result<()> {
        self.merge_mark_keys(build, probe, spaces, flags)
    }

    fn directory_mark<K: NormalizedKey>(
        &self,
        build: &Transformed<Self, K>,
        directory: &DeviceBuffer<u32>,
        probe: &DeviceBuffer<K>,
        build_space: Space,
        flags: MatchFlags<'_, Self>,
    ) -> Result<()> {
        self.directory_mark_keys(build, directory, probe, build_space, flags)
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

    fn group_rows<K: NormalizedKey>(
        &self,
        keys: &DeviceBuffer<K>,
        reductions: &[(Reduction, Option<&CudaColumn>)],
    ) -> Result<Groups> {
        self.group_keys(keys, reductions)
    }
}
