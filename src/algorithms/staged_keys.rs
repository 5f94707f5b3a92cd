//! A side's key columns, evaluated on each batch the side was staged in and
//! never concatenated where nothing else reads them: their values go from
//! DataFusion's batches straight into the memory their upload reads,
//! encoded on the way.

use arrow::array::{Array, ArrayRef};
use arrow::record_batch::RecordBatch;
use datafusion::common::internal_err;
use datafusion::error::Result;
use datafusion::physical_expr::PhysicalExprRef;
use rayon::prelude::*;

use crate::arrays::concat_arrays;
use crate::backend::JoinBackend;
use crate::keys::{KeyEncoder, NormalizedKey, RawKeys, RawSpan};

/// The values of a side's key expressions on one of its batches.
pub fn evaluate_keys(expressions: &[PhysicalExprRef], batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
    expressions.iter().map(|e| e.evaluate(batch)?.into_array(batch.num_rows())).collect()
}

/// A build side's key columns evaluated on each batch as it was collected,
/// in the batches' order: the evaluation is then spread over the tasks
/// reading the input rather than left to the build side's preparation.
pub type CollectedKeys = Vec<Vec<ArrayRef>>;

/// Batches of a side from which on its keys are evaluated on every core;
/// fewer are evaluated on the calling thread.
const PARALLEL_PIECES: usize = 1024;

/// The key columns of one side, evaluated on each batch the side was staged
/// in. A key column that the join reads nowhere else is never concatenated:
/// its values go from DataFusion's batches straight into the memory their
/// upload reads, encoded on the way.
pub(super) struct StagedKeys {
    /// The side's row at which each piece starts, ascending.
    starts: Vec<usize>,
    /// The key columns of each piece.
    pub(super) pieces: Vec<Vec<ArrayRef>>,
    pub(super) rows: usize,
}

impl StagedKeys {
    pub(super) fn evaluate(expressions: &[PhysicalExprRef], batches: &[RecordBatch]) -> Result<Self> {
        // A build side of DataFusion's small batches is thousands of them,
        // each a few allocations; a probe chunk's few hundred are not worth
        // handing to other threads.
        let evaluate = |batch: &RecordBatch| evaluate_keys(expressions, batch);
        let pieces = match batches.len() >= PARALLEL_PIECES {
            true => batches.par_iter().with_min_len(PARALLEL_PIECES).map(evaluate).collect::<Result<Vec<_>>>()?,
            false => batches.iter().map(evaluate).collect::<Result<Vec<_>>>()?,
        };
        Ok(Self::of_pieces(pieces, batches))
    }

    /// The keys of `batches`: `collected`, where the side's collection
    /// evaluated them batch by batch, else evaluated here.
    pub(super) fn collected_or_evaluated(
        expressions: &[PhysicalExprRef],
        batches: &[RecordBatch],
        collected: Option<CollectedKeys>,
    ) -> Result<Self> {
        match collected {
            Some(pieces) if pieces.len() == batches.len() => Ok(Self::of_pieces(pieces, batches)),
            _ => Self::evaluate(expressions, batches),
        }
    }

    pub(super) fn of_pieces(pieces: Vec<Vec<ArrayRef>>, batches: &[RecordBatch]) -> Self {
        let (mut starts, mut rows) = (Vec::with_capacity(batches.len()), 0);
        for batch in batches {
            starts.push(rows);
            rows += batch.num_rows();
        }
        Self { starts, pieces, rows }
    }

    /// Lets the pieces go on every core: a build side's are thousands of
    /// small allocations, which one thread frees in milliseconds while
    /// every probe partition waits for the build side.
    pub(super) fn release(self) {
        match self.pieces.len() >= PARALLEL_PIECES {
            true => self.pieces.into_par_iter().with_min_len(PARALLEL_PIECES).for_each(drop),
            false => drop(self.pieces),
        }
    }

