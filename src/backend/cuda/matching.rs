//! Match phase on the GPU.
//!
//! Partitioned hash join: the host plans work units from the partition
//! offsets (a co-partition, or a piece of one when its build side exceeds a
//! shared-memory hash table or its probe side is long), then one block per
//! unit builds the table and streams the probe rows through it.
//!
//! Sort-merge join: binary searches give each probe row its run of equal
//! build keys; counts are scanned; each probe row writes its pairs.

use datafusion::common::internal_err;
use datafusion::error::Result;

use super::memory::DeviceBuffer;
use super::{Arg, CudaBackend};
use crate::backend::{Candidates, Layout, Space, Transformed};
use crate::keys::NormalizedKey;

/// Probe rows one work unit streams through its table at most.
const PROBE_SLICE_ROWS: u32 = 16 * 1024;
/// Shared memory a work unit's hash table may use.
const TABLE_BYTES: u32 = 96 * 1024;

/// Shared memory of one work unit's table on a device that allows `max`.
pub(super) fn table_limit(max_shared_bytes: u32) -> u32 {
    TABLE_BYTES.min(max_shared_bytes)
}

/// Kernels whose blocks use a work unit's table in dynamic shared memory.
pub(super) const TABLE_KERNELS: [&str; 4] = ["hash_count_u32", "hash_count_u64", "hash_write_u32", "hash_write_u64"];

/// Hash table slots for `build_rows` rows (load factor at most 3/4); the
/// kernel computes the same.
fn table_slots(build_rows: u32) -> u32 {
    let mut slots = 2u32;
    while u64::from(slots) * 3 < u64::from(build_rows) * 4 {
        slots <<= 1;
    }
    slots
}

fn table_bytes<K: NormalizedKey>(build_rows: u32) -> u32 {
    table_slots(build_rows) * (size_of::<K>() as u32 + 4)
}

/// Most build rows whose table fits `limit` bytes.
fn build_rows_per_unit<K: NormalizedKey>(limit: u32) -> u32 {
    let mut rows = 1u32;
    while table_bytes::<K>(rows * 2) <= limit {
        rows *= 2;
    }
    // Fill the largest table size up to its 3/4 load.
    let slots = table_slots(rows);
    (slots / 4 * 3).max(rows)
}

/// Work units (build begin, build end, probe begin, probe end) covering
/// every co-partition but the unmatchable one.
fn plan_units(build: &[u32], probe: &[u32], max_build_rows: u32) -> Vec<u32> {
    let partitions = build.len().saturating_sub(2);
    let mut units = vec![];
    for p in 0..partitions {
        let (b0, b1, p0, p1) = (build[p], build[p + 1], probe[p], probe[p + 1]);
        if b0 == b1 || p0 == p1 {
            continue;
        }
        let mut b = b0;
        while b < b1 {
            let b_end = b1.min(b + max_build_rows);
            let mut q = p0;
            while q < p1 {
                let q_end = p1.min(q + PROBE_SLICE_ROWS);
                units.extend([b, b_end, q, q_end]);
                q = q_end;
            }
            b = b_end;
        }
    }
    units
}

impl CudaBackend {
    fn row_ids_for<K: NormalizedKey>(relation: &Transformed<CudaBackend, K>, space: Space, side: &str) -> Result<u64> {
        match (space, &relation.row_ids) {
            (Space::Transformed, _) => Ok(0),
            (Space::Original, Some(ids)) => Ok(ids.pointer()),
            (Space::Original, None) => internal_err!("{side} rows asked for without row ids"),
        }
    }

