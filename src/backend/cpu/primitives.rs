//! The join primitives ([`JoinBackend`]) in plain Rust, over vectors and
//! Arrow arrays in host memory.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use arrow::array::{Array, ArrayData, ArrayRef, make_array};
use arrow::buffer::MutableBuffer;
use arrow::compute::kernels::cmp;
use arrow::compute::take;
use arrow::datatypes::DataType;
use datafusion::common::{internal_datafusion_err, internal_err};
use datafusion::error::Result;

use rayon::prelude::*;

use super::instance::CpuBackend;
use super::matching::{self, ChainedTables};
use super::transform;
use crate::backend::{
    Admission, Candidates, ColumnRows, Comparison, DeviceCounters, Element, Fill, Groups, JoinBackend, MAX_CANDIDATES,
    MatchFlags, NULL_POSITION, PartitionSpec, Reduction, SortSpec, Space, TransferMemory, Transformed,
    check_candidates_within, check_compared, positions_to_indices,
};
use crate::keys::{NormalizedKey, RawCodes};
use crate::values::value_width;

/// Build partitions of about this many rows keep each co-partition's hash
/// table in a core's private cache.
const CPU_PARTITION_TARGET_ROWS: usize = 8 * 1024;

/// Elements each rayon task of an upload fills.
const FILL_PIECE: usize = 1 << 18;

/// Fills `values` in pieces on rayon's threads, as an upload's `fill` asks.
fn fill_in_pieces<T: Send>(values: &mut [T], fill: Fill<'_, T>) -> Result<()> {
    values.par_chunks_mut(FILL_PIECE).enumerate().try_for_each(|(i, piece)| fill(i * FILL_PIECE, piece))
}

impl JoinBackend for CpuBackend {
    type Vector<T: Element> = Vec<T>;
    type Column = ArrayRef;
    type Flags = Vec<AtomicBool>;
    type Device = ();
    type HashTables = ChainedTables;

    /// Gathering by row id skips permuting every payload column, which on
    /// a CPU costs more than the less clustered gather saves.
    const PREFERRED_GATHER_SPACE: Space = Space::Original;

    fn open(_device: &(), counters: Arc<DeviceCounters>) -> Result<Self> {
        Ok(Self { counters, candidate_limit: MAX_CANDIDATES })
    }

    fn detached(&self) -> Result<Self> {
        Ok(Self { counters: Arc::new(DeviceCounters::default()), ..self.clone() })
    }

    fn admission(_device: &()) -> &Admission {
        static ADMISSION: OnceLock<Admission> = OnceLock::new();
        ADMISSION.get_or_init(Admission::default)
    }

