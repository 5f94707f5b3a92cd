//! Match phase on the CPU: a chained hash table per co-partition, a merge
//! of sorted runs, and a sorted build side's directory of key codes.

use datafusion::common::internal_err;
use datafusion::error::Result;
use rayon::prelude::*;

use super::instance::CpuBackend;
use super::transform::bucket_offsets;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::backend::{Candidates, Layout, MatchFlags, Space, Transformed, check_sorted_alike};
use crate::keys::NormalizedKey;

/// Pairs of transformed positions.
pub(super) struct Pairs {
    build: Vec<u32>,
    probe: Vec<u32>,
}

impl Pairs {
    pub(super) fn len(&self) -> usize {
        self.probe.len()
    }
}

const END_OF_CHAIN: u32 = u32::MAX;

/// The hash table bucket of a key; independent of the bits that chose the
/// partition, which are the same for every key of a co-partition.
fn bucket<K: NormalizedKey>(key: K, mask: usize) -> usize {
    ((key.to_u64().wrapping_mul(0xD6E8_FEB8_6659_FD93) >> 32) as usize) & mask
}

/// A chained hash table per build co-partition, in the order of the
/// partitions (the unmatchable partition has none).
pub struct ChainedTables {
    tables: Vec<ChainedTable>,
}

struct ChainedTable {
    mask: usize,
    /// The first build row (within the co-partition) of each bucket.
    heads: Vec<u32>,
    /// The next build row of the same bucket after each build row.
    next: Vec<u32>,
}

impl ChainedTable {
    fn new<K: NormalizedKey>(build: &[K]) -> Self {
        let mask = build.len().next_power_of_two() * 2 - 1;
        let mut heads = vec![END_OF_CHAIN; mask + 1];
        let mut next = vec![END_OF_CHAIN; build.len()];
        // Inserting in reverse makes every chain list build rows in ascending order.
        for (i, key) in build.iter().enumerate().rev() {
            let b = bucket(*key, mask);
            next[i] = heads[b];
            heads[b] = i as u32;
        }
        Self { mask, heads, next }
    }
}

pub(super) fn hash_tables<K: NormalizedKey>(build: &Transformed<CpuBackend, K>) -> Result<ChainedTables> {
    let Layout::Partitioned(spec) = build.layout else {
        return internal_err!("hash tables need a partitioned build side");
    };
    let tables = (0..spec.partitions())
        .into_par_iter()
        .map(|p| ChainedTable::new(&build.keys[build.offsets[p] as usize..build.offsets[p + 1] as usize]))
        .collect();
    Ok(ChainedTables { tables })
}

pub(super) fn hash_match<K: NormalizedKey>(
    build: &Transformed<CpuBackend, K>,
    tables: &ChainedTables,
    probe: &Transformed<CpuBackend, K>,
) -> Result<Pairs> {
    let (Layout::Partitioned(build_spec), Layout::Partitioned(probe_spec)) = (build.layout, probe.layout) else {
        return internal_err!("hash_match needs two partitioned relations");
    };
    if build_spec != probe_spec {
        return internal_err!("hash_match: build has {} radix bits, probe {}", build_spec.bits, probe_spec.bits);
    }
    let partitions = build_spec.partitions();
    if tables.tables.len() != partitions {
        return internal_err!("hash_match: {} hash tables for {partitions} partitions", tables.tables.len());
    }
    // The last partition holds unmatchable keys and is skipped.
    let per_partition: Vec<Pairs> = (0..partitions)
        .into_par_iter()
        .map(|p| {
            let (b0, b1) = (build.offsets[p] as usize, build.offsets[p + 1] as usize);
            let (p0, p1) = (probe.offsets[p] as usize, probe.offsets[p + 1] as usize);
            join_co_partition(&build.keys[b0..b1], &tables.tables[p], b0 as u32, &probe.keys[p0..p1], p0 as u32)
        })
        .collect();
    let total = per_partition.iter().map(|p| p.build.len()).sum();
    let mut pairs = Pairs { build: Vec::with_capacity(total), probe: Vec::with_capacity(total) };
    for part in per_partition {
        pairs.build.extend(part.build);
        pairs.probe.extend(part.probe);
    }
    Ok(pairs)
}

fn join_co_partition<K: NormalizedKey>(
    build: &[K],
    table: &ChainedTable,
    build_base: u32,
    probe: &[K],
    probe_base: u32,
) -> Pairs {
    let mut pairs = Pairs { build: vec![], probe: vec![] };
    if build.is_empty() {
        return pairs;
    }
    for (j, key) in probe.iter().enumerate() {
        let mut i = table.heads[bucket(*key, table.mask)];
        while i != END_OF_CHAIN {
            if build[i as usize] == *key {
                pairs.build.push(build_base + i);
                pairs.probe.push(probe_base + j as u32);
            }
            i = table.next[i as usize];
        }
    }
    pairs
}

