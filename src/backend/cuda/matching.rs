//! Match phase on the GPU.
//!
//! Partitioned hash join: the build side is cut once into pieces (a
//! co-partition, or a part of one when it exceeds a shared-memory hash
//! table). Each probe chunk's match plans work units (a piece and a slice
//! of its probe partition), and one block per unit streams its probe rows
//! through the piece's table: built by the unit in shared memory, or, for
//! a chunk with few probe rows for the build side's size, built once for
//! every such chunk and kept in device memory. A unit with unique build
//! keys writes its matches in its first launch, into its own probe rows'
//! range; when that leaves every match in place (a foreign-key join where
//! each probe row matches) no second launch runs.
//!
//! Sort-merge join: a sorted search by merge path gives each probe row the
//! lower bound of its run of equal build keys. A foreign-key join (every
//! probe row matching once) ends there; otherwise a second search gives
//! the upper bounds, the run lengths are scanned and a load-balancing
//! search writes the pairs.

use std::sync::Mutex;

use datafusion::common::{exec_datafusion_err, internal_err};
use datafusion::error::{DataFusionError, Result};

use super::kernels::table_limit;
use super::launch::{Arg, CudaBackend};
use super::memory::DeviceBuffer;
use crate::backend::{Candidates, JoinBackend, Layout, MatchFlags, Space, Transformed, check_sorted_alike};
use crate::keys::NormalizedKey;

/// Probe rows one work unit streams through its table at most (a slice of a
/// long probe partition).
const PROBE_SLICE_ROWS: u32 = 16 * 1024;

/// Hash table slots for `build_rows` rows (load factor at most 3/4); the
/// kernel computes the same.
fn table_slots(build_rows: u32) -> u32 {
    let mut slots = 2u32;
    while u64::from(slots) * 3 < u64::from(build_rows) * 4 {
        slots <<= 1;
    }
    slots
}

/// Bytes of a table per slot (ENTRY_BYTES in match.cu).
fn entry_bytes<K: NormalizedKey>() -> u64 {
    size_of::<K>() as u64 + 4
}

fn table_bytes<K: NormalizedKey>(build_rows: u32) -> u32 {
    table_slots(build_rows) * entry_bytes::<K>() as u32
}

/// Most build rows whose table fits `limit` bytes.
fn build_rows_per_piece<K: NormalizedKey>(limit: u32) -> u32 {
    let mut rows = 1u32;
    while table_bytes::<K>(rows * 2) <= limit {
        rows *= 2;
    }
    // Fill the largest table size up to its 3/4 load.
    let slots = table_slots(rows);
    (slots / 4 * 3).max(rows)
}

/// u32 fields of a work unit (WorkUnit in match.cu).
const UNIT_FIELDS: usize = 4;
/// u64 words of a piece (Piece in match.cu).
const PIECE_WORDS: usize = 3;
/// Bytes a probe row's walk reads from a table kept in device memory: one
/// sector. Reading kept tables costs a chunk's probe rows this much each;
/// building them in shared memory costs about the tables' bytes.
const PROBE_READ_BYTES: u64 = 32;
/// Items of the merged order per block of the sorted search, and output
/// pairs per block of the expansion (SEARCH_TILE, EXPAND_TILE in match.cu).
const SEARCH_TILE: u64 = 256 * 12;
const EXPAND_TILE: usize = 256 * 8;

/// The sorted keys of a merge match, unmatchable keys left out.
#[derive(Clone, Copy)]
struct SortedSearch<'a, K> {
    build: &'a DeviceBuffer<K>,
    build_rows: u32,
    probe: &'a DeviceBuffer<K>,
    probe_rows: u32,
}

/// What a sorted search finds for each probe key.
#[derive(Clone, Copy)]
enum Bound<'a> {
    /// Its lower bound, into `bounds`; `not_one` is set when some probe
    /// key does not match exactly once.
    Lower { bounds: &'a DeviceBuffer<u32>, not_one: &'a DeviceBuffer<u32> },
    /// Its upper bound less its `lower` bound: its match count.
    Upper { lower: &'a DeviceBuffer<u32>, counts: &'a DeviceBuffer<u64> },
}

