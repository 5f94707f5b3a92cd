//! Host-side staging: DataFusion's small probe batches become large chunks,
//! whose columns bound for the backend are concatenated in parallel
//! (columns, and pieces of each column, on rayon's threads) rather than on
//! the core that polls the input, into memory the backend moves without
//! another copy when it has some to spare ([`assemble_columns`]).

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::error::Result;

use crate::algorithms::{HostRows, assemble_columns};
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