pub(super) fn merge_match<K: NormalizedKey>(
    build: &Transformed<CpuBackend, K>,
    probe: &Transformed<CpuBackend, K>,
) -> Result<Pairs> {
    check_sorted_alike(build.layout, probe.layout)?;
    // Unmatchable keys sort last; offsets[1] is where they start.
    let b = &build.keys[..build.offsets[1] as usize];
    let p = &probe.keys[..probe.offsets[1] as usize];
    let mut pairs = Pairs { build: vec![], probe: vec![] };
    let (mut i, mut j) = (0, 0);
    while i < b.len() && j < p.len() {
        match b[i].cmp(&p[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                let i_end = i + b[i..].iter().take_while(|k| **k == b[i]).count();
                let j_end = j + p[j..].iter().take_while(|k| **k == p[j]).count();
                for bi in i..i_end {
                    for pj in j..j_end {
                        pairs.build.push(bi as u32);
                        pairs.probe.push(pj as u32);
                    }
                }
                (i, j) = (i_end, j_end);
            }
        }
    }
    Ok(pairs)
}

pub(super) fn directory<K: NormalizedKey>(build: &Transformed<CpuBackend, K>, codes: u32) -> Result<Vec<u32>> {
    let Layout::Sorted(_) = build.layout else {
        return internal_err!("a directory needs a sorted build side");
    };
    // The unmatchable key and codes past the directory are left out.
    let codes_in = build.keys.iter().map(|k| k.to_u64()).filter(|&k| k < u64::from(codes)).map(|k| k as usize);
    Ok(bucket_offsets(codes as usize, codes_in))
}

pub(super) fn directory_match<K: NormalizedKey>(
    build: &Transformed<CpuBackend, K>,
    directory: &[u32],
    probe: &[K],
    build_space: Space,
) -> Result<Candidates<CpuBackend>> {
    let codes = directory.len().saturating_sub(1) as u64;
    let mut pairs = Pairs { build: vec![], probe: vec![] };
    for (j, key) in probe.iter().enumerate() {
        let code = key.to_u64();
        if code >= codes {
            continue;
        }
        for b in directory[code as usize]..directory[code as usize + 1] {
            pairs.build.push(b);
            pairs.probe.push(j as u32);
        }
    }
    Ok(Candidates { build: in_space(pairs.build, build.row_ids.as_ref(), build_space, "build")?, probe: pairs.probe })
}

/// Transformed positions of a side as asked for: as they are, or mapped to
/// original rows by the side's row ids.
fn in_space(positions: Vec<u32>, row_ids: Option<&Vec<u32>>, space: Space, side: &str) -> Result<Vec<u32>> {
    match (space, row_ids) {
        (Space::Transformed, _) => Ok(positions),
        (Space::Original, Some(ids)) => Ok(positions.iter().map(|&p| ids[p as usize]).collect()),
        (Space::Original, None) => internal_err!("{side} rows asked for without row ids"),
    }
}

/// Maps transformed positions to original rows for sides asked for in
/// [`Space::Original`].
pub(super) fn into_spaces<K: NormalizedKey>(
    pairs: Pairs,
    build: &Transformed<CpuBackend, K>,
    probe: &Transformed<CpuBackend, K>,
    (build_space, probe_space): (Space, Space),
) -> Result<Candidates<CpuBackend>> {
    Ok(Candidates {
        build: in_space(pairs.build, build.row_ids.as_ref(), build_space, "build")?,
        probe: in_space(pairs.probe, probe.row_ids.as_ref(), probe_space, "probe")?,
    })
}

/// Flags of the rows with a match, as [`MatchFlags`] says, by transformed
/// position: each side's positions mapped as its space asks.
struct Marks<'a> {
    build: Option<(&'a [AtomicBool], Option<&'a Vec<u32>>)>,
    probe: Option<(&'a [AtomicBool], Option<&'a Vec<u32>>)>,
}