/// The hash tables of a partitioned build side: one per piece of a
/// co-partition. Kept in device memory once a probe chunk with few rows for
/// the build side's size needs them, and read by every such chunk's match.
pub struct CudaHashTables {
    /// The first piece of each build partition, and the number of pieces.
    piece_offsets: DeviceBuffer<u64>,
    /// The pieces (Piece in match.cu).
    pieces: DeviceBuffer<u64>,
    /// Every piece's table, end to end, once built.
    kept: Mutex<Option<DeviceBuffer<u64>>>,
    /// Slots of every table together.
    slots: u64,
    /// Bytes of the largest table.
    largest_table: u32,
}

impl CudaBackend {
    pub(super) fn row_ids_for<K: NormalizedKey>(
        relation: &Transformed<CudaBackend, K>,
        space: Space,
        side: &str,
    ) -> Result<u64> {
        match (space, &relation.row_ids) {
            (Space::Transformed, _) => Ok(0),
            (Space::Original, Some(ids)) => Ok(ids.pointer()),
            (Space::Original, None) => internal_err!("{side} rows asked for without row ids"),
        }
    }

    pub(super) fn hash_tables_of<K: NormalizedKey>(
        &self,
        build: &Transformed<CudaBackend, K>,
    ) -> Result<CudaHashTables> {
        let Layout::Partitioned(spec) = build.layout else {
            return internal_err!("hash tables need a partitioned build side");
        };
        let max_build_rows = build_rows_per_piece::<K>(table_limit(self.instance.device.max_shared_bytes));
        let partitions = spec.partitions();
        // Pieces and slots per partition, scanned (one extra zero each
        // becomes the total), then the pieces themselves.
        let piece_offsets = DeviceBuffer::<u64>::filled(&self.instance, partitions + 1, 0, "pieces per partition")?;
        let slot_offsets = DeviceBuffer::<u64>::filled(&self.instance, partitions + 1, 0, "table slots per partition")?;
        let largest_piece = DeviceBuffer::<u32>::filled(&self.instance, 1, 0, "largest piece")?;
        let plan_args = [Arg::from(build.offsets.pointer()), (partitions as u32).into(), max_build_rows.into()];
        let counts = [piece_offsets.pointer().into(), slot_offsets.pointer().into(), largest_piece.pointer().into()];
        self.launch("plan_piece_counts", partitions as u64, 0, &[&plan_args[..], &counts].concat())?;
        let piece_count = self.exclusive_scan(&piece_offsets)?.read()? as usize;
        let slots = self.exclusive_scan(&slot_offsets)?.read()?;
        let largest_table = table_bytes::<K>(largest_piece.download_at(0, "the largest piece")?);
        let pieces = DeviceBuffer::<u64>::alloc(&self.instance, piece_count * PIECE_WORDS, "pieces")?;
        let outputs = [piece_offsets.pointer().into(), slot_offsets.pointer().into(), pieces.pointer().into()];
        self.launch("plan_pieces", partitions as u64, 0, &[&plan_args[..], &outputs].concat())?;
        Ok(CudaHashTables { piece_offsets, pieces, kept: Mutex::new(None), slots, largest_table })
    }

