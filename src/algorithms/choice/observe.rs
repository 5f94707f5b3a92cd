//! The shape of a join, observed where it is chosen: the collected build
//! side, the session's plan (widths, statistics) and the backend.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int64Array, UInt32Array};
use arrow::compute::{cast, concat, take};
use arrow::datatypes::DataType;
use datafusion::common::{JoinSide, ScalarValue};
use datafusion::error::Result;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::ExecutionPlan;

use super::shape::{JoinShape, KeySample, estimate_keys, sample_rows};
use super::statistics::PlanStatistics;
use crate::algorithms::definition::PlannedSizes;
use crate::algorithms::{JoinDefinition, OutputColumn};
use crate::backend::{JoinBackend, PartitionSpec, radix_pass_count};
use crate::keys::{KeyEncoder, KeyExactness, NormalizedKey, NormalizedKeys};

/// The sizes of a join over `probe` with `build_sides` build sides, from
/// the probe side's statistics.
pub fn planned_sizes(
    statistics: &PlanStatistics,
    probe: &Arc<dyn ExecutionPlan>,
    probe_keys: &[PhysicalExprRef],
    build_sides: usize,
) -> PlannedSizes {
    let probe_statistics = statistics.of(probe);
    let probe_rows = probe_statistics.as_ref().and_then(|s| s.num_rows.get_value().copied());
    let probe_key_range = match probe_keys {
        [key] => key.downcast_ref::<Column>().and_then(|column| {
            let column = probe_statistics.as_ref()?.column_statistics.get(column.index())?;
            Some((as_i64(column.min_value.get_value()?)?, as_i64(column.max_value.get_value()?)?))
        }),
        _ => None,
    };
    PlannedSizes { probe_rows, probe_key_range, build_sides }
}

fn as_i64(value: &ScalarValue) -> Option<i64> {
    if !value.data_type().is_integer() {
        return None;
    }
    match value.cast_to(&DataType::Int64).ok()? {
        ScalarValue::Int64(v) => v,
        _ => None,
    }
}

/// The join's shape for a build side of `build_rows` rows whose key columns
/// came in `key_pieces`, encoded by `encoder`.
pub(crate) fn observe_shape<B: JoinBackend>(
    backend: &B,
    definition: &JoinDefinition,
    encoder: &KeyEncoder,
    key_pieces: &[Vec<ArrayRef>],
    build_rows: usize,
) -> Result<JoinShape> {
    let planned = definition.planned;
    let probe_rows = planned.probe_rows_per_build_side().unwrap_or(build_rows);
    let sort_bits = match encoder.key_bits() {
        32 => encoder.sort_spec::<u32>().digit_bits(),
        _ => encoder.sort_spec::<u64>().digit_bits(),
    };
    let partition = PartitionSpec::for_build_rows(build_rows, backend.partition_target_rows());
    let verified = encoder.exactness() == KeyExactness::NeedsVerification;
    let (build_payloads, build_on_host) = payload_widths(backend, definition, JoinSide::Left);
    let (probe_payloads, probe_on_host) = payload_widths(backend, definition, JoinSide::Right);
    let sample = key_sample(encoder, key_pieces, build_rows)?;
    Ok(JoinShape {
        build_rows,
        probe_rows,
        key_bytes: encoder.key_bits() / 8,
        partition_passes: radix_pass_count(partition.digit_bits()),
        sort_passes: radix_pass_count(sort_bits),
        build_payloads,
        probe_payloads,
        row_ids_anyway: (
            verified || build_on_host || definition.null_aware || definition.filter_reads(JoinSide::Left),
            verified || probe_on_host || definition.filter_reads(JoinSide::Right),
        ),
        keys: estimate_keys(&sample, planned.probe_key_range),
    })
}

/// Bytes per value of the side's output columns the device gathers, and
/// whether some are gathered on the host (by row id) instead.
fn payload_widths<B: JoinBackend>(backend: &B, definition: &JoinDefinition, side: JoinSide) -> (Vec<u32>, bool) {
    let mut seen = vec![];
    let (mut widths, mut on_host) = (vec![], false);
    for (field, column) in definition.output_schema.fields().iter().zip(&definition.output_columns) {
        let index = match (column, side) {
            (OutputColumn::Build(i), JoinSide::Left) | (OutputColumn::Probe(i), JoinSide::Right) => *i,
            _ => continue,
        };
        if seen.contains(&index) {
            continue;
        }
        seen.push(index);
        match backend.holds_column(field.data_type()) {
            true => widths.push(field.data_type().primitive_width().unwrap_or(8) as u32),
            false => on_host = true,
        }
    }
    (widths, on_host)
}

