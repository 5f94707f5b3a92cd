//! Checks on candidate pairs: verification of hashed keys against the real
//! key values on the host, then the residual join filter, compared on the
//! backend where it is column comparisons ([`PairFilter`]) and evaluated on
//! the host otherwise. Both run before the join type's semantics, so a pair
//! that fails either counts as unmatched.

use std::borrow::Cow;

use arrow::array::{Array, AsArray, RecordBatchOptions, UInt32Array};
use arrow::buffer::ScalarBuffer;
use arrow::record_batch::RecordBatch;
use datafusion::common::{JoinSide, internal_datafusion_err, internal_err};
use datafusion::error::Result;
use datafusion::physical_plan::joins::utils::{ColumnIndex, JoinFilter};

use super::JoinDefinition;
use super::host_rows::{HostRows, TakenRows};
use super::pair_filter::PairFilter;
use super::side::SideView;
use crate::backend::{Candidates, ColumnRows, JoinBackend};
use crate::keys::{KeyExactness, verify_candidates};

/// Pairs evaluated by the filter at a time. Small enough that the rows
/// taken for a slice and the filter's result stay in the core's cache and
/// come from memory the allocator reuses: slices of a million pairs, with
/// the join's partitions filtering at once, spent much of their time
/// faulting in fresh pages (TPC-DS Q95).
const FILTER_SLICE_ROWS: usize = 1 << 16;

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
    let kept = match host_checks(backend, definition, verify, build, probe, &candidates)? {
        Some(keep) if !keep.iter().all(|k| *k) => {
            Some(backend.upload(&keep.into_iter().map(u8::from).collect::<Vec<_>>())?)
        }
        _ => None,
    };
    let keep = match (&definition.pair_filter, kept) {
        (Some(filter), kept) => compare_on_backend(backend, definition, filter, build, probe, &candidates, kept)?,
        (None, Some(kept)) => kept,
        (None, None) => return Ok(candidates),
    };
    Ok(Candidates {
        build: backend.select(&candidates.build, &keep)?,
        probe: backend.select(&candidates.probe, &keep)?,
    })
}

/// Which pairs pass the checks made on the host: verification of hashed
/// keys, and the filter where the backend does not compare it. `None` when
/// the host checks nothing.
fn host_checks<B: JoinBackend>(
    backend: &B,
    definition: &JoinDefinition,
    verify: bool,
    build: &SideView<'_, B>,
    probe: &SideView<'_, B>,
    candidates: &Candidates<B>,
) -> Result<Option<Vec<bool>>> {
    let filter = definition.filter.as_ref().filter(|_| definition.pair_filter.is_none());
    if !verify && filter.is_none() {
        return Ok(None);
    }
    // Original rows of a side only when something reads that side.
    let reads = |side: JoinSide| verify || (filter.is_some() && definition.filter_reads(side));
    let build_rows: ScalarBuffer<u32> = match reads(JoinSide::Left) {
        true => build.original_rows(backend, &candidates.build)?.into(),
        false => ScalarBuffer::from(vec![]),
    };
    let probe_rows: ScalarBuffer<u32> = match reads(JoinSide::Right) {
        true => probe.original_rows(backend, &candidates.probe)?.into(),
        false => ScalarBuffer::from(vec![]),
    };
    let count = backend.len(&candidates.build);
    let mut keep = vec![true; count];
    if verify {
        verify_candidates(build.keys, probe.keys, &build_rows, &probe_rows, definition.null_equality, &mut keep)?;
    }
    if let Some(filter) = filter {
        let build_side = read_whole(build.rows, definition.filter_columns(JoinSide::Left), count)?;
        let probe_side = read_whole(probe.rows, definition.filter_columns(JoinSide::Right), count)?;
        apply_filter(filter, &build_side, &probe_side, &build_rows, &probe_rows, &mut keep)?;
    }
    Ok(Some(keep))
}

