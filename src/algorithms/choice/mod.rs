//! Choosing the algorithm and the materialization pattern of each join.
//!
//! Under `gpu_join.algorithm = auto` (and `materialization = auto`) a join
//! on a device with a cost profile runs the strategy the cost model
//! ([`cost`]) expects to be fastest for its shape ([`shape`]): partitioned
//! hash or sort-merge, or the directory join where the build side's key
//! codes are dense, and per side gathering from the transformed relation
//! (GFTR) or by row id (GFUR). The shape needs the build side's keys (runs
//! of equal keys cannot be read off statistics), so the choice is made when
//! the build side has been collected; EXPLAIN ANALYZE shows it and why.
//! Backends without a profile (the CPU reference) keep fixed rules.

mod cost;
mod observe;
mod profile;
mod shape;
mod statistics;

pub use super::definition::PlannedSizes;
pub use cost::{Estimate, estimate};
pub(crate) use observe::observe_shape;
pub use observe::planned_sizes;
pub use profile::{CostProfile, DeviceProfile, PROFILE_ROWS, device_profile, measure};
pub use shape::{JoinShape, KeyEstimates, KeySample, SampleRows, estimate_keys, sample_rows};
pub use statistics::PlanStatistics;

use datafusion::error::Result;

use super::{Algorithm, JoinDefinition, Strategy};
use crate::backend::Space;
use crate::config::{AlgorithmChoice, MaterializationChoice};

/// The strategy a join runs, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub strategy: Strategy,
    pub reason: String,
}

/// Key codes per build row up to which a directory join may run: its
/// directory then takes at most 16 bytes per build row, about what a row of
/// key and payload takes transformed.
const DIRECTORY_CODES_PER_ROW: u64 = 4;

/// The key codes of a directory over a build side of `build_rows` rows
/// whose keys take `codes` codes ([`crate::keys::KeyEncoder::code_count`]),
/// where they are dense enough for one; `None` otherwise.
pub fn directory_codes(codes: Option<u32>, build_rows: usize) -> Option<u32> {
    codes.filter(|&codes| u64::from(codes) <= DIRECTORY_CODES_PER_ROW * build_rows as u64)
}

/// The strategies the session's settings allow for a join. A join whose
/// output leaves in key order is sort-merge whatever the settings say, and
/// gathers its build side from the sorted relation: the order is that of
/// sorted build positions. Where the build side's keys are dense
/// (`directory`) and the settings allow it, the directory join is the one
/// algorithm left, its probe side in original rows (it is not
/// transformed): it needs no probe-side transform, and on the operator
/// benchmark's foreign-key join (2^27 dense build keys) it joined in 81
/// and 86 ms where the partitioned hash join took 91 and 99
/// (docs/benchmarks.md), a difference the whole-relation cost model does
/// not see: it leaves out the probe chunks' transforms and reordering.
fn candidates(definition: &JoinDefinition, directory: bool) -> Vec<Strategy> {
    let spaces: &[Space] = match definition.materialization {
        MaterializationChoice::Auto => &[Space::Transformed, Space::Original],
        MaterializationChoice::Transformed => &[Space::Transformed],
        MaterializationChoice::Untransformed => &[Space::Original],
    };
    if definition.key_order.is_some() {
        return strategies(&[Algorithm::SortMerge], &[Space::Transformed], spaces);
    }
    if directory && allows_directory(definition) {
        return strategies(&[Algorithm::Direct], spaces, &[Space::Original]);
    }
    let algorithms: &[Algorithm] = match definition.algorithm {
        AlgorithmChoice::Auto => &[Algorithm::PartitionedHash, Algorithm::SortMerge],
        AlgorithmChoice::Hash | AlgorithmChoice::Direct => &[Algorithm::PartitionedHash],
        AlgorithmChoice::SortMerge => &[Algorithm::SortMerge],
    };
    // Kept probe order matches in original probe rows anyway.
    let probe_spaces = match definition.probe_order_required {
        true => &[Space::Original],
        false => spaces,
    };
    strategies(algorithms, spaces, probe_spaces)
}

/// Every combination of the given algorithms and sides' spaces.
fn strategies(algorithms: &[Algorithm], build_spaces: &[Space], probe_spaces: &[Space]) -> Vec<Strategy> {
    let mut strategies = vec![];
    for &algorithm in algorithms {
        for &build_space in build_spaces {
            for &probe_space in probe_spaces {
                strategies.push(Strategy { algorithm, build_space, probe_space });
            }
        }
    }
    strategies
}

/// The eight strategies `auto` weighs when no setting narrows them.
pub fn every_strategy() -> Vec<Strategy> {
    let spaces = [Space::Transformed, Space::Original];
    strategies(&[Algorithm::PartitionedHash, Algorithm::SortMerge], &spaces, &spaces)
}

/// The strategy when nothing is weighed: what the session set, the
/// directory join where the build side's keys are dense (`directory`) and
/// the settings allow it, the partitioned hash join (which the GFTR paper
/// finds best nearly everywhere) otherwise, and the backend's preferred
/// materialization.
pub fn fixed_rule(preference: Space, definition: &JoinDefinition, directory: bool) -> Strategy {
    let algorithm = match definition.algorithm {
        _ if definition.key_order.is_some() => Algorithm::SortMerge,
        _ if directory && allows_directory(definition) => Algorithm::Direct,
        AlgorithmChoice::SortMerge => Algorithm::SortMerge,
        AlgorithmChoice::Auto | AlgorithmChoice::Hash | AlgorithmChoice::Direct => Algorithm::PartitionedHash,
    };
    let space = match definition.materialization {
        MaterializationChoice::Transformed => Space::Transformed,
        MaterializationChoice::Untransformed => Space::Original,
        MaterializationChoice::Auto => preference,
    };
    let build_space = if definition.key_order.is_some() { Space::Transformed } else { space };
    let probe_space = if algorithm == Algorithm::Direct { Space::Original } else { space };
    Strategy { algorithm, build_space, probe_space }
}