    /// Where the build side's tables are kept, built on the first call. Out
    /// of device memory, `None`: the units build their tables themselves.
    /// The build side's device estimate leaves them out for that reason:
    /// they speed a join up where memory allows, and never make one fail.
    fn kept_tables<K: NormalizedKey>(
        &self,
        build: &Transformed<CudaBackend, K>,
        tables: &CudaHashTables,
    ) -> Result<Option<u64>> {
        let mut kept = tables.kept.lock().map_err(|_| exec_datafusion_err!("GPU join: hash tables poisoned"))?;
        if let Some(kept) = kept.as_ref() {
            return Ok(Some(kept.pointer()));
        }
        let slots = tables.slots;
        let words = usize::try_from(slots * entry_bytes::<K>() / 8)
            .map_err(|_| exec_datafusion_err!("GPU join: {slots} hash table slots are too many"))?;
        let buffer = match DeviceBuffer::<u64>::alloc(&self.instance, words, "kept hash tables") {
            Ok(buffer) => buffer,
            Err(DataFusionError::ResourcesExhausted(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let pieces = tables.pieces.len() / PIECE_WORDS;
        let args = [Arg::from(build.keys.pointer()), tables.pieces.pointer().into(), buffer.pointer().into()];
        let kernel = self.kernel_name::<K>("build_tables");
        self.launch_blocks(&kernel, pieces as u64, tables.largest_table, build.rows as u64, &args)?;
        // Other partitions' streams read them from here on.
        self.synchronize("building the kept hash tables")?;
        Ok(Some(kept.insert(buffer).pointer()))
    }

    pub(super) fn hash_match_keys<K: NormalizedKey>(
        &self,
        build: &Transformed<CudaBackend, K>,
        tables: &CudaHashTables,
        probe: &Transformed<CudaBackend, K>,
        (build_space, probe_space): (Space, Space),
    ) -> Result<Candidates<CudaBackend>> {
        let (Layout::Partitioned(build_spec), Layout::Partitioned(probe_spec)) = (build.layout, probe.layout) else {
            return internal_err!("hash_match needs two partitioned relations");
        };
        if build_spec != probe_spec {
            return internal_err!("hash_match: build has {} radix bits, probe {}", build_spec.bits, probe_spec.bits);
        }
        let Some((units, unit_count)) = self.work_units(tables, probe, build_spec.partitions())? else {
            return self.empty_candidates();
        };
        let (mode, shared, kept_at) = self.table_mode(build, tables, probe)?;
        let (build_ids, probe_ids) =
            (Self::row_ids_for(build, build_space, "build")?, Self::row_ids_for(probe, probe_space, "probe")?);
        let mut direct_build = DeviceBuffer::<u32>::alloc(&self.instance, probe.rows, "matched build positions")?;
        let mut direct_probe = DeviceBuffer::<u32>::alloc(&self.instance, probe.rows, "matched probe positions")?;
        // One extra zero count becomes the total after the scan.
        let unit_matches = DeviceBuffer::<u64>::filled(&self.instance, unit_count + 1, 0, "matches per work unit")?;
        let unit_written = DeviceBuffer::<u32>::alloc(&self.instance, unit_count, "work units written")?;
        // What both match launches read first, in their order.
        let unit_args = [
            Arg::from(tables.pieces.pointer()),
            kept_at.into(),
            build.keys.pointer().into(),
            probe.keys.pointer().into(),
            units.pointer().into(),
            build_ids.into(),
            probe_ids.into(),
            direct_build.pointer().into(),
            direct_probe.pointer().into(),
        ];
        let args = [&unit_args[..], &[unit_matches.pointer().into(), unit_written.pointer().into()]].concat();
        let kernel = self.kernel_name::<K>(&format!("hash_first_{mode}"));
        self.launch_blocks(&kernel, unit_count as u64, shared, probe.rows as u64, &args)?;
        self.exclusive_scan(&unit_matches)?;
        // The number of matches, and whether some unit's are misplaced: one
        // read back for both.
        let summary = DeviceBuffer::<u64>::filled(&self.instance, 2, 0, "the match's summary")?;
        let args = [
            Arg::from(units.pointer()),
            (unit_count as u32).into(),
            unit_matches.pointer().into(),
            unit_written.pointer().into(),
            summary.pointer().into(),
        ];
        self.launch("hash_misplaced", unit_count as u64, 0, &args)?;
        let [total, misplaced] = summary.download("the match's summary")?[..] else {
            return internal_err!("hash_match: the match's summary lost its length");
        };
        let total = self.check_candidates(total)?;
        if misplaced == 0 {
            // Every match is where the scan puts it: positions 0..total.
            direct_build.truncate(total);
            direct_probe.truncate(total);
            // Only direct units wrote matches, at most one per probe row, at
            // that row's position; as many matches as probe rows means every
            // probe row matched once, in order, and so once in original
            // rows too (row ids are a permutation).
            match (total == probe.rows, probe_space) {
                (true, Space::Transformed) => direct_probe.mark_sequence(),
                (true, Space::Original) => direct_probe.mark_each_once(),
                (false, _) => {}
            }
            return Ok(Candidates { build: direct_build, probe: direct_probe });
        }
        let out_build = DeviceBuffer::<u32>::alloc(&self.instance, total, "matched build positions")?;
        let out_probe = DeviceBuffer::<u32>::alloc(&self.instance, total, "matched probe positions")?;
        let args = [
            &unit_args[..],
            &[
                out_build.pointer().into(),
                out_probe.pointer().into(),
                unit_matches.pointer().into(),
                unit_written.pointer().into(),
            ],
        ]
        .concat();
        let kernel = self.kernel_name::<K>(&format!("hash_second_{mode}"));
        self.launch_blocks(&kernel, unit_count as u64, shared, probe.rows as u64, &args)?;
        Ok(Candidates { build: out_build, probe: out_probe })
    }

    /// The work units of a probe chunk's match (WorkUnit in match.cu) and
    /// their number; `None` where there are none. Planned on the device:
    /// counts per co-partition, scanned (one extra zero becomes the total),
    /// then the units themselves.
    fn work_units<K: NormalizedKey>(
        &self,
        tables: &CudaHashTables,
        probe: &Transformed<CudaBackend, K>,
        partitions: usize,
    ) -> Result<Option<(DeviceBuffer<u32>, usize)>> {
        let unit_counts = DeviceBuffer::<u64>::filled(&self.instance, partitions + 1, 0, "work units per partition")?;
        let plan_args = [
            Arg::from(tables.piece_offsets.pointer()),
            probe.offsets.pointer().into(),
            (partitions as u32).into(),
            PROBE_SLICE_ROWS.into(),
            unit_counts.pointer().into(),
        ];
        self.launch("plan_unit_counts", partitions as u64, 0, &plan_args)?;
        let unit_count = self.exclusive_scan(&unit_counts)?.read()? as usize;
        if unit_count == 0 {
            return Ok(None);
        }
        let units = DeviceBuffer::<u32>::alloc(&self.instance, unit_count * UNIT_FIELDS, "work units")?;
        self.launch("plan_units", partitions as u64, 0, &[&plan_args[..], &[units.pointer().into()]].concat())?;
        Ok(Some((units, unit_count)))
    }

    /// Where the units find their tables: kept in device memory where the
    /// chunk's probe rows read less from them than building the tables
    /// would take, else built by each unit in shared memory. The kernels'
    /// suffix, their shared memory, and the kept tables' address (0 for
    /// none).
    fn table_mode<K: NormalizedKey>(
        &self,
        build: &Transformed<CudaBackend, K>,
        tables: &CudaHashTables,
        probe: &Transformed<CudaBackend, K>,
    ) -> Result<(&'static str, u32, u64)> {
        let few_probe_rows = (probe.rows as u64) * PROBE_READ_BYTES < tables.slots * entry_bytes::<K>();
        let kept = if few_probe_rows { self.kept_tables(build, tables)? } else { None };
        Ok(match kept {
            Some(pointer) => ("kept", 0, pointer),
            None => ("shared", tables.largest_table, 0),
        })
    }

    /// Flags the rows with a match of a partitioned build side and probe
    /// chunk ([`crate::backend::JoinBackend::hash_mark`]).
    pub(super) fn hash_mark_keys<K: NormalizedKey>(
        &self,
        build: &Transformed<CudaBackend, K>,
        tables: &CudaHashTables,
        probe: &Transformed<CudaBackend, K>,
        (build_space, probe_space): (Space, Space),
        flags: MatchFlags<'_, CudaBackend>,
    ) -> Result<()> {
        let (Layout::Partitioned(build_spec), Layout::Partitioned(probe_spec)) = (build.layout, probe.layout) else {
            return internal_err!("hash_mark needs two partitioned relations");
        };
        if build_spec != probe_spec {
            return internal_err!("hash_mark: build has {} radix bits, probe {}", build_spec.bits, probe_spec.bits);
        }
        let Some((units, unit_count)) = self.work_units(tables, probe, build_spec.partitions())? else {
            return Ok(());
        };
        let (mode, shared, kept_at) = self.table_mode(build, tables, probe)?;
        let build_ids = match flags.build {
            Some(_) => Self::row_ids_for(build, build_space, "build")?,
            None => 0,
        };
        let probe_ids = match flags.probe {
            Some(_) => Self::row_ids_for(probe, probe_space, "probe")?,
            None => 0,
        };
        let args = [
            Arg::from(tables.pieces.pointer()),
            kept_at.into(),
            build.keys.pointer().into(),
            probe.keys.pointer().into(),
            units.pointer().into(),
            build_ids.into(),
            probe_ids.into(),
            flags.build.map_or(0, DeviceBuffer::pointer).into(),
            flags.probe.map_or(0, DeviceBuffer::pointer).into(),
        ];
        let kernel = self.kernel_name::<K>(&format!("hash_mark_{mode}"));
        self.launch_blocks(&kernel, unit_count as u64, shared, probe.rows as u64, &args)
    }

    /// Flags the rows with a match of two sorted relations
    /// ([`crate::backend::JoinBackend::merge_mark`]): each row's key looked
    /// up among the other side's matchable keys.
    pub(super) fn merge_mark_keys<K: NormalizedKey>(
        &self,
        build: &Transformed<CudaBackend, K>,
        probe: &Transformed<CudaBackend, K>,
        (build_space, probe_space): (Space, Space),
        flags: MatchFlags<'_, CudaBackend>,
    ) -> Result<()> {
        check_sorted_alike(build.layout, probe.layout)?;
        // Unmatchable keys sort last; offsets[1] is where they start.
        let build_rows = build.offsets.download_at(1, "sorted offsets")?;
        let probe_rows = probe.offsets.download_at(1, "sorted offsets")?;
        if build_rows == 0 || probe_rows == 0 {
            return Ok(());
        }
        let kernel = self.kernel_name::<K>("mark_sorted");
        let sides = [
            (flags.build, build, build_rows, probe, probe_rows, build_space, "build"),
            (flags.probe, probe, probe_rows, build, build_rows, probe_space, "probe"),
        ];
        for (flags, side, rows, other, other_rows, space, name) in sides {
            let Some(flags) = flags else { continue };
            let args = [
                Arg::from(side.keys.pointer()),
                rows.into(),
                other.keys.pointer().into(),
                other_rows.into(),
                Self::row_ids_for(side, space, name)?.into(),
                flags.pointer().into(),
            ];
            self.launch(&kernel, u64::from(rows), 0, &args)?;
        }
        Ok(())
    }

    pub(super) fn merge_match_keys<K: NormalizedKey>(
        &self,
        build: &Transformed<CudaBackend, K>,
        probe: &Transformed<CudaBackend, K>,
        (build_space, probe_space): (Space, Space),
    ) -> Result<Candidates<CudaBackend>> {
        check_sorted_alike(build.layout, probe.layout)?;
        // Unmatchable keys sort last; offsets[1] is where they start.
        let build_rows = build.offsets.download_at(1, "sorted offsets")?;
        let probe_rows = probe.offsets.download_at(1, "sorted offsets")?;
        if build_rows == 0 || probe_rows == 0 {
            return self.empty_candidates();
        }
        let search = SortedSearch { build: &build.keys, build_rows, probe: &probe.keys, probe_rows };
        let lower = DeviceBuffer::<u32>::alloc(&self.instance, probe_rows as usize, "lower bounds")?;
        let not_one = DeviceBuffer::<u32>::filled(&self.instance, 1, 0, "match count check")?;
        self.sorted_search(&search, Bound::Lower { bounds: &lower, not_one: &not_one })?;
        let (build_ids, probe_ids) =
            (Self::row_ids_for(build, build_space, "build")?, Self::row_ids_for(probe, probe_space, "probe")?);
        if not_one.download_at(0, "match count check")? == 0 {
            // Each matchable probe row matches once, at its lower bound;
            // original rows where asked for (row ids checked above).
            let in_space = |positions, relation: &Transformed<CudaBackend, K>, space| match (space, &relation.row_ids) {
                (Space::Original, Some(ids)) => self.gather_positions(ids, &positions),
                _ => Ok(positions),
            };
            return Ok(Candidates {
                build: in_space(lower, build, build_space)?,
                probe: in_space(self.sequence(probe_rows as usize)?, probe, probe_space)?,
            });
        }
        // One extra zero count becomes the total after the scan.
        let counts = DeviceBuffer::<u64>::filled(&self.instance, probe_rows as usize + 1, 0, "match counts")?;
        self.sorted_search(&search, Bound::Upper { lower: &lower, counts: &counts })?;
        self.expand_runs(&counts, &lower, (build_ids, probe_ids))
    }

    /// The pairs of each probe row's run of build rows, given the runs'
    /// starts (`lower`) and lengths (`counts`, one more than the probe rows,
    /// scanned here), by a load-balancing search over the pairs; positions
    /// mapped by the row ids given (0: as they are).
    pub(super) fn expand_runs(
        &self,
        counts: &DeviceBuffer<u64>,
        lower: &DeviceBuffer<u32>,
        (build_ids, probe_ids): (u64, u64),
    ) -> Result<Candidates<CudaBackend>> {
        let probe_rows = lower.len() as u32;
        let total = self.check_candidates(self.exclusive_scan(counts)?.read()?)?;
        let out_build = DeviceBuffer::<u32>::alloc(&self.instance, total, "matched build positions")?;
        let out_probe = DeviceBuffer::<u32>::alloc(&self.instance, total, "matched probe positions")?;
        let args = [
            Arg::from(counts.pointer()),
            probe_rows.into(),
            lower.pointer().into(),
            build_ids.into(),
            probe_ids.into(),
            out_build.pointer().into(),
            out_probe.pointer().into(),
        ];
        self.launch_blocks("merge_expand", total.div_ceil(EXPAND_TILE) as u64, 0, total as u64, &args)?;
        Ok(Candidates { build: out_build, probe: out_probe })
    }

    /// Every probe key's lower or upper bound among the build keys, by a
    /// sorted search over tiles of the merged order.
    fn sorted_search<K: NormalizedKey>(&self, search: &SortedSearch<'_, K>, bound: Bound<'_>) -> Result<()> {
        let SortedSearch { build, build_rows, probe, probe_rows } = *search;
        let items = u64::from(build_rows) + u64::from(probe_rows);
        let tiles = items.div_ceil(SEARCH_TILE);
        let bias = match bound {
            Bound::Lower { .. } => 0u32,
            Bound::Upper { .. } => 1,
        };
        let splits = DeviceBuffer::<u32>::alloc(&self.instance, tiles as usize + 1, "merge path splits")?;
        let keys =
            [Arg::from(probe.pointer()), probe_rows.into(), build.pointer().into(), build_rows.into(), bias.into()];
        let args = [&keys[..], &[(tiles as u32).into(), splits.pointer().into()]].concat();
        self.launch(&self.kernel_name::<K>("merge_splits"), tiles + 1, 0, &args)?;
        let outputs = match bound {
            Bound::Lower { bounds, not_one } => [bounds.pointer(), 0, 0, not_one.pointer()],
            Bound::Upper { lower, counts } => [0, lower.pointer(), counts.pointer(), 0],
        };
        let args = [&keys[..], &[splits.pointer().into()], &outputs.map(Arg::from)[..]].concat();
        self.launch_blocks(&self.kernel_name::<K>("merge_search"), tiles, 0, items, &args)
    }

    pub(super) fn empty_candidates(&self) -> Result<Candidates<CudaBackend>> {
        Ok(Candidates {
            build: DeviceBuffer::alloc(&self.instance, 0, "matched build positions")?,
            probe: DeviceBuffer::alloc(&self.instance, 0, "matched probe positions")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_fit_their_budget_and_keep_a_quarter_free() {
        for limit in [48 * 1024, 96 * 1024, 227 * 1024] {
            let rows = build_rows_per_piece::<u64>(limit);
            assert!(table_bytes::<u64>(rows) <= limit, "{rows} rows in {limit} bytes");
            assert!(u64::from(table_slots(rows)) * 3 >= u64::from(rows) * 4);
        }
        assert_eq!(build_rows_per_piece::<u32>(96 * 1024), 6144);
    }
}
