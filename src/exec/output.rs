//! A partition's output as its consumer gets it: in slices of the
//! session's `batch_size`, stopped at the join's `fetch`.

use arrow::record_batch::RecordBatch;
use datafusion::error::Result;
use datafusion::physical_plan::metrics::{BaselineMetrics, RecordOutput};
use tokio::sync::mpsc::Sender;

use super::inputs::PartitionInputs;
use crate::arrays::{compacted, owned_slice};

/// An output batch as the partition's consumer gets it: its first `limit`
/// rows in slices of at most `batch_size`, made one at a time, each over
/// its own memory (a slice of a chunk would count the whole chunk's
/// memory) and counted in `baseline`.
pub(super) fn output_slices<'a>(
    batch: &'a RecordBatch,
    batch_size: usize,
    limit: usize,
    baseline: &'a BaselineMetrics,
) -> impl Iterator<Item = Result<RecordBatch>> + 'a {
    let end = batch.num_rows().min(limit);
    (0..end).step_by(batch_size).map(move |offset| {
        let len = batch_size.min(end - offset);
        let slice = match len == batch.num_rows() {
            true => compacted(batch)?,
            false => owned_slice(batch, offset, len)?,
        };
        Ok(slice.record_output(baseline))
    })
}

/// `batch`'s rows in slices of at most `batch_size` rows over its buffers,
/// each recorded as output: `batch` itself where it is no larger.
pub(super) fn shared_slices<'a>(
    batch: &'a RecordBatch,
    batch_size: usize,
    baseline: &'a BaselineMetrics,
) -> impl Iterator<Item = Result<RecordBatch>> + 'a {
    let rows = batch.num_rows();
    (0..rows).step_by(batch_size).map(move |offset| {
        let slice = match rows <= batch_size {
            true => batch.clone(),
            false => batch.slice(offset, batch_size.min(rows - offset)),
        };
        Ok(slice.record_output(baseline))
    })
}

/// Sends output in `batch_size` slices and stops at the join's `fetch`.
pub(super) struct OutputSender<'a> {
    tx: &'a Sender<Result<RecordBatch>>,
    batch_size: usize,
    remaining: Option<usize>,
    inputs: &'a PartitionInputs,
}

impl<'a> OutputSender<'a> {
    pub fn new(tx: &'a Sender<Result<RecordBatch>>, inputs: &'a PartitionInputs) -> Self {
        Self { tx, batch_size: inputs.output_limits().batch_rows, remaining: inputs.fetch, inputs }
    }

    pub async fn send_all(&mut self, batches: Vec<RecordBatch>) -> Result<bool> {
        for batch in batches {
            if !self.send(batch).await? {
                return Ok(false);
            }
        }
        Ok(self.remaining != Some(0))
    }

    /// False once no more output is wanted: the fetch is reached or the
    /// consumer has gone (the query was cancelled).
    pub async fn send(&mut self, batch: RecordBatch) -> Result<bool> {
        let limit = self.remaining.unwrap_or(usize::MAX);
        for slice in output_slices(&batch, self.batch_size, limit, &self.inputs.metrics.baseline) {
            let slice = slice?;
            if let Some(remaining) = self.remaining.as_mut() {
                *remaining -= slice.num_rows();
            }
            if self.tx.send(Ok(slice)).await.is_err() {
                return Ok(false);
            }
        }
        Ok(self.remaining != Some(0))
    }
}
