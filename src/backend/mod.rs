//! Backends: the join primitives, implemented once per kind of hardware.
//!
//! The algorithms in [`crate::algorithms`] are written once over this trait,
//! following He et al. (SIGMOD 2008) and the GFTR paper: a stable radix
//! partition or sort transforms a relation (keys, optionally payload columns
//! and row ids), match finding pairs up positions of the two transformed
//! relations, and gathers materialize columns from positions. A handful of
//! flag and compaction primitives express every join type's semantics.
//!
//! The CPU backend is the reference: the CUDA backend must produce the same
//! transformed relations and the same set of matches for every input.

mod admission;
mod cache;
mod counters;
pub mod cpu;
pub mod cuda;
mod grouping;
mod handle;

pub use cuda::compile_kernels as compile_cuda_kernels;
pub use handle::{BackendHandle, Devices, cuda_backend};

use std::fmt::Debug;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, UInt32Array};
use arrow::buffer::Buffer;
use arrow::datatypes::DataType;
use datafusion::error::{DataFusionError, Result};

pub use admission::{Admission, Admitted};
pub(crate) use cache::cache_dir;
pub use counters::DeviceCounters;
pub use grouping::{Groups, IntegerWidth, Reduced, Reduction};

pub use crate::keys::SortSpec;
use crate::keys::{NormalizedKey, RawCodes};
pub use crate::values::Element;
use crate::values::value_width;

/// Writes the host values of elements `first..first + out.len()` of an
/// upload into `out`; called for pieces of the upload in parallel.
pub type Fill<'a, T> = &'a (dyn Fn(usize, &mut [T]) -> Result<()> + Sync);

/// Host memory that a backend moves to and from its own without a copy
/// through staging buffers (pinned memory on a GPU).
pub trait TransferMemory: Send {
    /// The first `len` bytes, to be written.
    fn bytes_mut(&mut self, len: usize) -> Result<&mut [u8]>;
    /// The first `len` bytes as an Arrow buffer, which keeps the memory
    /// until it is dropped.
    fn into_buffer(self: Box<Self>, len: usize) -> Result<arrow::buffer::Buffer>;
}

/// A position that denotes "no row": the padding side of an outer join row.
pub const NULL_POSITION: u32 = u32::MAX;

/// Positions as an Arrow index array, null where the position is null.
pub fn positions_to_indices(positions: &[u32]) -> UInt32Array {
    positions.iter().map(|&p| (p != NULL_POSITION).then_some(p)).collect()
}

/// Bytes per value of a column held in backend memory, for the types
/// backends hold: fixed-width values of 1 to 16 bytes, and booleans (one
/// byte per row). Strings and nested types stay on the host.
pub(crate) fn held_width(data_type: &DataType) -> Option<usize> {
    match data_type {
        DataType::Boolean => Some(1),
        t => value_width(t).filter(|w| matches!(w, 1 | 2 | 4 | 8 | 16)),
    }
}

/// How a join filter compares the values of a pair
/// ([`JoinBackend::compare_rows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comparison {
    Eq,
    NotEq,
    Lt,
    LtEq,
    Gt,
    GtEq,
}

/// How the backend compares values of `data_type` in a join filter: as
/// integers of `bytes` bytes, signed or not. `None` for the other types:
/// floats, whose order in Arrow is not their bits' (NaN, signed zeros),
/// and decimals and strings, which no kernel compares; filters on them
/// stay with DataFusion's expression.
pub(crate) fn compared_integer(data_type: &DataType) -> Option<(bool, usize)> {
    match data_type {
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => Some((true, value_width(data_type)?)),
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => {
            Some((false, value_width(data_type)?))
        }
        DataType::Date32 | DataType::Time32(_) => Some((true, 4)),
        DataType::Date64 | DataType::Time64(_) | DataType::Timestamp(_, _) | DataType::Duration(_) => Some((true, 8)),
        _ => None,
    }
}

