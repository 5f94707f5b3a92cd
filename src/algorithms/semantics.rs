//! Join-type semantics from matched pairs and flags.
//!
//! After the residual checks every candidate pair is a match. Probe-side
//! results are settled per probe chunk; build-side results (unmatched rows of
//! Left and Full joins, LeftSemi, LeftAnti, LeftMark) come from a flag per
//! build row, emitted once the whole probe side has been seen.

use datafusion::common::{JoinType, internal_err};
use datafusion::error::Result;

use super::JoinDefinition;
use super::side::SideView;
use crate::backend::{Candidates, JoinBackend};

/// The rows of one side of the output.
pub(crate) enum SideRows<B: JoinBackend> {
    /// Positions in the side's space; null positions give null values.
    /// The flag tells whether any position may be null (outer padding).
    Positions(B::Vector<u32>, bool),
    /// Every value is null (the padding of unmatched build rows), or the
    /// side has no output columns.
    Null,
}

/// The rows of an output batch, before materialization.
pub(crate) struct OutputRows<B: JoinBackend> {
    pub build: SideRows<B>,
    pub probe: SideRows<B>,
    pub mark: Option<Vec<bool>>,
    pub len: usize,
}

impl<B: JoinBackend> OutputRows<B> {
    fn pairs(backend: &B, build: B::Vector<u32>, probe: B::Vector<u32>) -> Self {
        let len = backend.len(&probe);
        Self { build: SideRows::Positions(build, false), probe: SideRows::Positions(probe, false), mark: None, len }
    }

    /// Pairs whose build side is padded with null positions.
    fn padded_pairs(backend: &B, build: B::Vector<u32>, probe: B::Vector<u32>) -> Self {
        let len = backend.len(&probe);
        Self { build: SideRows::Positions(build, true), probe: SideRows::Positions(probe, false), mark: None, len }
    }

    fn build_only(backend: &B, build: B::Vector<u32>, mark: Option<Vec<bool>>) -> Self {
        let len = backend.len(&build);
        Self { build: SideRows::Positions(build, false), probe: SideRows::Null, mark, len }
    }

    fn probe_only(backend: &B, probe: B::Vector<u32>, mark: Option<Vec<bool>>) -> Self {
        let len = backend.len(&probe);
        Self { build: SideRows::Null, probe: SideRows::Positions(probe, false), mark, len }
    }

    fn empty() -> Self {
        Self { build: SideRows::Null, probe: SideRows::Null, mark: None, len: 0 }
    }
}

/// The output rows one probe chunk settles; marks visited build rows.
pub(crate) fn resolve_probe_chunk<B: JoinBackend>(
    backend: &B,
    definition: &JoinDefinition,
    matches: Candidates<B>,
    probe_rows: usize,
    visited: Option<&B::Flags>,
    keep_probe_order: bool,
) -> Result<OutputRows<B>> {
    if let Some(visited) = visited {
        backend.set_flags(visited, &matches.build)?;
    }
    let probe_flags = |backend: &B, matches: &Candidates<B>| -> Result<B::Flags> {
        let flags = backend.new_flags(probe_rows)?;
        backend.set_flags(&flags, &matches.probe)?;
        Ok(flags)
    };
    let rows = match definition.join_type {
        JoinType::Inner | JoinType::Left => OutputRows::pairs(backend, matches.build, matches.probe),
        JoinType::Right | JoinType::Full => {
            let unmatched = backend.flagged(&probe_flags(backend, &matches)?, false)?;
            let padding = backend.null_positions(backend.len(&unmatched))?;
            OutputRows::padded_pairs(
                backend,
                backend.concat(&matches.build, &padding)?,
                backend.concat(&matches.probe, &unmatched)?,
            )
        }
        JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark => OutputRows::empty(),
        JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark => {
            from_probe_flags(backend, definition.join_type, &probe_flags(backend, &matches)?, probe_rows)?
        }
    };
    if keep_probe_order {
        return in_probe_order(backend, rows);
    }
    Ok(rows)
}