    /// Encodes rows `first..first + out.len()`, piece by piece.
    pub(super) fn encode_rows<K: NormalizedKey>(
        &self,
        encoder: &KeyEncoder,
        first: usize,
        out: &mut [K],
    ) -> Result<()> {
        self.by_piece(first, out, |keys, offset, out| encoder.encode_rows(keys, offset, out))
    }

    /// The raw bits of rows `first..first + out.len()` of the one key
    /// column, piece by piece, widening `span` to their values.
    pub(super) fn copy_raw_rows(&self, raw: RawKeys, first: usize, out: &mut [u32], span: &RawSpan) -> Result<()> {
        self.by_piece(first, out, |keys, offset, out| match keys {
            [key] => raw.copy(key.as_ref(), offset, out, span),
            _ => internal_err!("raw keys asked of {} key columns", keys.len()),
        })
    }

    /// The one key column's raw bits moved from where they lie, where the
    /// backend reads them there ([`JoinBackend::upload_values_in_place`]).
    pub(super) fn raw_in_place<B: JoinBackend>(&self, backend: &B) -> Result<Option<B::Vector<u32>>> {
        let arrays = self.pieces.iter().map(|keys| match keys.as_slice() {
            [key] => Some(key.as_ref()),
            _ => None,
        });
        match arrays.collect::<Option<Vec<&dyn Array>>>() {
            Some(arrays) => backend.upload_values_in_place(&arrays),
            None => Ok(None),
        }
    }

    /// Widens `span` to the one key column's values, read where they lie,
    /// piece by piece on every core.
    pub(super) fn widen_raw_span(&self, raw: RawKeys, span: &RawSpan) -> Result<()> {
        self.pieces.par_iter().with_min_len(PARALLEL_PIECES / 16).try_for_each(|keys| match keys.as_slice() {
            [key] => raw.widen_span(key.as_ref(), span),
            _ => internal_err!("raw keys asked of {} key columns", keys.len()),
        })
    }

    /// Hands `write` each piece's part of rows `first..first + out.len()`:
    /// the piece's key columns, the part's first row in the piece, and
    /// where in `out` it goes.
    fn by_piece<T>(
        &self,
        first: usize,
        out: &mut [T],
        mut write: impl FnMut(&[ArrayRef], usize, &mut [T]) -> Result<()>,
    ) -> Result<()> {
        // The last piece starting at or before `first`: empty pieces that
        // start at the same row come before it.
        let mut piece = self.starts.partition_point(|&start| start <= first).saturating_sub(1);
        let mut done = 0;
        while done < out.len() {
            let (Some(&start), Some(keys)) = (self.starts.get(piece), self.pieces.get(piece)) else {
                return internal_err!("keys of rows {first}..{} asked of {} rows", first + out.len(), self.rows);
            };
            let offset = first + done - start;
            let len = keys.first().map_or(0, |k| k.len()).saturating_sub(offset).min(out.len() - done);
            write(keys, offset, &mut out[done..done + len])?;
            done += len;
            piece += 1;
        }
        Ok(())
    }

    /// How the one key column's raw bits order, where every piece of it
    /// may go up as they are ([`RawKeys`]).
    pub(super) fn raw_keys(&self) -> Option<RawKeys> {
        let mut columns = self.pieces.iter().map(|keys| match keys.as_slice() {
            [key] => RawKeys::of_column(key.as_ref()),
            _ => None,
        });
        let raw = columns.next().flatten()?;
        columns.all(|c| c == Some(raw)).then_some(raw)
    }

    /// Whether the first key column holds a NULL.
    pub(super) fn first_key_has_null(&self) -> bool {
        self.pieces.iter().any(|keys| keys.first().is_some_and(|k| k.logical_null_count() > 0))
    }

    /// The key columns whole; a copy unless the side is one piece.
    pub(super) fn concatenated(&self) -> Result<Vec<ArrayRef>> {
        if let [keys] = self.pieces.as_slice() {
            return Ok(keys.clone());
        }
        let columns = self.pieces.first().map_or(0, Vec::len);
        (0..columns)
            .map(|c| concat_arrays(&self.pieces.iter().map(|keys| keys[c].as_ref()).collect::<Vec<_>>()))
            .collect()
    }
}