/// Checks the arguments of [`JoinBackend::compare_rows`], given as the
/// columns' types and each argument's length: returns the pairs and how
/// their values compare.
pub(crate) fn check_compared(
    left: (&DataType, usize),
    right: (&DataType, usize),
    and: Option<usize>,
) -> Result<(usize, (bool, usize))> {
    let pairs = left.1;
    if right.1 != pairs || and.is_some_and(|len| len != pairs) {
        return datafusion::common::internal_err!(
            "compare_rows: {pairs} left rows, {} right rows and {and:?} flags",
            right.1
        );
    }
    match compared_integer(left.0) {
        Some(integer) if left.0 == right.0 => Ok((pairs, integer)),
        _ => datafusion::common::internal_err!("compare_rows: no comparison of {} with {}", left.0, right.0),
    }
}

/// A column in backend memory and the rows of it that a primitive reads.
pub type ColumnRows<'a, B> = (&'a <B as JoinBackend>::Column, &'a <B as JoinBackend>::Vector<u32>);

/// The most rows one relation or probe chunk may have: positions are `u32`,
/// [`NULL_POSITION`] is reserved, and the kernels' `u32` row counters step
/// up to a block's items past the last row (at most 2^16) without wrapping.
pub const MAX_RELATION_ROWS: usize = (u32::MAX - (1 << 16)) as usize;

/// The most candidate pairs one match call produces. A probe chunk with more
/// fails with a resource error, and the operator joins it in smaller
/// pieces, sending each piece's output before joining the next, and makes
/// its later chunks smaller: so a join's output may exceed any fixed size
/// (2^31 rows and more) while each piece's positions and output stay
/// bounded. 2^24 pairs are 128 MiB of positions, and the output of one
/// chunk of a many-to-many join, held on the host until it is consumed,
/// stays at a few hundred MiB per partition (TPC-DS's query 72, whose
/// catalog sales meet about 650 inventory rows each, held tens of GiB per
/// partition at 2^28).
pub const MAX_CANDIDATES: usize = 1 << 24;

/// A match call that would make more candidate pairs than its instance
/// may ([`JoinBackend::candidate_limit`]): the probe rows are to be joined
/// in smaller pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyPairs {
    pub pairs: u64,
    pub limit: usize,
}

impl std::fmt::Display for TooManyPairs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GPU join: a probe chunk has {} matching pairs, more than the {} joined at once",
            self.pairs, self.limit
        )
    }
}

impl std::error::Error for TooManyPairs {}

/// The pairs and limit of a match call that made too many, if that is
/// what `error` says.
pub fn too_many_pairs(error: &DataFusionError) -> Option<TooManyPairs> {
    match error.find_root() {
        DataFusionError::External(e) => e.downcast_ref::<TooManyPairs>().copied(),
        _ => None,
    }
}

/// `total` as a count of pairs, or [`TooManyPairs`] when more than `limit`.
pub(crate) fn check_candidates_within(total: u64, limit: usize) -> Result<usize> {
    match usize::try_from(total) {
        Ok(total) if total <= limit => Ok(total),
        _ => Err(DataFusionError::External(Box::new(TooManyPairs { pairs: total, limit }))),
    }
}

/// Which positions a primitive reads or writes for one side of a join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    /// Positions in the transformed (partitioned or sorted) relation: gathers
    /// from transformed payload columns are clustered (GFTR).
    Transformed,
    /// Row numbers of the original relation (GFUR).
    Original,
}

/// How keys are distributed over partitions for the partitioned hash join.
///
/// Partition `p` of key `k` is the top `bits` bits of `k` times an odd
/// constant (Fibonacci hashing), which spreads dense and strided keys alike;
/// the unmatchable key goes to the extra partition `1 << bits`, last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionSpec {
    pub bits: u32,
}

impl PartitionSpec {
    /// Most radix bits: with the unmatchable partition, partition ids fit
    /// 16 bits, two 8-bit radix passes (the GFTR paper uses 15 or 16).
    pub const MAX_BITS: u32 = 15;

    /// Enough partitions that the average build partition holds about
    /// `target_rows` rows.
    pub fn for_build_rows(build_rows: usize, target_rows: usize) -> Self {
        let partitions = build_rows.div_ceil(target_rows.max(1)).max(1);
        let bits = usize::BITS - (partitions - 1).leading_zeros();
        Self { bits: bits.min(Self::MAX_BITS) }
    }

    /// Partitions holding matchable keys; one more holds unmatchable keys.
    pub fn partitions(&self) -> usize {
        1 << self.bits
    }

