//! The cost model: a join's time under one strategy, phase by phase, from
//! the device's cost profile and the join's shape.
//!
//! It follows the GFTR paper's analysis: transforming carries every byte a
//! row holds through each radix pass, so gathering from the transformed
//! relation pays for payload bytes up front and then gathers clustered;
//! gathering by row id moves 4-byte row ids instead and pays a scattered
//! read per output value, which grows with the source column's size. The
//! hash match walks a run of equal build keys row by row, so a build side
//! of long runs costs its rows times their runs; the merge match spreads pairs
//! evenly over threads. A directory join transforms its build side only,
//! and finds each probe row's run by its code.

use super::profile::CostProfile;
use super::shape::JoinShape;
use crate::algorithms::{Algorithm, Strategy};
use crate::backend::Space;

/// Build rows one hash-match work unit's shared-memory table holds (about
/// 9,000 4-byte keys in 96 KiB at a load of 3/4): the furthest a run of
/// equal keys makes one row walk.
const HASH_UNIT_ROWS: f64 = 8192.0;

/// Estimated nanoseconds of each phase.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub transform: f64,
    pub matching: f64,
    pub materialize: f64,
}

impl Estimate {
    pub fn total(&self) -> f64 {
        self.transform + self.matching + self.materialize
    }
}

/// How a side's output gathers read its columns.
#[derive(Clone, Copy, PartialEq)]
enum Reads {
    /// Within one partition's rows at a time (a transformed column), or in
    /// order (a directory join's probe side, whose matches come in probe
    /// order).
    Clustered,
    /// Anywhere in the column, by row id.
    ByRowId,
    /// Anywhere in the column, and by row id where its side is in original
    /// rows: a directory join's build side, whose matches come in probe
    /// order.
    Scattered,
}

/// One side as the model needs it.
struct Side<'a> {
    rows: f64,
    payloads: &'a [u32],
    row_ids_anyway: bool,
    space: Space,
    reads: Reads,
}

impl Side<'_> {
    /// Bytes a row carries through each radix pass, key included.
    fn transformed_bytes(&self, key_bytes: f64) -> f64 {
        match self.space {
            Space::Original => key_bytes + 4.0,
            Space::Transformed => {
                let ids = if self.row_ids_anyway { 4.0 } else { 0.0 };
                key_bytes + ids + self.payloads.iter().map(|&w| w as f64).sum::<f64>()
            }
        }
    }

    /// What reading an output row's row id costs, where it is read
    /// anywhere among them.
    fn row_id_reads(&self, profile: &CostProfile) -> f64 {
        match (self.reads, self.space, self.payloads.is_empty()) {
            (Reads::Scattered, Space::Original, false) => profile.random_value_ns(self.rows * 4.0),
            _ => 0.0,
        }
    }

    fn materialize(&self, profile: &CostProfile, output_rows: f64) -> f64 {
        self.payloads
            .iter()
            .map(|&width| match self.reads {
                Reads::Clustered => profile.clustered_byte_ns * width as f64,
                Reads::ByRowId | Reads::Scattered => profile.random_value_ns(self.rows * width as f64),
            })
            .sum::<f64>()
            * output_rows
            + self.row_id_reads(profile) * output_rows
    }
}

pub fn estimate(profile: &CostProfile, shape: &JoinShape, strategy: Strategy) -> Estimate {
    let build = Side {
        rows: shape.build_rows as f64,
        payloads: &shape.build_payloads,
        row_ids_anyway: shape.row_ids_anyway.0,
        space: strategy.build_space,
        reads: match (strategy.algorithm, strategy.build_space) {
            (Algorithm::Direct, _) => Reads::Scattered,
            (_, Space::Transformed) => Reads::Clustered,
            (_, Space::Original) => Reads::ByRowId,
        },
    };
    let probe = Side {
        rows: shape.probe_rows as f64,
        payloads: &shape.probe_payloads,
        row_ids_anyway: shape.row_ids_anyway.1,
        space: strategy.probe_space,
        reads: match (strategy.algorithm, strategy.probe_space) {
            (Algorithm::Direct, _) | (_, Space::Transformed) => Reads::Clustered,
            (_, Space::Original) => Reads::ByRowId,
        },
    };
    let key_bytes = shape.key_bytes as f64;
    let (passes, row_ns, byte_ns) = match strategy.algorithm {
        Algorithm::PartitionedHash => (shape.partition_passes, profile.partition_row_ns, profile.partition_byte_ns),
        Algorithm::SortMerge => (shape.sort_passes, profile.sort_row_ns, profile.sort_byte_ns),
        // The directory, up to four codes per build row, costs about a pass.
        Algorithm::Direct => (shape.sort_passes + 1, profile.sort_row_ns, profile.sort_byte_ns),
    };
    // A directory join leaves its probe side as it is.
    let transformed: &[&Side] = match strategy.algorithm {
        Algorithm::Direct => &[&build],
        _ => &[&build, &probe],
    };
    let transform = transformed
        .iter()
        .map(|side| side.rows * passes as f64 * (row_ns + byte_ns * side.transformed_bytes(key_bytes)))
        .sum();
    let output = shape.output_rows();
    let inputs = build.rows + probe.rows;
    let keys = shape.keys;
    // Every probe row matching once ends the match after one search.
    let foreign_key = keys.match_ratio >= 0.999 && keys.matches_per_match <= 1.001;
    let matching = match strategy.algorithm {
        Algorithm::PartitionedHash => {
            // Equal keys share a cluster of the open-addressing table: each
            // build row inserted and each probe row matched walks its run,
            // as far as one work unit's table holds.
            let run = keys.matches_per_match.min(HASH_UNIT_ROWS) - 1.0;
            let walkers = build.rows + probe.rows * keys.match_ratio;
            profile.hash_row_ns * (inputs + output) + profile.hash_step_ns * walkers * run.max(0.0)
        }
        Algorithm::SortMerge => match foreign_key {
            true => profile.merge_row_ns * inputs,
            false => 2.0 * profile.merge_row_ns * inputs + profile.merge_pair_ns * output,
        },
        // Runs found by code, then expanded as the merge match's are.
        Algorithm::Direct => match foreign_key {
            true => profile.directory_row_ns * probe.rows,
            false => 2.0 * profile.directory_row_ns * probe.rows + profile.merge_pair_ns * output,
        },
    };
    let materialize = build.materialize(profile, output) + probe.materialize(profile, output);
    Estimate { transform, matching, materialize }
}