/// The normalised keys of a probe chunk in backend memory.
pub(super) enum KeyedVector<B: JoinBackend> {
    U32(B::Vector<u32>),
    U64(B::Vector<u64>),
}

/// The normalised keys of one side, encoded straight into the memory their
/// upload reads.
pub(super) fn upload_keys<B: JoinBackend>(
    backend: &B,
    encoder: &KeyEncoder,
    keys: &StagedKeys,
) -> Result<KeyedVector<B>> {
    let rows = keys.rows;
    Ok(match encoder.key_bits() {
        32 => KeyedVector::U32(backend.upload_with(rows, &|first, out| keys.encode_rows(encoder, first, out))?),
        _ => KeyedVector::U64(backend.upload_with(rows, &|first, out| keys.encode_rows(encoder, first, out))?),
    })
}

/// A probe chunk's keys coded on the backend, where they go up as they lie
/// (a table kept in the backend's transfer memory) and their raw bits code
/// as the build side's do ([`crate::keys::RawCodes`]); `None` otherwise,
/// for the host to encode them.
pub(super) fn probe_keys_in_place<B: JoinBackend>(
    backend: &B,
    encoder: &KeyEncoder,
    keys: &StagedKeys,
) -> Result<Option<KeyedVector<B>>> {
    let (Some(codes), Some(_)) = (encoder.raw_codes(), keys.raw_keys()) else {
        return Ok(None);
    };
    match keys.raw_in_place(backend)? {
        Some(raw) => Ok(Some(KeyedVector::U32(backend.raw_codes(raw, codes)?))),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::Int32Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_expr::expressions::Column;

    use super::*;

    /// Keys evaluated on every core come in their batches' order, with the
    /// row each batch starts at, as those evaluated on one thread.
    #[test]
    fn keys_of_many_batches_keep_their_order() -> Result<()> {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int32, false)]));
        let keys: Vec<PhysicalExprRef> = vec![Arc::new(Column::new("k", 0))];
        for count in [PARALLEL_PIECES - 1, 3 * PARALLEL_PIECES + 5] {
            let batches = (0..count as i32)
                .map(|b| {
                    let values = Int32Array::from_iter_values((0..b % 3).map(|i| b * 10 + i));
                    RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(values)])
                })
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let staged = StagedKeys::evaluate(&keys, &batches)?;
            let mut row = 0;
            for ((batch, start), piece) in batches.iter().zip(&staged.starts).zip(&staged.pieces) {
                assert_eq!((*start, piece[0].as_ref()), (row, batch.column(0).as_ref()));
                row += batch.num_rows();
            }
            assert_eq!((staged.pieces.len(), staged.rows), (count, row));
        }
        Ok(())
    }

    /// Keys evaluated as the side was collected are taken one piece per
    /// batch; where their count is not the batches', they are evaluated
    /// again.
    #[test]
    fn collected_keys_are_taken_one_piece_per_batch() -> Result<()> {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int32, false)]));
        let keys: Vec<PhysicalExprRef> = vec![Arc::new(Column::new("k", 0))];
        let batches = [vec![1, 2], vec![3], vec![4, 5, 6]]
            .into_iter()
            .map(|values| RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int32Array::from(values))]))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let collected: CollectedKeys =
            batches.iter().map(|batch| evaluate_keys(&keys, batch)).collect::<Result<_>>()?;
        for given in [Some(collected.clone()), Some(collected[..2].to_vec()), Some(vec![]), None] {
            let staged = StagedKeys::collected_or_evaluated(&keys, &batches, given)?;
            assert_eq!((staged.starts.as_slice(), staged.rows, staged.pieces.len()), ([0, 2, 3].as_slice(), 6, 3));
            for (piece, batch) in staged.pieces.iter().zip(&batches) {
                assert_eq!(piece[0].as_ref(), batch.column(0).as_ref());
            }
        }
        Ok(())
    }
}