    /// Bits of a partition id: the partition bits and one more for the
    /// unmatchable partition.
    pub fn digit_bits(&self) -> u32 {
        self.bits + 1
    }

    pub fn partition_of<K: NormalizedKey>(&self, key: K) -> usize {
        if key == K::UNMATCHABLE {
            return self.partitions();
        }
        if self.bits == 0 {
            return 0;
        }
        match K::BITS {
            32 => ((key.to_u64() as u32).wrapping_mul(0x9E37_79B1) >> (32 - self.bits)) as usize,
            _ => (key.to_u64().wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - self.bits)) as usize,
        }
    }
}

/// Radix passes over `digit_bits` bits: as few as 8-bit digits allow.
pub fn radix_pass_count(digit_bits: u32) -> u32 {
    digit_bits.div_ceil(8).max(1)
}

/// Checks that both sides of a merge match are sorted, by the same key bits.
pub(crate) fn check_sorted_alike(build: Layout, probe: Layout) -> Result<()> {
    let (Layout::Sorted(build_spec), Layout::Sorted(probe_spec)) = (build, probe) else {
        return datafusion::common::internal_err!("merge_match needs two sorted relations");
    };
    if build_spec != probe_spec {
        return datafusion::common::internal_err!(
            "merge_match: build sorted by {} key bits, probe by {}",
            build_spec.key_bits,
            probe_spec.key_bits
        );
    }
    Ok(())
}

/// How a relation is ordered after its transformation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Stable radix partition; `offsets` of the partitions live in the relation.
    Partitioned(PartitionSpec),
    /// Stable sort by key, unmatchable keys last.
    Sorted(SortSpec),
}

/// A relation after the transform phase: keys and the requested payload
/// columns in transformed order, plus where each position came from.
pub struct Transformed<B: JoinBackend, K: NormalizedKey> {
    pub keys: B::Vector<K>,
    /// Original row of each transformed position, when requested.
    pub row_ids: Option<B::Vector<u32>>,
    /// Payload columns transformed together with the keys (GFTR).
    pub payloads: Vec<B::Column>,
    /// `partitions + 2` offsets for a partitioned relation (the last partition
    /// holds unmatchable keys); for a sorted one, `[0, matchable rows, rows]`.
    pub offsets: B::Vector<u32>,
    pub layout: Layout,
    pub rows: usize,
    /// A partitioned build side's hash tables, built once for the matches
    /// of every probe chunk.
    pub hash_tables: Option<B::HashTables>,
    /// A sorted build side's directory ([`JoinBackend::directory`]), built
    /// once for the matches of every probe chunk of a directory join.
    pub directory: Option<B::Vector<u32>>,
}

/// Candidate pairs from match finding, in the requested spaces.
pub struct Candidates<B: JoinBackend> {
    pub build: B::Vector<u32>,
    pub probe: B::Vector<u32>,
}

/// Where a match that makes no pairs flags the rows with a match: build
/// rows by position in the build side's space, probe rows in the probe
/// side's. Semi, anti and mark joins without a join filter need no more.
pub struct MatchFlags<'a, B: JoinBackend> {
    pub build: Option<&'a B::Flags>,
    pub probe: Option<&'a B::Flags>,
}