/// Flags of the pairs that `kept` (every pair when `None`) keeps and whose
/// values meet every comparison of the filter, compared by the backend at
/// the pairs' original rows. Comparing pairs that verification dropped
/// cannot fail, and their flags stay 0.
fn compare_on_backend<B: JoinBackend>(
    backend: &B,
    definition: &JoinDefinition,
    filter: &PairFilter,
    build: &SideView<'_, B>,
    probe: &SideView<'_, B>,
    candidates: &Candidates<B>,
    kept: Option<B::Vector<u8>>,
) -> Result<B::Vector<u8>> {
    let original =
        |view: &SideView<'_, B>, positions: &B::Vector<u32>, side: JoinSide| match definition.filter_reads(side) {
            true => view.original_rows_on_backend(backend, positions),
            false => Ok(None),
        };
    let build_rows = original(build, &candidates.build, JoinSide::Left)?;
    let probe_rows = original(probe, &candidates.probe, JoinSide::Right)?;
    let (build_rows, probe_rows) =
        (build_rows.as_ref().unwrap_or(&candidates.build), probe_rows.as_ref().unwrap_or(&candidates.probe));
    let operand = |column: &ColumnIndex| -> Result<ColumnRows<'_, B>> {
        match column.side {
            JoinSide::Left => Ok((build.filter_column(column.index)?, build_rows)),
            JoinSide::Right => Ok((probe.filter_column(column.index)?, probe_rows)),
            JoinSide::None => internal_err!("join filter reads the mark column"),
        }
    };
    let mut flags = kept;
    for comparison in filter.comparisons() {
        let (left, right) = (operand(&comparison.left)?, operand(&comparison.right)?);
        flags = Some(backend.compare_rows(comparison.op, left, right, flags.as_ref())?);
    }
    flags.ok_or_else(|| internal_datafusion_err!("a join filter of no comparisons"))
}

/// A side's rows with the columns the filter reads whole where the pairs
/// take at least as many rows as the side has: assembling a column then
/// copies less than taking each pair's row from the parts.
fn read_whole(rows: &HostRows, columns: Vec<usize>, pairs: usize) -> Result<Cow<'_, HostRows>> {
    match pairs >= rows.rows() && !columns.is_empty() {
        true => Ok(Cow::Owned(rows.with_host_columns(&columns)?)),
        false => Ok(Cow::Borrowed(rows)),
    }
}

