//! The strategy of a join: its algorithm and materialization pattern.

use std::fmt;

use crate::backend::Space;

/// A join algorithm: the GFTR paper's two, and a directory join for dense keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Partitioned hash join: radix partition, hash tables per co-partition.
    PartitionedHash,
    /// Sort-merge join: radix sort, merge of sorted runs.
    SortMerge,
    /// Directory join: the build side sorted, with a directory of each key
    /// code's run of rows; probe keys, neither partitioned nor sorted, find
    /// their runs by their codes. For keys whose codes are dense.
    Direct,
}

/// How one join runs: its algorithm and, per side, whether payloads are
/// gathered from the transformed relation (GFTR) or from the original rows
/// (GFUR).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strategy {
    pub algorithm: Algorithm,
    pub build_space: Space,
    pub probe_space: Space,
}

impl Strategy {
    /// `PHJ-OM`, `SMJ-UM`, … as in the paper; mixed sides read e.g. `PHJ-OM/UM`.
    pub fn label(&self) -> String {
        let algorithm = match self.algorithm {
            Algorithm::PartitionedHash => "PHJ",
            Algorithm::SortMerge => "SMJ",
            Algorithm::Direct => "DIR",
        };
        let pattern = |space| match space {
            Space::Transformed => "OM",
            Space::Original => "UM",
        };
        if self.build_space == self.probe_space {
            format!("{algorithm}-{}", pattern(self.build_space))
        } else {
            format!("{algorithm}-{}/{}", pattern(self.build_space), pattern(self.probe_space))
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Algorithm::PartitionedHash => "partitioned_hash",
            Algorithm::SortMerge => "sort_merge",
            Algorithm::Direct => "direct",
        })
    }
}