/// The join primitives.
///
/// Every method may fail with a `DataFusionError` that names the primitive
/// and the sizes involved; none panics on bad input.
pub trait JoinBackend: Send + Sync + Debug + Clone + Sized + 'static {
    /// What instances are opened on: a device handle, shared by every join.
    type Device: Send + Sync + Debug + Clone + 'static;
    /// A vector in backend memory.
    type Vector<T: Element>: Send + Sync;
    /// A payload column in backend memory. Clones share its memory.
    type Column: Send + Sync + Clone;
    /// A set of per-position flags that several probe partitions may set
    /// concurrently (matched probe rows, visited build rows).
    type Flags: Send + Sync;
    /// The hash tables of a partitioned build side's co-partitions.
    type HashTables: Send + Sync;

    /// Where payloads are gathered from when the session leaves it to the
    /// backend (`gpu_join.materialization = auto`).
    const PREFERRED_GATHER_SPACE: Space;

    /// An instance serving one partition of one join, counting into `counters`.
    fn open(device: &Self::Device, counters: Arc<DeviceCounters>) -> Result<Self>;

    /// Another instance on the same device, counting into counters of its
    /// own: for work that serves no one join (measuring the device).
    fn detached(&self) -> Result<Self>;

    /// Who may run GPU jobs on the device now: one admission per device.
    fn admission(device: &Self::Device) -> &Admission;

    /// `cpu` or `cuda`, for EXPLAIN and errors.
    fn name(&self) -> &'static str;
    /// The device and its software, for a device whose measured costs the
    /// algorithm choice uses (its cost profile is cached under this name);
    /// `None` where `algorithm = auto` keeps to fixed rules.
    fn device_label(&self) -> Option<String>;
    /// Transfer and memory counters of the join this backend instance serves.
    fn counters(&self) -> &DeviceCounters;
    /// Waits until every primitive issued so far has finished, so that its
    /// results may be shared with other instances (other partitions).
    fn finish(&self) -> Result<()>;
    /// Build partitions are sized to hold about this many rows.
    fn partition_target_rows(&self) -> usize;
    /// The bytes of backend memory the GPU join may hold, when bounded.
    fn memory_budget(&self) -> Option<u64>;
    /// The most candidate pairs one match call of this instance makes; a
    /// call that would make more fails with [`TooManyPairs`]. Instances
    /// open with [`MAX_CANDIDATES`].
    fn candidate_limit(&self) -> usize;
    /// This instance with match calls of up to `limit` pairs.
    fn with_candidate_limit(self, limit: usize) -> Self;

    // ---- moving data ----
    fn upload<T: Element>(&self, host: &[T]) -> Result<Self::Vector<T>> {
        self.upload_with(host.len(), &|first, out| {
            out.copy_from_slice(&host[first..first + out.len()]);
            Ok(())
        })
    }
    /// `len` elements that `fill` writes straight into the memory the
    /// transfer reads, so that values made on the host (encoded keys) are
    /// not copied again on their way. As with [`JoinBackend::upload_column`],
    /// the transfer may still run when this returns: other instances may
    /// read the vector once [`JoinBackend::finish`] has returned.
    fn upload_with<T: Element>(&self, len: usize, fill: Fill<'_, T>) -> Result<Self::Vector<T>>;
    fn download<T: Element>(&self, vector: &Self::Vector<T>) -> Result<Vec<T>>;
    fn len<T: Element>(&self, vector: &Self::Vector<T>) -> usize;
    /// `bytes` bytes of host memory that this backend moves without a
    /// staging copy, for host data bound for it (probe chunks and build
    /// sides assembled from DataFusion's batches), when it has them to
    /// spare; `None` where backend memory is host memory.
    fn transfer_memory(&self, bytes: usize) -> Option<Box<dyn TransferMemory>>;
    /// The values of `arrays` (`width` bytes each) end to end as one buffer
    /// over the memory they lie in, where that is one block of this
    /// backend's transfer memory and each array's values start where the
    /// one before's end: consecutive batches of a table kept there
    /// ([`crate::GpuJoinContextExt::gpu_join_pin_batches`]), which are then
    /// assembled and moved without a copy. `None` otherwise, found at the
    /// cost of a look at the first array.
    fn joined_in_place(&self, _arrays: &[&dyn Array], _width: usize) -> Option<Buffer> {
        None
    }
    /// The values of `arrays` (each as wide as `T`) end to end, moved from
    /// where they lie, where each run of them that lies end to end is in
    /// one block of this backend's transfer memory; `None` otherwise, for
    /// the caller to copy them. As with [`JoinBackend::upload_with`], the
    /// transfer may still run when this returns.
    fn upload_values_in_place<T: Element>(&self, _arrays: &[&dyn Array]) -> Result<Option<Self::Vector<T>>> {
        Ok(None)
    }
    /// Whether columns of this type live in backend memory; other columns
    /// are taken on the host from row ids. The reference backend holds the
    /// same types as the device, so that the host paths of the columns the
    /// device cannot hold are tested wherever the join runs.
    fn holds_column(&self, data_type: &DataType) -> bool {
        held_width(data_type).is_some()
    }
    /// A column in backend memory. Its transfer may still run when this
    /// returns (it holds on to `array`'s memory meanwhile): other instances
    /// may read the column once [`JoinBackend::finish`] has returned.
    fn upload_column(&self, array: &ArrayRef) -> Result<Self::Column>;
    /// A column of `rows` values of the fixed-width primitive `data_type`,
    /// none null, whose bytes `fill` writes straight into the memory the
    /// transfer reads: a column that came in many batches is copied once on
    /// its way rather than assembled first. `arrays` hold the same values,
    /// read where they lie instead where the backend can
    /// ([`JoinBackend::upload_values_in_place`]). As with
    /// [`JoinBackend::upload_column`], the transfer may still run when this
    /// returns.
    fn upload_values(
        &self,
        data_type: &DataType,
        rows: usize,
        fill: Fill<'_, u8>,
        arrays: &[&dyn Array],
    ) -> Result<Self::Column>;
    fn download_column(&self, column: &Self::Column) -> Result<ArrayRef>;

    // ---- transform ----
    /// Stable radix partition of `keys`, carrying `payloads` and (if asked)
    /// row ids along.
    fn partition<K: NormalizedKey>(
        &self,
        keys: &Self::Vector<K>,
        payloads: &[&Self::Column],
        with_row_ids: bool,
        spec: PartitionSpec,
    ) -> Result<Transformed<Self, K>>;

    /// Stable sort by the key bits of `spec`, carrying `payloads` and (if
    /// asked) row ids along.
    fn sort<K: NormalizedKey>(
        &self,
        keys: &Self::Vector<K>,
        payloads: &[&Self::Column],
        with_row_ids: bool,
        spec: SortSpec,
    ) -> Result<Transformed<Self, K>>;

    // ---- match ----
    /// Hash tables of the co-partitions of a partitioned build side: built
    /// once, so that the match of each probe chunk only reads them.
    fn hash_tables<K: NormalizedKey>(&self, build: &Transformed<Self, K>) -> Result<Self::HashTables>;

    /// Every pair of equal keys within co-partitions, `tables` being the
    /// build side's. A side asked for in [`Space::Original`] must have row
    /// ids.
    fn hash_match<K: NormalizedKey>(
        &self,
        build: &Transformed<Self, K>,
        tables: &Self::HashTables,
        probe: &Transformed<Self, K>,
        spaces: (Space, Space),
    ) -> Result<Candidates<Self>>;

    /// Every pair of equal keys of two sorted relations.
    fn merge_match<K: NormalizedKey>(
        &self,
        build: &Transformed<Self, K>,
        probe: &Transformed<Self, K>,
        spaces: (Space, Space),
    ) -> Result<Candidates<Self>>;

    /// The directory of a build side sorted by key whose matchable keys are
    /// codes below `codes`: `codes + 1` entries, entry `c` the number of its
    /// keys below `c`, so that the rows of code `c` are the sorted positions
    /// `directory[c]..directory[c + 1]`.
    fn directory<K: NormalizedKey>(&self, build: &Transformed<Self, K>, codes: u32) -> Result<Self::Vector<u32>>;

    /// Every pair of equal keys of a build side with a directory and probe
    /// keys as they are, neither partitioned nor sorted: probe positions
    /// are the keys' own positions. Pairs come in probe order, and a probe
    /// row's in sorted build order.
    fn directory_match<K: NormalizedKey>(
        &self,
        build: &Transformed<Self, K>,
        directory: &Self::Vector<u32>,
        probe: &Self::Vector<K>,
        build_space: Space,
    ) -> Result<Candidates<Self>>;

    /// Flags the rows that have a match within co-partitions, as
    /// [`JoinBackend::hash_match`] pairs them, without making the pairs. A
    /// probe row stops at its first match where no build row is flagged.
    fn hash_mark<K: NormalizedKey>(
        &self,
        build: &Transformed<Self, K>,
        tables: &Self::HashTables,
        probe: &Transformed<Self, K>,
        spaces: (Space, Space),
        flags: MatchFlags<'_, Self>,
    ) -> Result<()>;

    /// Flags the rows of two sorted relations that have a match, as
    /// [`JoinBackend::merge_match`] pairs them, without making the pairs.
    fn merge_mark<K: NormalizedKey>(
        &self,
        build: &Transformed<Self, K>,
        probe: &Transformed<Self, K>,
        spaces: (Space, Space),
        flags: MatchFlags<'_, Self>,
    ) -> Result<()>;

    /// Flags the rows that have a match, as [`JoinBackend::directory_match`]
    /// pairs them, without making the pairs; probe rows by the keys' own
    /// positions.
    fn directory_mark<K: NormalizedKey>(
        &self,
        build: &Transformed<Self, K>,
        directory: &Self::Vector<u32>,
        probe: &Self::Vector<K>,
        build_space: Space,
        flags: MatchFlags<'_, Self>,
    ) -> Result<()>;

    // ---- gather and compaction ----
    /// `values[positions[i]]`, and [`NULL_POSITION`] where the position is null.
    fn gather_positions(&self, values: &Self::Vector<u32>, positions: &Self::Vector<u32>) -> Result<Self::Vector<u32>>;
    /// Rows `positions` of `column`; a null position gives a null value.
    /// `may_hold_nulls` is false when no position is null.
    fn gather_column(
        &self,
        column: &Self::Column,
        positions: &Self::Vector<u32>,
        may_hold_nulls: bool,
    ) -> Result<Self::Column>;
    /// The elements whose `keep` byte is non-zero, in order.
    fn select(&self, values: &Self::Vector<u32>, keep: &Self::Vector<u8>) -> Result<Self::Vector<u32>>;
    /// `0, 1, .., len - 1`.
    fn sequence(&self, len: usize) -> Result<Self::Vector<u32>>;
    /// Raw 4-byte key values coded as `codes` says ([`RawCodes::code`]), in
    /// their place.
    fn raw_codes(&self, values: Self::Vector<u32>, codes: RawCodes) -> Result<Self::Vector<u32>>;
    /// `len` null positions.
    fn null_positions(&self, len: usize) -> Result<Self::Vector<u32>>;
    /// `first` followed by `second`.
    fn concat(&self, first: &Self::Vector<u32>, second: &Self::Vector<u32>) -> Result<Self::Vector<u32>>;
    /// `out` with `out[positions[i]] = values[i]` when `positions` holds
    /// each of `0..len` exactly once, so that pairs come out in the order of
    /// their positions without a sort; `None` when it does not (a position
    /// twice, null or out of range, or not `len` of them).
    fn scatter_permutation(
        &self,
        positions: &Self::Vector<u32>,
        values: &Self::Vector<u32>,
        len: usize,
    ) -> Result<Option<Self::Vector<u32>>>;
    /// Stable sort of pairs by `keys`; returns the reordered keys and values.
    fn sort_pairs(
        &self,
        keys: &Self::Vector<u32>,
        values: &Self::Vector<u32>,
    ) -> Result<(Self::Vector<u32>, Self::Vector<u32>)>;

    // ---- join filters ----
    /// For each pair `i`: 1 where `left`'s value at row `left.1[i]` and
    /// `right`'s at row `right.1[i]` compare as `op` and `and` (when given)
    /// is non-zero at `i`; 0 where either value is NULL or a row is null.
    /// Both columns are of one type that [`compared_integer`] knows.
    fn compare_rows(
        &self,
        op: Comparison,
        left: ColumnRows<'_, Self>,
        right: ColumnRows<'_, Self>,
        and: Option<&Self::Vector<u8>>,
    ) -> Result<Self::Vector<u8>>;

    // ---- flags ----
    fn new_flags(&self, len: usize) -> Result<Self::Flags>;
    /// Sets the flag of every non-null position.
    fn set_flags(&self, flags: &Self::Flags, positions: &Self::Vector<u32>) -> Result<()>;
    /// Positions whose flag equals `value`, ascending.
    fn flagged(&self, flags: &Self::Flags, value: bool) -> Result<Self::Vector<u32>>;
    fn download_flags(&self, flags: &Self::Flags) -> Result<Vec<bool>>;

    // ---- grouping ----
    /// Groups rows by equal keys, which must be exact (equal keys are equal
    /// grouping values, NULLs coded as values): a row of each group, and
    /// each reduction's value per group over its column's rows (none for a
    /// count of rows). Groups come in no particular order.
    fn group_rows<K: NormalizedKey>(
        &self,
        keys: &Self::Vector<K>,
        reductions: &[(Reduction, Option<&Self::Column>)],
    ) -> Result<Groups>;
}
