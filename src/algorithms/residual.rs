//! Host-side checks on candidate pairs: verification of hashed keys against
//! the real key values, then the residual join filter. Both run before the
//! join type's semantics, so a pair that fails either counts as unmatched.

use arrow::array::{Array, AsArray, RecordBatchOptions, UInt32Array};
use arrow::record_batch::RecordBatch;
use datafusion::common::{JoinSide, internal_err};
use datafusion::error::Result;
use datafusion::physical_plan::joins::utils::JoinFilter;

use super::JoinDefinition;
use super::host_rows::{HostRows, TakenRows};
use super::side::SideView;
use crate::backend::{Candidates, JoinBackend};
use crate::keys::{KeyExactness, verify_candidates};

/// Pairs evaluated by the filter at a time, which bounds the intermediate
/// batch it reads.
const FILTER_SLICE_ROWS: usize = 1 << 20;

pub(crate) fn apply<B: JoinBackend>(
    backend: &B,
    definition: &JoinDefinition,
    exactness: KeyExactness,
    build: &SideView<'_, B>,
    probe: &SideView<'_, B>,
    candidates: Candidates<B>,
) -> Result<Candidates<B>> {
    let verify = exactness == KeyExactness::NeedsVerification;
    let count = backend.len(&candidates.build);
    if count == 0 || (!verify && definition.filter.is_none()) {
        return Ok(candidates);
    }
    // Original rows of a side only when something reads that side.
    let build_rows = match verify || definition.filter_reads(JoinSide::Left) {
        true => build.original_rows(backend, &candidates.build)?,
        false => vec![],
    };
    let probe_rows = match verify || definition.filter_reads(JoinSide::Right) {
        true => probe.original_rows(backend, &candidates.probe)?,
        false => vec![],
    };
    let mut keep = vec![true; count];
    if verify {
        verify_candidates(build.keys, probe.keys, &build_rows, &probe_rows, definition.null_equality, &mut keep)?;
    }
    if let Some(filter) = &definition.filter {
        apply_filter(filter, build.rows, probe.rows, &build_rows, &probe_rows, &mut keep)?;
    }
    if keep.iter().all(|k| *k) {
        return Ok(candidates);
    }
    let keep: Vec<u8> = keep.into_iter().map(u8::from).collect();
    let keep = backend.upload(&keep)?;
    Ok(Candidates {
        build: backend.select(&candidates.build, &keep)?,
        probe: backend.select(&candidates.probe, &keep)?,
    })
}

/// Evaluates the filter on the pairs still kept; NULL counts as false. A
/// side's rows are empty when the filter does not read that side.
fn apply_filter(
    filter: &JoinFilter,
    build_side: &HostRows,
    probe_side: &HostRows,
    build_rows: &[u32],
    probe_rows: &[u32],
    keep: &mut [bool],
) -> Result<()> {
    let pending: Vec<usize> = keep.iter().enumerate().filter(|(_, k)| **k).map(|(i, _)| i).collect();
    for slice in pending.chunks(FILTER_SLICE_ROWS) {
        let rows_of = |rows: &[u32]| -> UInt32Array {
            match rows.is_empty() {
                true => UInt32Array::from(Vec::<u32>::new()),
                false => slice.iter().map(|&i| rows[i]).collect(),
            }
        };
        let mut build = TakenRows::new(build_side, rows_of(build_rows))?;
        let mut probe = TakenRows::new(probe_side, rows_of(probe_rows))?;
        let columns = filter
            .column_indices()
            .iter()
            .map(|column| match column.side {
                JoinSide::Left => build.column(column.index),
                JoinSide::Right => probe.column(column.index),
                JoinSide::None => internal_err!("join filter reads the mark column"),
            })
            .collect::<Result<Vec<_>>>()?;
        let intermediate = RecordBatch::try_new_with_options(
            std::sync::Arc::clone(filter.schema()),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(slice.len())),
        )?;
        let result = filter.expression().evaluate(&intermediate)?.into_array(slice.len())?;
        let Some(passed) = result.as_boolean_opt() else {
            return internal_err!("join filter returned {} instead of Boolean", result.data_type());
        };
        for (j, &i) in slice.iter().enumerate() {
            keep[i] = passed.is_valid(j) && passed.value(j);
        }
    }
    Ok(())
}