/// The keys of a sample of build rows ([`sample_rows`]), normalised, and
/// their values for one integer key column.
fn key_sample(encoder: &KeyEncoder, key_pieces: &[Vec<ArrayRef>], rows: usize) -> Result<KeySample> {
    let sampled_rows = sample_rows(rows);
    let positions = &sampled_rows.positions;
    let columns = key_pieces.first().map_or(0, Vec::len);
    if positions.is_empty() || columns == 0 {
        return Ok(KeySample { population: rows, ..KeySample::default() });
    }
    // Only the pieces a sampled row lies in are read: a build side of
    // DataFusion's small batches has thousands of pieces, and the sample
    // a few hundred blocks.
    let mut taken: Vec<Vec<ArrayRef>> = vec![vec![]; columns];
    let (mut first_row, mut next) = (0usize, 0usize);
    for piece in key_pieces {
        if next == positions.len() {
            break;
        }
        let piece_rows = piece.first().map_or(0, |k| k.len());
        let end = positions[next..].partition_point(|&p| p < first_row + piece_rows) + next;
        if end > next {
            let indices = UInt32Array::from_iter_values(positions[next..end].iter().map(|&p| (p - first_row) as u32));
            for (column, key) in taken.iter_mut().zip(piece) {
                column.push(take(key.as_ref(), &indices, None)?);
            }
        }
        (first_row, next) = (first_row + piece_rows, end);
    }
    let sampled: Vec<ArrayRef> = taken
        .iter()
        .map(|parts| concat(&parts.iter().map(|a| a.as_ref()).collect::<Vec<_>>()))
        .collect::<std::result::Result<_, _>>()?;
    // Null keys match nothing: they are neither duplicates nor matches.
    let keys: Vec<Option<u64>> = match encoder.encode(&sampled)? {
        NormalizedKeys::U32(keys) => {
            keys.into_iter().map(|k| (k != u32::UNMATCHABLE).then_some(u64::from(k))).collect()
        }
        NormalizedKeys::U64(keys) => keys.into_iter().map(|k| (k != u64::UNMATCHABLE).then_some(k)).collect(),
    };
    let values = match sampled.as_slice() {
        [column] if column.data_type().is_integer() => {
            let values = cast(column, &DataType::Int64)?;
            values.as_any().downcast_ref::<Int64Array>().map(|v| v.iter().flatten().collect())
        }
        _ => None,
    };
    Ok(KeySample::new(rows, &sampled_rows, keys, values))
}

#[cfg(test)]
mod tests {
    use arrow::array::Int32Array;
    use datafusion::common::NullEquality;

    use super::*;
    use crate::algorithms::choice::shape::SAMPLE_ROWS;
    use crate::keys::KeyRanges;

    /// The sample of a build side in many pieces, some empty, is the sample
    /// of the same rows in one piece.
    #[test]
    fn a_sample_reads_the_same_rows_whatever_the_pieces() -> Result<()> {
        let sizes = [0, 1, 7, 8192, 3, 0, 500, 8191, 2, 8193];
        for rows in [0, 5, SAMPLE_ROWS + 1, 100_003] {
            let keys: Vec<i32> = (0..rows as i32).map(|i| i.wrapping_mul(7919) % 1009).collect();
            let mut pieces: Vec<Vec<ArrayRef>> = vec![];
            let mut first = 0;
            for size in sizes.iter().cycle() {
                let end = (first + size).min(rows);
                pieces.push(vec![Arc::new(Int32Array::from(keys[first..end].to_vec())) as ArrayRef]);
                first = end;
                if first == rows && pieces.len() >= sizes.len() {
                    break;
                }
            }
            let whole = vec![vec![Arc::new(Int32Array::from(keys)) as ArrayRef]];
            let encoder = KeyEncoder::for_key_ranges(&KeyRanges::of_pieces(&whole), NullEquality::NullEqualsNothing)?;
            let sample = key_sample(&encoder, &pieces, rows)?;
            assert_eq!(sample, key_sample(&encoder, &whole, rows)?, "{rows} rows in {} pieces", pieces.len());
            assert_eq!(sample.keys.len(), rows.min(SAMPLE_ROWS));
        }
        Ok(())
    }
}
