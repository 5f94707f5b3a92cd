//! The ladder a probe chunk climbs down when the device runs out of memory.
//!
//! ```text
//!  chunk, beside other jobs ──(out of memory, or more pairs than one match call makes)──┐
//!                                                                                      ▼
//!            ┌──────────────── the chunk alone on the device ◄──────────────────────────┘
//!            │ out of memory
//!            ▼
//!  its halves, each alone on the device, in probe order ──(out of memory)──► their halves …
//!            │ a piece of at most SMALLEST_RETRY_ROWS rows still out of memory
//!            ▼
//!  DataFusion's HashJoinExec over the build side's host copy, built once per build side
//! ```
//!
//! Each piece's output is sent before the next piece is joined, so that
//! the output of a chunk of a many-to-many join, which may be far larger
//! than memory, is never held whole.

use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use datafusion::common::resources_datafusion_err;
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_plan::ExecutionPlanProperties;

use super::chunk_jobs::load_and_join;
use super::device_build::DeviceBuild;
use super::output::OutputSender;
use super::probing::Probing;
use super::runtime::{is_out_of_memory, run_blocking};
use crate::algorithms::{HostRows, OutputRows, ProbeColumns};
use crate::backend::JoinBackend;

/// Below this many rows a piece that runs out of device memory is not
/// split further but handed to DataFusion's operator.
pub(super) const SMALLEST_RETRY_ROWS: usize = 1 << 12;

/// Joins a chunk's rows alone on the device, then in halves, and below
/// [`SMALLEST_RETRY_ROWS`] by DataFusion's operator. False when no more
/// output is wanted.
pub(super) async fn join_in_pieces<B: JoinBackend>(
    probing: &Probing<'_, B>,
    backend: &B,
    build: &Arc<DeviceBuild<B>>,
    rows: HostRows,
    error: DataFusionError,
    output: &mut OutputSender<'_>,
) -> Result<bool> {
    let batch = run_blocking("assembling a probe chunk to retry", move || rows.whole_batch()).await?;
    log::info!("gpu_join: retrying a probe chunk of {} rows alone on the device: {error}", batch.num_rows());
    let retries = &probing.inputs.metrics.out_of_memory_retries;
    retries.add(1);
    let mut pending = vec![batch];
    while let Some(piece) = pending.pop() {
        let permit = probing.admitted_alone().await?;
        let rows = HostRows::whole(piece.clone());
        let error = match load_and_join(probing, backend, build, rows, ProbeColumns::Upload, OutputRows::OfChunk).await
        {
            Ok(batches) => {
                // The device is not held while the consumer takes the output.
                drop(permit);
                if !output.send_all(batches).await? {
                    return Ok(false);
                }
                continue;
            }
            Err(e) if is_out_of_memory(&e) => e,
            Err(e) => return Err(e),
        };
        drop(permit);
        retries.add(1);
        let rows = piece.num_rows();
        if rows <= SMALLEST_RETRY_ROWS {
            let batches = join_on_cpu(probing, build, piece, error).await?;
            if !output.send_all(batches).await? {
                return Ok(false);
            }
        } else {
            // Halves in probe order: the later half is joined last.
            pending.push(piece.slice(rows / 2, rows - rows / 2));
            pending.push(piece.slice(0, rows / 2));
        }
    }
    Ok(true)
}

/// The output rows of `piece` from DataFusion's operator, or `error` with
/// what to do where the join type does not allow a piece to be joined on
/// its own: that gives exactly the rows the device would have given only
/// for joins whose probe chunks join independently (no build-side rows
/// emitted at the end, no NOT IN).
async fn join_on_cpu<B: JoinBackend>(
    probing: &Probing<'_, B>,
    build: &DeviceBuild<B>,
    piece: RecordBatch,
    error: DataFusionError,
) -> Result<Vec<RecordBatch>> {
    let (join, inputs) = (probing.join, probing.inputs);
    if !join.definition.probe_chunks_join_independently() {
        return Err(resources_datafusion_err!(
            "{error}. A {} join cannot hand single probe chunks to DataFusion; lower gpu_join.probe_chunk_rows, \
             raise gpu_join.memory_limit, or set gpu_join.enabled = false",
            join.definition.join_type
        ));
    }
    log::warn!("gpu_join: joining {} probe rows on DataFusion's operator: {error}", piece.num_rows());
    let partitions = (inputs.right.output_partitioning().partition_count(), inputs.partition);
    let (context, tables) = (Arc::clone(&inputs.context), &inputs.metrics.host_fallback_tables);
    build.join_on_cpu(&join.twin, partitions, piece, context, tables).await
}