/// Evaluates the filter on the pairs still kept, slice by slice; NULL
/// counts as false. A side's rows are empty when the filter does not read
/// that side. Pairs whose keys verification found unequal are left out, as
/// DataFusion evaluates the filter only on pairs of equal keys (an
/// expression may fail on others).
fn apply_filter(
    filter: &JoinFilter,
    build_side: &HostRows,
    probe_side: &HostRows,
    build_rows: &ScalarBuffer<u32>,
    probe_rows: &ScalarBuffer<u32>,
    keep: &mut [bool],
) -> Result<()> {
    let every_pair = keep.iter().all(|k| *k);
    for start in (0..keep.len()).step_by(FILTER_SLICE_ROWS) {
        let end = (start + FILTER_SLICE_ROWS).min(keep.len());
        // The pairs of the slice to evaluate, where not all of them.
        let pending: Option<Vec<usize>> = (!every_pair).then(|| (start..end).filter(|&i| keep[i]).collect());
        let len = pending.as_ref().map_or(end - start, Vec::len);
        if len == 0 {
            continue;
        }
        let rows_of = |rows: &ScalarBuffer<u32>| -> UInt32Array {
            match (&pending, rows.is_empty()) {
                (_, true) => UInt32Array::from(Vec::<u32>::new()),
                (None, false) => UInt32Array::new(rows.slice(start, len), None),
                (Some(pending), false) => pending.iter().map(|&i| rows[i]).collect(),
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
            &RecordBatchOptions::new().with_row_count(Some(len)),
        )?;
        let result = filter.expression().evaluate(&intermediate)?.into_array(len)?;
        let Some(passed) = result.as_boolean_opt() else {
            return internal_err!("join filter returned {} instead of Boolean", result.data_type());
        };
        let passed = |j: usize| passed.is_valid(j) && passed.value(j);
        match &pending {
            None => keep[start..end].iter_mut().enumerate().for_each(|(j, k)| *k = passed(j)),
            Some(pending) => pending.iter().enumerate().for_each(|(j, &i)| keep[i] = passed(j)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::Int32Array;
    use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::{BinaryExpr, Column};
    use datafusion::physical_plan::joins::utils::ColumnIndex;

    use super::*;

    /// A side of one nullable Int32 column `name`, in parts of `part_rows`.
    fn side(name: &str, values: &[Option<i32>], part_rows: usize) -> HostRows {
        let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new(name, DataType::Int32, true)]));
        let parts = values
            .chunks(part_rows)
            .map(|part| RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int32Array::from(part.to_vec()))]))
            .collect::<std::result::Result<Vec<_>, _>>()
            .unwrap();
        HostRows::new(schema, parts, vec![None])
    }

    /// Pairs over several slices, with sides in many parts and NULLs, and
    /// with some pairs already dropped (as verification drops them): the
    /// filter `b < p` keeps exactly the pairs it holds for among those
    /// still kept, whether the sides' columns are read from their parts or
    /// whole.
    #[test]
    fn the_filter_keeps_the_pairs_it_holds_for_slice_by_slice() {
        let values = |n: usize, step: usize| -> Vec<Option<i32>> {
            (0..n).map(|i| (i % 11 != 3).then_some(((i * step) % 997) as i32)).collect()
        };
        let (build_values, probe_values) = (values(5_003, 13), values(7_919, 29));
        let (build_side, probe_side) = (side("b", &build_values, 1_000), side("p", &probe_values, 777));
        let schema =
            Arc::new(Schema::new(vec![Field::new("b", DataType::Int32, true), Field::new("p", DataType::Int32, true)]));
        let expression =
            Arc::new(BinaryExpr::new(Arc::new(Column::new("b", 0)), Operator::Lt, Arc::new(Column::new("p", 1))));
        let filter = JoinFilter::new(
            expression,
            vec![ColumnIndex { index: 0, side: JoinSide::Left }, ColumnIndex { index: 0, side: JoinSide::Right }],
            schema,
        );
        let pairs = 2 * FILTER_SLICE_ROWS + 4_321;
        let build_rows: ScalarBuffer<u32> = (0..pairs).map(|i| (i * 31 % build_values.len()) as u32).collect();
        let probe_rows: ScalarBuffer<u32> = (0..pairs).map(|i| (i * 17 % probe_values.len()) as u32).collect();
        for dropped_every in [None, Some(5)] {
            let kept = |i: usize| dropped_every.is_none_or(|every| !i.is_multiple_of(every));
            let expected: Vec<bool> = (0..pairs)
                .map(|i| {
                    let (b, p) = (build_values[build_rows[i] as usize], probe_values[probe_rows[i] as usize]);
                    kept(i) && matches!((b, p), (Some(b), Some(p)) if b < p)
                })
                .collect();
            let whole = (
                read_whole(&build_side, vec![0], pairs).unwrap().into_owned(),
                read_whole(&probe_side, vec![0], pairs).unwrap().into_owned(),
            );
            assert!(whole.0.whole_column(0).is_some() && whole.1.whole_column(0).is_some());
            for (build, probe) in [(&build_side, &probe_side), (&whole.0, &whole.1)] {
                let mut keep: Vec<bool> = (0..pairs).map(kept).collect();
                apply_filter(&filter, build, probe, &build_rows, &probe_rows, &mut keep).unwrap();
                assert_eq!(keep, expected, "pairs dropped every {dropped_every:?}");
            }
        }
        assert!(read_whole(&probe_side, vec![0], probe_values.len() - 1).unwrap().whole_column(0).is_none());
    }
}