/// The output rows one probe chunk settles where a match flagged the rows
/// with a match and made no pairs ([`JoinDefinition::needs_no_pairs`]):
/// build-side joins emit their rows at the end, from the visited flags;
/// probe-side ones emit the probe rows `probe_flags` says, which come in
/// ascending positions, so in probe order where the positions are original
/// rows.
pub(crate) fn resolve_from_flags<B: JoinBackend>(
    backend: &B,
    definition: &JoinDefinition,
    probe_flags: Option<&B::Flags>,
    probe_rows: usize,
) -> Result<OutputRows<B>> {
    match (definition.join_type, probe_flags) {
        (JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark, _) => Ok(OutputRows::empty()),
        (JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark, Some(flags)) => {
            from_probe_flags(backend, definition.join_type, flags, probe_rows)
        }
        (join_type, _) => internal_err!("GPU join: a {join_type} join resolved from flags alone"),
    }
}

/// The output rows of a probe-side semi, anti or mark join, from the flags
/// of the chunk's `probe_rows` rows that have a match.
fn from_probe_flags<B: JoinBackend>(
    backend: &B,
    join_type: JoinType,
    flags: &B::Flags,
    probe_rows: usize,
) -> Result<OutputRows<B>> {
    match join_type {
        JoinType::RightMark => {
            let mark = backend.download_flags(flags)?;
            Ok(OutputRows::probe_only(backend, backend.sequence(probe_rows)?, Some(mark)))
        }
        _ => {
            let probe = backend.flagged(flags, join_type == JoinType::RightSemi)?;
            Ok(OutputRows::probe_only(backend, probe, None))
        }
    }
}

/// `rows` reordered by probe row when each of the chunk's `probe_rows`
/// rows is in them exactly once, as in a foreign-key join, and whether they
/// were: the probe positions are then the chunk's rows in order (a
/// sequence), so the chunk's own columns are the output's and nothing of
/// them needs to be moved or gathered. The build positions are scattered
/// into probe order, which also tells whether the probe positions were a
/// permutation; pairs already in probe order scatter onto themselves.
pub(crate) fn each_probe_row_once<B: JoinBackend>(
    backend: &B,
    rows: OutputRows<B>,
    probe_rows: usize,
) -> Result<(OutputRows<B>, bool)> {
    let SideRows::Positions(probe, false) = &rows.probe else {
        return Ok((rows, false));
    };
    if probe_rows == 0 || rows.len != probe_rows || rows.mark.is_some() {
        return Ok((rows, false));
    }
    // Without build positions, the probe positions' own scatter is the check.
    let (values, padded) = match &rows.build {
        SideRows::Positions(build, padded) => (build, Some(*padded)),
        SideRows::Null => (probe, None),
    };
    let Some(scattered) = backend.scatter_permutation(probe, values, probe_rows)? else {
        return Ok((rows, false));
    };
    let build = match padded {
        Some(padded) => SideRows::Positions(scattered, padded),
        None => SideRows::Null,
    };
    let probe = SideRows::Positions(backend.sequence(probe_rows)?, false);
    Ok((OutputRows { build, probe, mark: None, len: probe_rows }, true))
}

/// Reorders pairs by probe row; flag-derived outputs are already ascending.
pub(crate) fn in_probe_order<B: JoinBackend>(backend: &B, rows: OutputRows<B>) -> Result<OutputRows<B>> {
    match (&rows.build, &rows.probe) {
        (SideRows::Positions(build, padded), SideRows::Positions(probe, _)) => {
            let (probe, build) = backend.sort_pairs(probe, build)?;
            Ok(match padded {
                true => OutputRows::padded_pairs(backend, build, probe),
                false => OutputRows::pairs(backend, build, probe),
            })
        }
        _ => Ok(rows),
    }
}