/// Whether the settings let a directory join run, where the build side's
/// keys turn out dense: then only they can tell the strategy.
fn allows_directory(definition: &JoinDefinition) -> bool {
    definition.key_order.is_none() && matches!(definition.algorithm, AlgorithmChoice::Auto | AlgorithmChoice::Direct)
}

/// What EXPLAIN can say before the join runs: the strategy when the
/// settings or fixed rules decide it, `None` when the build side's keys or
/// the cost model will.
pub fn planned(preference: Space, definition: &JoinDefinition, weighs: bool) -> Option<Strategy> {
    if allows_directory(definition) {
        return None;
    }
    match candidates(definition, false).as_slice() {
        [only] => Some(*only),
        _ if !weighs => Some(fixed_rule(preference, definition, false)),
        _ => None,
    }
}

/// Chooses a join's strategy. `profile` is the device's cost profile
/// (`None` for backends without one); `directory` the key codes of a
/// directory over the build side, where its keys are dense enough
/// ([`directory_codes`]); `shape` is only observed when there is something
/// to weigh.
pub fn choose(
    profile: DeviceProfile,
    preference: Space,
    definition: &JoinDefinition,
    directory: Option<u32>,
    shape: impl FnOnce() -> Result<JoinShape>,
) -> Result<Choice> {
    let dense = directory.is_some();
    let candidates = candidates(definition, dense);
    let fixed = |reason: String| Choice { strategy: fixed_rule(preference, definition, dense), reason };
    let mut choice = match (candidates.as_slice(), profile) {
        ([only], _) => Choice { strategy: *only, reason: "set by the session".to_string() },
        (_, Some(Ok(profile))) => {
            let shape = shape()?;
            weigh(&profile, &shape, &candidates).unwrap_or_else(|| fixed("fixed rule: nothing to weigh".to_string()))
        }
        (_, Some(Err(e))) => fixed(format!("fixed rule: {e}")),
        (_, None) => fixed("fixed rule".to_string()),
    };
    if let Some(codes) = directory.filter(|_| choice.strategy.algorithm == Algorithm::Direct) {
        choice.reason = format!("{}; {codes} key codes", choice.reason);
    }
    if definition.algorithm == AlgorithmChoice::Direct && allows_directory(definition) && !dense {
        choice.reason = format!("{}; the build side's keys are too sparse for a directory join", choice.reason);
    }
    Ok(choice)
}

/// Why DataFusion's operator, not the device, should join a build side of
/// `build_rows` rows as collected: the whole join, estimated again from
/// them, is below `min_rows`, where the device's fixed costs outweigh what
/// it saves. The plan passed the same check on statistics, which filters
/// and joins below it make guesses. `None` to join on the device, and when
/// the probe side's size is unknown.
pub fn below_min_rows(planned: &PlannedSizes, build_rows: usize, min_rows: usize) -> Option<String> {
    let rows = planned.join_rows(build_rows)?;
    (rows < min_rows).then(|| {
        format!(
            "{build_rows} build rows as collected make about {rows} rows to join, below gpu_join.min_rows = {min_rows}"
        )
    })
}

/// Why DataFusion's operator, not the device, should join a build side (a
/// partition's, in `Partitioned` mode) of `build_rows` rows as collected:
/// below `min_build_rows` its hash table sits in the CPU's caches, where
/// DataFusion probes each row for less than moving the row's key over PCIe
/// costs. `None` to join on the device.
pub fn below_min_build_rows(build_rows: usize, min_build_rows: usize) -> Option<String> {
    (build_rows < min_build_rows)
        .then(|| format!("{build_rows} build rows as collected, below gpu_join.min_build_rows = {min_build_rows}"))
}

/// The candidate the model expects to be fastest; `None` without candidates.
pub fn weigh(profile: &CostProfile, shape: &JoinShape, candidates: &[Strategy]) -> Option<Choice> {
    let mut estimates: Vec<(Strategy, f64)> =
        candidates.iter().map(|&s| (s, estimate(profile, shape, s).total())).collect();
    estimates.sort_by(|a, b| a.1.total_cmp(&b.1));
    let ms = |ns: f64| ns / 1e6;
    let &(best, best_ns) = estimates.first()?;
    let next = estimates.get(1).map(|(s, ns)| format!(", next {} {:.2} ms", s.label(), ms(*ns))).unwrap_or_default();
    let keys = shape.keys;
    let reason = format!(
        "estimated {:.2} ms{next}; {} build rows, {} probe rows, {}+{} payload columns, match ratio {:.2}, \
         {:.1} build rows per matching probe row",
        ms(best_ns),
        shape.build_rows,
        shape.probe_rows,
        shape.build_payloads.len(),
        shape.probe_payloads.len(),
        keys.match_ratio,
        keys.matches_per_match,
    );
    Some(Choice { strategy: best, reason })
}

#[cfg(test)]
mod tests;
