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

    /// Makes the next chunks `chunk_rows` rows; rows already gathered past
    /// that go out with the next batch, as a chunk of their own.
    pub fn resize(&mut self, chunk_rows: usize) {
        self.chunk_rows = chunk_rows.max(1);
    }

    /// Adds a batch; returns the chunks it completes.
    pub fn push(&mut self, mut batch: RecordBatch) -> Vec<StagedChunk> {
        let mut chunks = vec![];
        if self.rows >= self.chunk_rows {
            chunks.extend(self.finish());
        }
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::Int32Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::record_batch::RecordBatch;

    use super::ProbeStaging;

    fn batch(rows: i32) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int32, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int32Array::from_iter_values(0..rows))]).unwrap()
    }

    #[test]
    fn chunks_take_the_size_set_before_each_batch() {
        let mut staging = ProbeStaging::new(batch(0).schema(), 100);
        let sizes = |chunks: Vec<super::StagedChunk>| chunks.iter().map(|c| c.rows).collect::<Vec<_>>();
        assert_eq!(sizes(staging.push(batch(150))), [100]);
        // 50 rows are gathered: made smaller than that, they go out first,
        // then the next batch is cut to the new size.
        staging.resize(20);
        assert_eq!(sizes(staging.push(batch(45))), [50, 20, 20]);
        staging.resize(1000);
        assert_eq!(sizes(staging.push(batch(10))), Vec::<usize>::new());
        assert_eq!(staging.finish().map(|c| c.rows), Some(15));
    }
}