    fn name(&self) -> &'static str {
        "cpu"
    }

    /// The reference backend keeps `algorithm = auto` to fixed rules, so
    /// that its tests do not depend on timings.
    fn device_label(&self) -> Option<String> {
        None
    }

    fn counters(&self) -> &DeviceCounters {
        &self.counters
    }

    fn finish(&self) -> Result<()> {
        Ok(())
    }

    fn partition_target_rows(&self) -> usize {
        CPU_PARTITION_TARGET_ROWS
    }

    /// Host memory is DataFusion's to bound, through its memory pool.
    fn memory_budget(&self) -> Option<u64> {
        None
    }

    fn candidate_limit(&self) -> usize {
        self.candidate_limit
    }

    fn with_candidate_limit(self, limit: usize) -> Self {
        Self { candidate_limit: limit, ..self }
    }

    fn upload_with<T: Element>(&self, len: usize, fill: Fill<'_, T>) -> Result<Vec<T>> {
        self.counters.check_cancelled("an upload")?;
        self.counters.check_injected_failure((len * size_of::<T>()) as u64, "an upload")?;
        let mut values = vec![T::default(); len];
        fill_in_pieces(&mut values, fill)?;
        Ok(values)
    }

    fn download<T: Element>(&self, vector: &Vec<T>) -> Result<Vec<T>> {
        Ok(vector.clone())
    }

    fn len<T: Element>(&self, vector: &Vec<T>) -> usize {
        vector.len()
    }

    fn transfer_memory(&self, _bytes: usize) -> Option<Box<dyn TransferMemory>> {
        None
    }

    fn upload_column(&self, array: &ArrayRef) -> Result<ArrayRef> {
        Ok(Arc::clone(array))
    }

    fn upload_values(
        &self,
        data_type: &DataType,
        rows: usize,
        fill: Fill<'_, u8>,
        _: &[&dyn Array],
    ) -> Result<ArrayRef> {
        self.counters.check_cancelled("an upload")?;
        let width = value_width(data_type)
            .ok_or_else(|| internal_datafusion_err!("values of {data_type} do not lie end to end"))?;
        // Arrow buffers must be aligned for their values, a Vec<u8> is not.
        let mut values = MutableBuffer::from_len_zeroed(rows * width);
        fill_in_pieces(values.as_slice_mut(), fill)?;
        Ok(make_array(ArrayData::builder(data_type.clone()).len(rows).add_buffer(values.into()).build()?))
    }

    fn download_column(&self, column: &ArrayRef) -> Result<ArrayRef> {
        Ok(Arc::clone(column))
    }

    fn partition<K: NormalizedKey>(
        &self,
        keys: &Vec<K>,
        payloads: &[&ArrayRef],
        with_row_ids: bool,
        spec: PartitionSpec,
    ) -> Result<Transformed<Self, K>> {
        self.counters.check_injected_failure((keys.len() * size_of::<K>()) as u64, "a partition")?;
        transform::partition(keys, payloads, with_row_ids, spec)
    }

    fn sort<K: NormalizedKey>(
        &self,
        keys: &Vec<K>,
        payloads: &[&ArrayRef],
        with_row_ids: bool,
        spec: SortSpec,
    ) -> Result<Transformed<Self, K>> {
        self.counters.check_injected_failure((keys.len() * size_of::<K>()) as u64, "a sort")?;
        transform::sort(keys, payloads, with_row_ids, spec)
    }

    fn hash_tables<K: NormalizedKey>(&self, build: &Transformed<Self, K>) -> Result<ChainedTables> {
        matching::hash_tables(build)
    }

    fn hash_match<K: NormalizedKey>(
        &self,
        build: &Transformed<Self, K>,
        tables: &ChainedTables,
        probe: &Transformed<Self, K>,
        spaces: (Space, Space),
    ) -> Result<Candidates<Self>> {
        let pairs = matching::hash_match(build, tables, probe)?;
        check_candidates_within(pairs.len() as u64, self.candidate_limit)?;
        matching::into_spaces(pairs, build, probe, spaces)
    }

    fn merge_match<K: NormalizedKey>(
        &self,
        build: &Transformed<Self, K>,
        probe: &Transformed<Self, K>,
        spaces: (Space, Space),
    ) -> Result<Candidates<Self>> {
        let pairs = matching::merge_match(build, probe)?;
        check_candidates_within(pairs.len() as u64, self.candidate_limit)?;
        matching::into_spaces(pairs, build, probe, spaces)
    }

    fn directory<K: NormalizedKey>(&self, build: &Transformed<Self, K>, codes: u32) -> Result<Vec<u32>> {
        self.counters.check_injected_failure((u64::from(codes) + 1) * 4, "a directory")?;
        matching::directory(build, codes)
    }

    fn directory_match<K: NormalizedKey>(
        &self,
        build: &Transformed<Self, K>,
        directory: &Vec<u32>,
        probe: &Vec<K>,
        build_space: Space,
    ) -> Result<Candidates<Self>> {
        let candidates = matching::directory_match(build, directory, probe, build_space)?;
        check_candidates_within(candidates.probe.len() as u64, self.candidate_limit)?;
        Ok(candidates)
    }

    fn hash_mark<K: NormalizedKey>(
        &self,
        build: &Transformed<Self, K>,
        tables: &ChainedTables,
        probe: &Transformed<Self, K>,
        spaces: (Space, Space),
        flags: MatchFlags<'_, Self>,
    ) -> Result<()> {
        matching::hash_mark(build, tables, probe, spaces, flags)
    }

    fn merge_mark<K: NormalizedKey>(
        &self,
        build: &Transformed<Self, K>,
        probe: &Transformed<Self, K>,
        spaces: (Space, Space),
        flags: MatchFlags<'_, Self>,
    ) -> Result<()> {
        matching::merge_mark(build, probe, spaces, flags)
    }

    fn directory_mark<K: NormalizedKey>(
        &self,
        build: &Transformed<Self, K>,
        directory: &Vec<u32>,
        probe: &Vec<K>,
        build_space: Space,
        flags: MatchFlags<'_, Self>,
    ) -> Result<()> {
        matching::directory_mark(build, directory, probe, build_space, flags)
    }

    fn gather_positions(&self, values: &Vec<u32>, positions: &Vec<u32>) -> Result<Vec<u32>> {
        positions
            .iter()
            .map(|&p| match p {
                NULL_POSITION => Ok(NULL_POSITION),
                p => values.get(p as usize).copied().ok_or_else(|| {
                    datafusion::common::internal_datafusion_err!(
                        "gather_positions: position {p} out of {} values",
                        values.len()
                    )
                }),
            })
            .collect()
    }

    fn gather_column(&self, column: &ArrayRef, positions: &Vec<u32>, _may_hold_nulls: bool) -> Result<ArrayRef> {
        Ok(take(column.as_ref(), &positions_to_indices(positions), None)?)
    }

    fn select(&self, values: &Vec<u32>, keep: &Vec<u8>) -> Result<Vec<u32>> {
        Ok(values.iter().zip(keep).filter(|(_, k)| **k != 0).map(|(v, _)| *v).collect())
    }

    fn sequence(&self, len: usize) -> Result<Vec<u32>> {
        Ok((0..len as u32).collect())
    }

    fn raw_codes(&self, mut values: Vec<u32>, codes: RawCodes) -> Result<Vec<u32>> {
        values.iter_mut().for_each(|v| *v = codes.code(*v));
        Ok(values)
    }

    fn null_positions(&self, len: usize) -> Result<Vec<u32>> {
        Ok(vec![NULL_POSITION; len])
    }

    fn concat(&self, first: &Vec<u32>, second: &Vec<u32>) -> Result<Vec<u32>> {
        Ok([first.as_slice(), second.as_slice()].concat())
    }

    fn scatter_permutation(&self, positions: &Vec<u32>, values: &Vec<u32>, len: usize) -> Result<Option<Vec<u32>>> {
        if positions.len() != values.len() {
            return internal_err!("scatter_permutation: {} positions for {} values", positions.len(), values.len());
        }
        if positions.len() != len {
            return Ok(None);
        }
        let mut out = vec![NULL_POSITION; len];
        let mut seen = vec![false; len];
        for (&p, &value) in positions.iter().zip(values) {
            match seen.get_mut(p as usize) {
                Some(seen) if !*seen => *seen = true,
                _ => return Ok(None),
            }
            out[p as usize] = value;
        }
        Ok(Some(out))
    }

    fn sort_pairs(&self, keys: &Vec<u32>, values: &Vec<u32>) -> Result<(Vec<u32>, Vec<u32>)> {
        let mut order: Vec<u32> = (0..keys.len() as u32).collect();
        order.sort_by_key(|&i| keys[i as usize]);
        Ok((order.iter().map(|&i| keys[i as usize]).collect(), order.iter().map(|&i| values[i as usize]).collect()))
    }

    /// Arrow's comparison kernels on the rows taken: the reference for
    /// the device's comparisons, NULL as false.
    fn compare_rows(
        &self,
        op: Comparison,
        left: ColumnRows<'_, Self>,
        right: ColumnRows<'_, Self>,
        and: Option<&Vec<u8>>,
    ) -> Result<Vec<u8>> {
        check_compared((left.0.data_type(), left.1.len()), (right.0.data_type(), right.1.len()), and.map(Vec::len))?;
        let taken = |(column, rows): ColumnRows<'_, Self>| take(column.as_ref(), &positions_to_indices(rows), None);
        let (left, right) = (taken(left)?, taken(right)?);
        let holds = match op {
            Comparison::Eq => cmp::eq(&left, &right),
            Comparison::NotEq => cmp::neq(&left, &right),
            Comparison::Lt => cmp::lt(&left, &right),
            Comparison::LtEq => cmp::lt_eq(&left, &right),
            Comparison::Gt => cmp::gt(&left, &right),
            Comparison::GtEq => cmp::gt_eq(&left, &right),
        }?;
        let kept = |i: usize| and.is_none_or(|and| and[i] != 0);
        Ok((0..holds.len()).map(|i| u8::from(holds.is_valid(i) && holds.value(i) && kept(i))).collect())
    }

    fn new_flags(&self, len: usize) -> Result<Vec<AtomicBool>> {
        Ok((0..len).map(|_| AtomicBool::new(false)).collect())
    }

    fn set_flags(&self, flags: &Vec<AtomicBool>, positions: &Vec<u32>) -> Result<()> {
        for &p in positions.iter().filter(|&&p| p != NULL_POSITION) {
            flags
                .get(p as usize)
                .ok_or_else(|| {
                    datafusion::common::internal_datafusion_err!("set_flags: position {p} out of {} flags", flags.len())
                })?
                .store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    fn flagged(&self, flags: &Vec<AtomicBool>, value: bool) -> Result<Vec<u32>> {
        Ok(flags
            .iter()
            .enumerate()
            .filter(|(_, f)| f.load(Ordering::Relaxed) == value)
            .map(|(i, _)| i as u32)
            .collect())
    }

    fn download_flags(&self, flags: &Vec<AtomicBool>) -> Result<Vec<bool>> {
        Ok(flags.iter().map(|f| f.load(Ordering::Relaxed)).collect())
    }

    fn group_rows<K: NormalizedKey>(
        &self,
        keys: &Vec<K>,
        reductions: &[(Reduction, Option<&ArrayRef>)],
    ) -> Result<Groups> {
        super::grouping::group_rows(keys, reductions)
    }
}
