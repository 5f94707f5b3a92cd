//! The algorithm-specific steps: how a relation is transformed and how
//! matches are found. The probe side always follows the build side's layout.

use datafusion::common::internal_err;
use datafusion::error::Result;

use super::Algorithm;
use crate::backend::{Candidates, JoinBackend, Layout, PartitionSpec, Space, Transformed};
use crate::keys::{KeyEncoder, NormalizedKey};

/// Transforms the build side: a radix partition with enough bits that build
/// partitions fit the backend's fast memory (partitioned hash join), or a
/// radix sort over the key bits in use (sort-merge join).
pub(crate) fn transform_build<B: JoinBackend, K: NormalizedKey>(
    backend: &B,
    algorithm: Algorithm,
    encoder: &KeyEncoder,
    keys: &B::Vector<K>,
    payloads: &[&B::Column],
    with_row_ids: bool,
) -> Result<Transformed<B, K>> {
    match algorithm {
        Algorithm::PartitionedHash => {
            let spec = PartitionSpec::for_build_rows(backend.len(keys), backend.partition_target_rows());
            let mut relation = backend.partition(keys, payloads, with_row_ids, spec)?;
            relation.hash_tables = Some(backend.hash_tables(&relation)?);
            Ok(relation)
        }
        Algorithm::SortMerge => backend.sort(keys, payloads, with_row_ids, encoder.sort_spec::<K>()),
    }
}

/// Transforms a probe chunk exactly as the build side was transformed.
pub(crate) fn transform_probe<B: JoinBackend, K: NormalizedKey>(
    backend: &B,
    build_layout: Layout,
    keys: &B::Vector<K>,
    payloads: &[&B::Column],
    with_row_ids: bool,
) -> Result<Transformed<B, K>> {
    match build_layout {
        Layout::Partitioned(spec) => backend.partition(keys, payloads, with_row_ids, spec),
        Layout::Sorted(spec) => backend.sort(keys, payloads, with_row_ids, spec),
    }
}

/// Candidate pairs: the build side's hash tables per co-partition, or a
/// merge of sorted runs.
pub(crate) fn find_matches<B: JoinBackend, K: NormalizedKey>(
    backend: &B,
    build: &Transformed<B, K>,
    probe: &Transformed<B, K>,
    spaces: (Space, Space),
) -> Result<Candidates<B>> {
    match build.layout {
        Layout::Partitioned(_) => match &build.hash_tables {
            Some(tables) => backend.hash_match(build, tables, probe, spaces),
            None => internal_err!("a partitioned build side without hash tables"),
        },
        Layout::Sorted(_) => backend.merge_match(build, probe, spaces),
    }
}