/// Every output row of a partition whose probe side was joined as one chunk,
/// in the build side's key order (see [`super::KeyOrder`]); marks visited
/// build rows. Build positions are positions in the sorted build relation,
/// so ordering rows by them orders them by key.
pub(crate) fn resolve_in_key_order<B: JoinBackend>(
    backend: &B,
    definition: &JoinDefinition,
    build: &SideView<'_, B>,
    matches: Candidates<B>,
    visited: Option<&B::Flags>,
    build_rows: usize,
) -> Result<OutputRows<B>> {
    if let Some(visited) = visited {
        backend.set_flags(visited, &matches.build)?;
    }
    let probe_ordered = definition.key_order.as_ref().is_some_and(|order| order.probe_ordered);
    match (definition.join_type, visited) {
        (JoinType::Inner, _) => {
            let (build, probe) = by_build_row(backend, matches.build, matches.probe, probe_ordered)?;
            Ok(OutputRows::pairs(backend, build, probe))
        }
        (JoinType::Left, Some(visited)) => {
            let unmatched = backend.flagged(visited, false)?;
            let padding = backend.null_positions(backend.len(&unmatched))?;
            let (build, probe) = by_build_row(
                backend,
                backend.concat(&matches.build, &unmatched)?,
                backend.concat(&matches.probe, &padding)?,
                probe_ordered,
            )?;
            let len = backend.len(&build);
            Ok(OutputRows {
                build: SideRows::Positions(build, false),
                probe: SideRows::Positions(probe, true),
                mark: None,
                len,
            })
        }
        (JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark, Some(visited)) => {
            let rows = build_side_rows(backend, definition, build, visited, build_rows, ProbeSummary::default())?;
            Ok(rows.unwrap_or_else(OutputRows::empty))
        }
        (join_type, _) => internal_err!("GPU join: a {join_type} join does not leave in the build side's key order"),
    }
}

/// Pairs ordered by build position, those of one build row by probe
/// position when the probe side's order counts; both sorts are stable.
fn by_build_row<B: JoinBackend>(
    backend: &B,
    build: B::Vector<u32>,
    probe: B::Vector<u32>,
    probe_ordered: bool,
) -> Result<(B::Vector<u32>, B::Vector<u32>)> {
    let (probe, build) = match probe_ordered {
        true => backend.sort_pairs(&probe, &build)?,
        false => (probe, build),
    };
    backend.sort_pairs(&build, &probe)
}

/// Build-side output once the probe side is exhausted, or `None` for join
/// types that emit nothing then.
pub(crate) fn build_side_rows<B: JoinBackend>(
    backend: &B,
    definition: &JoinDefinition,
    build: &SideView<'_, B>,
    visited: &B::Flags,
    build_rows: usize,
    probe_seen: ProbeSummary,
) -> Result<Option<OutputRows<B>>> {
    Ok(Some(match definition.join_type {
        JoinType::Left | JoinType::Full => OutputRows::build_only(backend, backend.flagged(visited, false)?, None),
        JoinType::LeftSemi => OutputRows::build_only(backend, backend.flagged(visited, true)?, None),
        JoinType::LeftAnti if definition.null_aware => {
            // NOT IN: a NULL in the subquery makes every comparison unknown,
            // and a NULL outer key is unknown against a non-empty subquery.
            if probe_seen.has_null_key {
                return Ok(None);
            }
            let unmatched = backend.flagged(visited, false)?;
            let unmatched = if probe_seen.non_empty { drop_null_keys(backend, build, unmatched)? } else { unmatched };
            OutputRows::build_only(backend, unmatched, None)
        }
        JoinType::LeftAnti => OutputRows::build_only(backend, backend.flagged(visited, false)?, None),
        JoinType::LeftMark => {
            let mark = backend.download_flags(visited)?;
            OutputRows::build_only(backend, backend.sequence(build_rows)?, Some(mark))
        }
        _ => return Ok(None),
    }))
}

/// What the probe side showed, for null-aware anti joins.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ProbeSummary {
    pub non_empty: bool,
    pub has_null_key: bool,
}

fn drop_null_keys<B: JoinBackend>(
    backend: &B,
    build: &SideView<'_, B>,
    positions: B::Vector<u32>,
) -> Result<B::Vector<u32>> {
    let rows = build.original_rows(backend, &positions)?;
    let key = &build.keys[0];
    let keep: Vec<u8> = rows.iter().map(|&r| u8::from(key.is_valid(r as usize))).collect();
    backend.select(&positions, &backend.upload(&keep)?)
}
