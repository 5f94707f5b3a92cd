//! One output partition of a GPU join: probe batches are staged into large
//! chunks, each chunk is joined off the async runtime, and the output leaves
//! in batches of the session's `batch_size`.

use std::sync::Arc;

use arrow::compute::concat_batches;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::common::exec_datafusion_err;
use datafusion::error::Result;
use datafusion::physical_plan::metrics::RecordOutput;
use futures::StreamExt;
use tokio::sync::mpsc::Sender;

use super::runner::{PartitionInputs, Runner};
use crate::algorithms::{finish_build_side, join_probe_chunk};
use crate::backend::{DeviceCounters, JoinBackend, MAX_RELATION_ROWS};
use crate::config::GpuJoinConfig;

/// Runs blocking join work on tokio's blocking pool, so that no backend
/// call holds up an async worker. A panic there becomes an error.
pub(crate) async fn run_blocking<T: Send + 'static>(
    what: &'static str,
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work).await.map_err(|e| exec_datafusion_err!("GPU join failed while {what}: {e}"))?
}

pub(crate) async fn run_partition<B: JoinBackend>(
    runner: Arc<Runner<B>>,
    inputs: PartitionInputs,
    tx: Sender<Result<RecordBatch>>,
) -> Result<()> {
    let counters = Arc::new(DeviceCounters::default());
    let result = join_partition(&runner, &inputs, &tx, &counters).await;
    inputs.metrics.record_device(&counters);
    inputs.metrics.baseline.done();
    result
}

async fn join_partition<B: JoinBackend>(
    runner: &Arc<Runner<B>>,
    inputs: &PartitionInputs,
    tx: &Sender<Result<RecordBatch>>,
    counters: &Arc<DeviceCounters>,
) -> Result<()> {
    let backend = runner.open_backend(Arc::clone(counters))?;
    let build = runner.build_side(&backend, inputs).await?;
    let options = GpuJoinConfig::from_config(inputs.context.session_config().options());
    let mut staging = ProbeStaging::new(inputs.right.schema(), options.probe_chunk_rows.clamp(1, MAX_RELATION_ROWS));
    let mut output = OutputSender::new(tx, inputs.context.session_config().batch_size(), inputs.fetch, inputs);
    let mut probe = inputs.right.execute(inputs.partition, Arc::clone(&inputs.context))?;

    while let Some(batch) = probe.next().await {
        let batch = batch?;
        inputs.metrics.probe_rows.add(batch.num_rows());
        for chunk in staging.push(batch)? {
            if !output.send(join_chunk(runner, &backend, &build, chunk, inputs).await?).await {
                return Ok(());
            }
        }
    }
    if let Some(chunk) = staging.finish()?
        && !output.send(join_chunk(runner, &backend, &build, chunk, inputs).await?).await
    {
        return Ok(());
    }
    drop(probe);

    if runner.definition.tracks_visited_build_rows() && runner.finish_probe(inputs.mode) {
        let (backend, definition, timers) =
            (backend.clone(), Arc::clone(&runner.definition), inputs.metrics.phases.clone());
        let build = Arc::clone(&build);
        let _compute = inputs.metrics.baseline.elapsed_compute().timer();
        let rows = run_blocking("emitting build-side rows", move || {
            finish_build_side(&backend, &definition, &build.side, &timers)
        })
        .await?;
        if let Some(rows) = rows {
            output.send(rows).await;
        }
    }
    Ok(())
}

async fn join_chunk<B: JoinBackend>(
    runner: &Arc<Runner<B>>,
    backend: &B,
    build: &Arc<super::runner::PreparedBuild<B>>,
    chunk: RecordBatch,
    inputs: &PartitionInputs,
) -> Result<RecordBatch> {
    let (backend, definition, timers) =
        (backend.clone(), Arc::clone(&runner.definition), inputs.metrics.phases.clone());
    let build = Arc::clone(build);
    let _compute = inputs.metrics.baseline.elapsed_compute().timer();
    run_blocking("joining a probe chunk", move || join_probe_chunk(&backend, &definition, &build.side, chunk, &timers))
        .await
}

/// Gathers probe batches into chunks of exactly `chunk_rows` rows (the last
/// one may be smaller).
struct ProbeStaging {
    schema: SchemaRef,
    chunk_rows: usize,
    batches: Vec<RecordBatch>,
    rows: usize,
}

impl ProbeStaging {
    fn new(schema: SchemaRef, chunk_rows: usize) -> Self {
        Self { schema, chunk_rows, batches: vec![], rows: 0 }
    }

    fn push(&mut self, mut batch: RecordBatch) -> Result<Vec<RecordBatch>> {
        let mut chunks = vec![];
        while self.rows + batch.num_rows() >= self.chunk_rows {
            let take = self.chunk_rows - self.rows;
            self.batches.push(batch.slice(0, take));
            batch = batch.slice(take, batch.num_rows() - take);
            self.rows = self.chunk_rows;
            chunks.extend(self.finish()?);
        }
        if batch.num_rows() > 0 {
            self.rows += batch.num_rows();
            self.batches.push(batch);
        }
        Ok(chunks)
    }

    fn finish(&mut self) -> Result<Option<RecordBatch>> {
        if self.rows == 0 {
            return Ok(None);
        }
        let chunk = concat_batches(&self.schema, &self.batches)?;
        self.batches.clear();
        self.rows = 0;
        Ok(Some(chunk))
    }
}

/// Sends output in `batch_size` slices and stops at the join's `fetch`.
struct OutputSender<'a> {
    tx: &'a Sender<Result<RecordBatch>>,
    batch_size: usize,
    remaining: Option<usize>,
    inputs: &'a PartitionInputs,
}

impl<'a> OutputSender<'a> {
    fn new(
        tx: &'a Sender<Result<RecordBatch>>,
        batch_size: usize,
        fetch: Option<usize>,
        inputs: &'a PartitionInputs,
    ) -> Self {
        Self { tx, batch_size: batch_size.max(1), remaining: fetch, inputs }
    }

    /// False once no more output is wanted: the fetch is reached or the
    /// consumer has gone (the query was cancelled).
    async fn send(&mut self, batch: RecordBatch) -> bool {
        let mut offset = 0;
        while offset < batch.num_rows() {
            let mut len = self.batch_size.min(batch.num_rows() - offset);
            if let Some(remaining) = self.remaining {
                len = len.min(remaining);
            }
            if len == 0 {
                break;
            }
            let slice = batch.slice(offset, len).record_output(&self.inputs.metrics.baseline);
            offset += len;
            if let Some(remaining) = self.remaining.as_mut() {
                *remaining -= len;
            }
            if self.tx.send(Ok(slice)).await.is_err() {
                return false;
            }
        }
        self.remaining != Some(0)
    }
}
