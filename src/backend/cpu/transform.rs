//! Transform phase on the CPU: stable radix partition and stable sort.

use arrow::array::ArrayRef;
use arrow::compute::take;
use datafusion::common::exec_err;
use datafusion::error::Result;

use super::instance::CpuBackend;
use crate::backend::{Layout, MAX_RELATION_ROWS, PartitionSpec, SortSpec, Transformed, positions_to_indices};
use crate::keys::NormalizedKey;

fn check_rows(rows: usize, primitive: &str) -> Result<()> {
    if rows > MAX_RELATION_ROWS {
        return exec_err!(
            "{primitive}: {rows} rows exceed the {MAX_RELATION_ROWS} rows one relation may have; \
             lower gpu_join.probe_chunk_rows or let DataFusion run this join"
        );
    }
    Ok(())
}

/// `buckets + 1` offsets of the ids in `ids` (each below `buckets`): entry
/// `b` the number of ids below `b`. A histogram, scanned.
pub(super) fn bucket_offsets(buckets: usize, ids: impl Iterator<Item = usize>) -> Vec<u32> {
    let mut offsets = vec![0u32; buckets + 1];
    for id in ids {
        offsets[id + 1] += 1;
    }
    for b in 1..offsets.len() {
        offsets[b] += offsets[b - 1];
    }
    offsets
}

/// Stable partition: a histogram of partition ids, an exclusive scan for the
/// partition offsets, then a scatter in input order.
pub(super) fn partition<K: NormalizedKey>(
    keys: &[K],
    payloads: &[&ArrayRef],
    with_row_ids: bool,
    spec: PartitionSpec,
) -> Result<Transformed<CpuBackend, K>> {
    check_rows(keys.len(), "radix partition")?;
    let partition_ids: Vec<u32> = keys.iter().map(|k| spec.partition_of(*k) as u32).collect();
    let offsets = bucket_offsets(spec.partitions() + 1, partition_ids.iter().map(|&p| p as usize));
    let mut cursor = offsets.clone();
    let mut permutation = vec![0u32; keys.len()];
    for (row, &p) in partition_ids.iter().enumerate() {
        permutation[cursor[p as usize] as usize] = row as u32;
        cursor[p as usize] += 1;
    }
    permute(keys, payloads, with_row_ids, permutation, offsets, Layout::Partitioned(spec))
}

/// Stable sort by the key bits of `spec`, as the radix passes of a GPU sort
/// order; the unmatchable key is the largest, so it sorts last.
pub(super) fn sort<K: NormalizedKey>(
    keys: &[K],
    payloads: &[&ArrayRef],
    with_row_ids: bool,
    spec: SortSpec,
) -> Result<Transformed<CpuBackend, K>> {
    check_rows(keys.len(), "radix sort")?;
    let mut permutation: Vec<u32> = (0..keys.len() as u32).collect();
    permutation.sort_by_key(|&row| spec.sort_key(keys[row as usize]));
    let matchable = keys.iter().filter(|k| **k != K::UNMATCHABLE).count() as u32;
    let offsets = vec![0, matchable, keys.len() as u32];
    permute(keys, payloads, with_row_ids, permutation, offsets, Layout::Sorted(spec))
}

/// Applies `permutation` (transformed position -> original row) to the keys,
/// payload columns and row ids.
fn permute<K: NormalizedKey>(
    keys: &[K],
    payloads: &[&ArrayRef],
    with_row_ids: bool,
    permutation: Vec<u32>,
    offsets: Vec<u32>,
    layout: Layout,
) -> Result<Transformed<CpuBackend, K>> {
    let transformed_keys = permutation.iter().map(|&row| keys[row as usize]).collect();
    let indices = positions_to_indices(&permutation);
    let payloads =
        payloads.iter().map(|column| Ok(take(column.as_ref(), &indices, None)?)).collect::<Result<Vec<_>>>()?;
    Ok(Transformed {
        keys: transformed_keys,
        rows: permutation.len(),
        row_ids: with_row_ids.then_some(permutation),
        payloads,
        offsets,
        layout,
        hash_tables: None,
        directory: None,
    })
}
