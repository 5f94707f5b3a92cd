//! The algorithm-specific steps: how a relation is transformed and how
//! matches are found. The probe side always follows the build side's layout.

use datafusion::common::internal_err;
use datafusion::error::Result;
use datafusion::physical_plan::metrics::Time;

use super::Algorithm;
use crate::backend::{Candidates, JoinBackend, Layout, MatchFlags, PartitionSpec, Space, Transformed};
use crate::keys::{KeyEncoder, NormalizedKey};

/// Where the time of a join goes, phase by phase.
#[derive(Debug, Clone, Default)]
pub struct PhaseTimers {
    pub transform: Time,
    pub matching: Time,
    pub materialize: Time,
}

/// Transforms the build side: a radix partition with enough bits that build
/// partitions fit the backend's fast memory (partitioned hash join), or a
/// radix sort over the key bits in use (sort-merge join), with a directory
/// of each key code's run (directory join).
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
        Algorithm::Direct => {
            let Some(codes) = encoder.code_count() else {
                return internal_err!("a directory join over keys of no code count ({})", encoder.describe());
            };
            let mut relation = backend.sort(keys, payloads, with_row_ids, encoder.sort_spec::<K>())?;
            relation.directory = Some(backend.directory(&relation, codes)?);
            Ok(relation)
        }
    }
}

/// Transforms a probe chunk exactly as the build side was transformed;
/// `None` where the build side has a directory, in which probe keys as they
/// are find their matches.
pub(crate) fn transform_probe<B: JoinBackend, K: NormalizedKey>(
    backend: &B,
    build: &Transformed<B, K>,
    keys: &B::Vector<K>,
    payloads: &[&B::Column],
    with_row_ids: bool,
) -> Result<Option<Transformed<B, K>>> {
    let relation = match (build.layout, &build.directory) {
        (_, Some(_)) => return Ok(None),
        (Layout::Partitioned(spec), None) => backend.partition(keys, payloads, with_row_ids, spec)?,
        (Layout::Sorted(spec), None) => backend.sort(keys, payloads, with_row_ids, spec)?,
    };
    Ok(Some(relation))
}

/// Candidate pairs of a build side with a directory and probe keys as they
/// are, probe positions in original rows.
pub(crate) fn find_directory_matches<B: JoinBackend, K: NormalizedKey>(
    backend: &B,
    build: &Transformed<B, K>,
    probe_keys: &B::Vector<K>,
    build_space: Space,
) -> Result<Candidates<B>> {
    match &build.directory {
        Some(directory) => backend.directory_match(build, directory, probe_keys, build_space),
        None => internal_err!("a directory match of a build side without a directory"),
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

/// Flags the rows with a match, without making pairs, the way
/// [`find_matches`] would pair them.
pub(crate) fn mark_matches<B: JoinBackend, K: NormalizedKey>(
    backend: &B,
    build: &Transformed<B, K>,
    probe: &Transformed<B, K>,
    spaces: (Space, Space),
    flags: MatchFlags<'_, B>,
) -> Result<()> {
    match build.layout {
        Layout::Partitioned(_) => match &build.hash_tables {
            Some(tables) => backend.hash_mark(build, tables, probe, spaces, flags),
            None => internal_err!("a partitioned build side without hash tables"),
        },
        Layout::Sorted(_) => backend.merge_mark(build, probe, spaces, flags),
    }
}

/// Flags the rows with a match, without making pairs, the way
/// [`find_directory_matches`] would pair them.
pub(crate) fn mark_directory_matches<B: JoinBackend, K: NormalizedKey>(
    backend: &B,
    build: &Transformed<B, K>,
    probe_keys: &B::Vector<K>,
    build_space: Space,
    flags: MatchFlags<'_, B>,
) -> Result<()> {
    match &build.directory {
        Some(directory) => backend.directory_mark(build, directory, probe_keys, build_space, flags),
        None => internal_err!("a directory mark of a build side without a directory"),
    }
}