    pub(super) fn hash_match_keys<K: NormalizedKey>(
        &self,
        build: &Transformed<CudaBackend, K>,
        probe: &Transformed<CudaBackend, K>,
        (build_space, probe_space): (Space, Space),
    ) -> Result<Candidates<CudaBackend>> {
        let (Layout::Partitioned(build_spec), Layout::Partitioned(probe_spec)) = (build.layout, probe.layout) else {
            return internal_err!("hash_match needs two partitioned relations");
        };
        if build_spec != probe_spec {
            return internal_err!("hash_match: build has {} radix bits, probe {}", build_spec.bits, probe_spec.bits);
        }
        let limit = table_limit(self.instance.device.max_shared_bytes);
        let max_build_rows = build_rows_per_unit::<K>(limit);
        let build_offsets = build.offsets.download("build partition offsets")?;
        let probe_offsets = probe.offsets.download("probe partition offsets")?;
        let units = plan_units(&build_offsets, &probe_offsets, max_build_rows);
        let unit_count = units.len() / 4;
        if unit_count == 0 {
            return self.empty_candidates();
        }
        let shared = (0..unit_count).map(|u| table_bytes::<K>(units[4 * u + 1] - units[4 * u])).max().unwrap_or(0);
        let units = DeviceBuffer::upload(&self.instance, &units, "work units")?;
        let (build_ids, probe_ids) =
            (Self::row_ids_for(build, build_space, "build")?, Self::row_ids_for(probe, probe_space, "probe")?);
        // Count, then write: every unit learns where its matches go.
        let unit_matches = DeviceBuffer::<u64>::alloc(&self.instance, unit_count, "matches per work unit")?;
        let args = [
            Arg::from(build.keys.pointer()),
            probe.keys.pointer().into(),
            units.pointer().into(),
            unit_matches.pointer().into(),
        ];
        self.launch_blocks(&self.kernel_name::<K>("hash_count"), unit_count as u64, shared, probe.rows as u64, &args)?;
        let total = self.exclusive_scan(&unit_matches)?.read()?;
        let total = usize::try_from(total)
            .map_err(|_| datafusion::common::resources_datafusion_err!("{total} matches do not fit in memory"))?;
        let out_build = DeviceBuffer::<u32>::alloc(&self.instance, total, "matched build positions")?;
        let out_probe = DeviceBuffer::<u32>::alloc(&self.instance, total, "matched probe positions")?;
        let args = [
            Arg::from(build.keys.pointer()),
            probe.keys.pointer().into(),
            units.pointer().into(),
            build_ids.into(),
            probe_ids.into(),
            out_build.pointer().into(),
            out_probe.pointer().into(),
            unit_matches.pointer().into(),
        ];
        self.launch_blocks(&self.kernel_name::<K>("hash_write"), unit_count as u64, shared, probe.rows as u64, &args)?;
        Ok(Candidates { build: out_build, probe: out_probe })
    }

    pub(super) fn merge_match_keys<K: NormalizedKey>(
        &self,
        build: &Transformed<CudaBackend, K>,
        probe: &Transformed<CudaBackend, K>,
        (build_space, probe_space): (Space, Space),
    ) -> Result<Candidates<CudaBackend>> {
        if build.layout != Layout::Sorted || probe.layout != Layout::Sorted {
            return internal_err!("merge_match needs two sorted relations");
        }
        // Unmatchable keys sort last; offsets[1] is where they start.
        let build_rows = build.offsets.download_at(1, "sorted offsets")?;
        let probe_rows = probe.offsets.download_at(1, "sorted offsets")?;
        if build_rows == 0 || probe_rows == 0 {
            return self.empty_candidates();
        }
        // One extra zero count becomes the total after the scan.
        let counts = DeviceBuffer::<u64>::filled(&self.instance, probe_rows as usize + 1, 0, "match counts")?;
        let first = DeviceBuffer::<u32>::alloc(&self.instance, probe_rows as usize, "match starts")?;
        let args = [
            Arg::from(build.keys.pointer()),
            build_rows.into(),
            probe.keys.pointer().into(),
            probe_rows.into(),
            counts.pointer().into(),
            first.pointer().into(),
        ];
        self.launch(&self.kernel_name::<K>("merge_count"), u64::from(probe_rows), 0, &args)?;
        let total = self.exclusive_scan(&counts)?.read()?;
        let total = usize::try_from(total)
            .map_err(|_| datafusion::common::resources_datafusion_err!("{total} matches do not fit in memory"))?;
        let out_build = DeviceBuffer::<u32>::alloc(&self.instance, total, "matched build positions")?;
        let out_probe = DeviceBuffer::<u32>::alloc(&self.instance, total, "matched probe positions")?;
        let args = [
            Arg::from(first.pointer()),
            counts.pointer().into(),
            probe_rows.into(),
            Self::row_ids_for(build, build_space, "build")?.into(),
            Self::row_ids_for(probe, probe_space, "probe")?.into(),
            out_build.pointer().into(),
            out_probe.pointer().into(),
        ];
        self.launch("merge_write", u64::from(probe_rows), 0, &args)?;
        Ok(Candidates { build: out_build, probe: out_probe })
    }

    fn empty_candidates(&self) -> Result<Candidates<CudaBackend>> {
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
            let rows = build_rows_per_unit::<u64>(limit);
            assert!(table_bytes::<u64>(rows) <= limit, "{rows} rows in {limit} bytes");
            assert!(u64::from(table_slots(rows)) * 3 >= u64::from(rows) * 4);
        }
        assert_eq!(build_rows_per_unit::<u32>(96 * 1024), 6144);
    }

    #[test]
    fn units_split_long_partitions_and_skip_empty_ones() {
        // Partition 0: 10 build, 40000 probe rows; 1: no build rows; then the
        // unmatchable partition.
        let build = [0, 10, 10, 12];
        let probe = [0, 40_000, 40_005, 40_010];
        let units = plan_units(&build, &probe, 6144);
        assert_eq!(units, vec![0, 10, 0, 16384, 0, 10, 16384, 32768, 0, 10, 32768, 40000]);
        let units = plan_units(&[0, 10_000, 10_000, 10_000], &[0, 5, 5, 5], 6144);
        assert_eq!(units, vec![0, 6144, 0, 5, 6144, 10_000, 0, 5]);
    }
}
