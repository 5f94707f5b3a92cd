//! Host-side staging: DataFusion's small probe batches become large chunks,
//! concatenated in parallel (columns, and pieces of each column, on rayon's
//! threads) rather than on the core that polls the input, into memory the
//! backend moves without another copy when it has some to spare.

use std::sync::Arc;

use arrow::array::{Array, ArrayData, ArrayRef, make_array, new_empty_array};
use arrow::buffer::MutableBuffer;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::error::Result;
use rayon::prelude::*;

use crate::algorithms::HostRows;
use crate::arrays::concat_arrays;
use crate::backend::JoinBackend;

/// The batches of one probe chunk, not yet assembled: the copy runs in a
/// blocking job, off the async workers.
pub(super) struct StagedChunk {
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    rows: usize,
}

impl StagedChunk {
    /// The chunk's rows, with the columns in `whole` assembled for
    /// `backend` (see [`assemble_rows`]).
    pub fn assemble<B: JoinBackend>(self, backend: &B, whole: &[usize]) -> Result<HostRows> {
        assemble_rows(backend, self.schema, self.batches, self.rows, whole)
    }
}

/// Gathers probe batches into chunks of exactly `chunk_rows` rows (the last
/// one may be smaller).
pub(super) struct ProbeStaging {
    schema: SchemaRef,
    chunk_rows: usize,
    batches: Vec<RecordBatch>,
    rows: usize,
}

impl ProbeStaging {
    pub fn new(schema: SchemaRef, chunk_rows: usize) -> Self {
        Self { schema, chunk_rows: chunk_rows.max(1), batches: vec![], rows: 0 }
    }

    /// Adds a batch; returns the chunks it completes.
    pub fn push(&mut self, mut batch: RecordBatch) -> Vec<StagedChunk> {
        let mut chunks = vec![];
        while self.rows + batch.num_rows() >= self.chunk_rows {
            let take = self.chunk_rows - self.rows;
            self.batches.push(batch.slice(0, take));
            batch = batch.slice(take, batch.num_rows() - take);
            self.rows = self.chunk_rows;
            chunks.extend(self.finish());
        }
        if batch.num_rows() > 0 {
            self.rows += batch.num_rows();
            self.batches.push(batch);
        }
        chunks
    }

    /// The rows gathered so far as one chunk, if any.
    pub fn finish(&mut self) -> Option<StagedChunk> {
        if self.rows == 0 {
            return None;
        }
        let batches = std::mem::take(&mut self.batches);
        let rows = std::mem::take(&mut self.rows);
        Some(StagedChunk { schema: Arc::clone(&self.schema), batches, rows })
    }
}

/// The host memory `batch`'s rows take. Unlike `get_array_memory_size`,
/// a slice counts its own rows, not the buffers it shares with its parent:
/// staged chunks and probe passes are slices of DataFusion's batches.
pub(super) fn held_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|column| {
            let data = column.to_data();
            data.get_slice_memory_size().unwrap_or_else(|_| column.get_array_memory_size())
        })
        .sum()
}

/// The `rows` rows of `batches`, with the columns in `whole` assembled for
/// `backend` (copies unless they are one batch); the others stay in the
/// batches they came in.
pub(crate) fn assemble_rows<B: JoinBackend>(
    backend: &B,
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    rows: usize,
    whole: &[usize],
) -> Result<HostRows> {
    let columns = assemble_columns(backend, &schema, &batches, rows, whole)?;
    Ok(HostRows::new(schema, batches, columns))
}

/// `batches` as one batch of `rows` rows, bound for `backend`.
pub(crate) fn concat_in_parallel<B: JoinBackend>(
    backend: &B,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    rows: usize,
) -> Result<RecordBatch> {
    match batches {
        [] => return Ok(RecordBatch::new_empty(Arc::clone(schema))),
        [batch] => return Ok(batch.clone()),
        _ => {}
    }
    let every: Vec<usize> = (0..schema.fields().len()).collect();
    let columns = assemble_columns(backend, schema, batches, rows, &every)?.into_iter().flatten().collect();
    Ok(RecordBatch::try_new_with_options(
        Arc::clone(schema),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(rows)),
    )?)
}

/// Per column of `schema`: the column whole where it is in `columns`,
/// concatenated in parallel unless `batches` are one batch.
fn assemble_columns<B: JoinBackend>(
    backend: &B,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    rows: usize,
    columns: &[usize],
) -> Result<Vec<Option<ArrayRef>>> {
    (0..schema.fields().len())
        .into_par_iter()
        .map(|i| {
            if !columns.contains(&i) {
                return Ok(None);
            }
            match batches {
                [] => Ok(Some(new_empty_array(schema.field(i).data_type()))),
                [batch] => Ok(Some(Arc::clone(batch.column(i)))),
                _ => {
                    let arrays: Vec<&dyn Array> = batches.iter().map(|b| b.column(i).as_ref()).collect();
                    concat_column(backend, &arrays, rows).map(Some)
                }
            }
        })
        .collect()
}

/// One column of a chunk: fixed-width columns without nulls are copied
/// into place piece by piece in parallel, into the backend's transfer
/// memory when it has some; others are concatenated by [`concat_arrays`].
fn concat_column<B: JoinBackend>(backend: &B, arrays: &[&dyn Array], rows: usize) -> Result<ArrayRef> {
    let data_type = arrays[0].data_type();
    let width = match data_type.primitive_width() {
        Some(w) if data_type.is_primitive() && arrays.iter().all(|a| a.null_count() == 0) => w,
        _ => return concat_arrays(arrays),
    };
    let bytes = rows * width;
    let mut memory = backend.transfer_memory(bytes);
    let mut fresh = MutableBuffer::new(0);
    let target = match memory.as_mut() {
        Some(memory) => memory.bytes_mut(bytes)?,
        None => {
            fresh = MutableBuffer::from_len_zeroed(bytes);
            fresh.as_slice_mut()
        }
    };
    let mut pieces = Vec::with_capacity(arrays.len());
    let mut rest = target;
    for array in arrays {
        let (piece, tail) = rest.split_at_mut(array.len() * width);
        pieces.push((piece, array.to_data()));
        rest = tail;
    }
    pieces.into_par_iter().for_each(|(piece, data)| {
        let start = data.offset() * width;
        piece.copy_from_slice(&data.buffers()[0].as_slice()[start..start + piece.len()]);
    });
    let buffer = match memory {
        Some(memory) => memory.into_buffer(bytes)?,
        None => fresh.into(),
    };
    let data = ArrayData::builder(data_type.clone()).len(rows).add_buffer(buffer).build()?;
    Ok(make_array(data))
}