impl<'a> Marks<'a> {
    fn new<K: NormalizedKey>(
        flags: MatchFlags<'a, CpuBackend>,
        build: &'a Transformed<CpuBackend, K>,
        probe_ids: Option<&'a Vec<u32>>,
        (build_space, probe_space): (Space, Space),
    ) -> Result<Self> {
        let ids = |space, ids: Option<&'a Vec<u32>>, side| match (space, ids) {
            (Space::Transformed, _) => Ok(None),
            (Space::Original, Some(ids)) => Ok(Some(ids)),
            (Space::Original, None) => internal_err!("{side} rows asked for without row ids"),
        };
        Ok(Self {
            build: flags
                .build
                .map(|f| {
                    Ok::<_, datafusion::error::DataFusionError>((
                        f.as_slice(),
                        ids(build_space, build.row_ids.as_ref(), "build")?,
                    ))
                })
                .transpose()?,
            probe: flags
                .probe
                .map(|f| {
                    Ok::<_, datafusion::error::DataFusionError>((f.as_slice(), ids(probe_space, probe_ids, "probe")?))
                })
                .transpose()?,
        })
    }

    fn set(side: Option<(&[AtomicBool], Option<&Vec<u32>>)>, position: u32) -> Result<()> {
        if let Some((flags, ids)) = side {
            let at = ids.map_or(Some(position), |ids| ids.get(position as usize).copied());
            match at.and_then(|at| flags.get(at as usize)) {
                Some(flag) => flag.store(true, Ordering::Relaxed),
                None => return internal_err!("a match at position {position} of {} flags", flags.len()),
            }
        }
        Ok(())
    }

    fn build(&self, position: u32) -> Result<()> {
        Self::set(self.build, position)
    }

    fn probe(&self, position: u32) -> Result<()> {
        Self::set(self.probe, position)
    }
}

pub(super) fn hash_mark<K: NormalizedKey>(
    build: &Transformed<CpuBackend, K>,
    tables: &ChainedTables,
    probe: &Transformed<CpuBackend, K>,
    spaces: (Space, Space),
    flags: MatchFlags<'_, CpuBackend>,
) -> Result<()> {
    let (Layout::Partitioned(build_spec), Layout::Partitioned(probe_spec)) = (build.layout, probe.layout) else {
        return internal_err!("hash_mark needs two partitioned relations");
    };
    if build_spec != probe_spec || tables.tables.len() != build_spec.partitions() {
        return internal_err!("hash_mark: the relations are not partitioned alike");
    }
    let marks = Marks::new(flags, build, probe.row_ids.as_ref(), spaces)?;
    // The last partition holds unmatchable keys and is skipped.
    (0..build_spec.partitions()).into_par_iter().try_for_each(|p| {
        let (b0, b1) = (build.offsets[p] as usize, build.offsets[p + 1] as usize);
        let (p0, p1) = (probe.offsets[p] as usize, probe.offsets[p + 1] as usize);
        let (keys, table) = (&build.keys[b0..b1], &tables.tables[p]);
        if keys.is_empty() {
            return Ok(());
        }
        for (j, key) in probe.keys[p0..p1].iter().enumerate() {
            let mut i = table.heads[bucket(*key, table.mask)];
            while i != END_OF_CHAIN {
                if keys[i as usize] == *key {
                    marks.probe((p0 + j) as u32)?;
                    if marks.build.is_none() {
                        break;
                    }
                    marks.build((b0 + i as usize) as u32)?;
                }
                i = table.next[i as usize];
            }
        }
        Ok(())
    })
}

pub(super) fn merge_mark<K: NormalizedKey>(
    build: &Transformed<CpuBackend, K>,
    probe: &Transformed<CpuBackend, K>,
    spaces: (Space, Space),
    flags: MatchFlags<'_, CpuBackend>,
) -> Result<()> {
    check_sorted_alike(build.layout, probe.layout)?;
    let marks = Marks::new(flags, build, probe.row_ids.as_ref(), spaces)?;
    let b = &build.keys[..build.offsets[1] as usize];
    let p = &probe.keys[..probe.offsets[1] as usize];
    // Each side's rows look for their key among the other side's sorted keys.
    for (i, key) in b.iter().enumerate() {
        if marks.build.is_some() && p.binary_search(key).is_ok() {
            marks.build(i as u32)?;
        }
    }
    for (j, key) in p.iter().enumerate() {
        if marks.probe.is_some() && b.binary_search(key).is_ok() {
            marks.probe(j as u32)?;
        }
    }
    Ok(())
}

pub(super) fn directory_mark<K: NormalizedKey>(
    build: &Transformed<CpuBackend, K>,
    directory: &[u32],
    probe: &[K],
    build_space: Space,
    flags: MatchFlags<'_, CpuBackend>,
) -> Result<()> {
    let marks = Marks::new(flags, build, None, (build_space, Space::Transformed))?;
    let codes = directory.len().saturating_sub(1) as u64;
    let mut seen = vec![false; codes as usize];
    for (j, key) in probe.iter().enumerate() {
        let code = key.to_u64();
        if code < codes && directory[code as usize + 1] > directory[code as usize] {
            seen[code as usize] = true;
            marks.probe(j as u32)?;
        }
    }
    if marks.build.is_some() {
        for (i, key) in build.keys.iter().enumerate() {
            if seen.get(key.to_u64() as usize).copied().unwrap_or(false) {
                marks.build(i as u32)?;
            }
        }
    }
    Ok(())
}
