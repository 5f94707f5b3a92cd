//! The ladder a probe chunk climbs down when it cannot be joined whole.
//!
//! ```text
//!  chunk, beside other jobs
//!     │ more pairs than a match call makes             │ out of memory
//!     ▼                                                ▼
//!  pieces sized by its pairs per row,           the chunk alone on the device
//!  beside other jobs (alone once out of memory)       │
//!     │ a piece still too many ──► its own pieces      │ out of memory
//!     │ one row: a match call of every                 ▼
//!     │ build row it matches                    its halves, alone, in probe order ──► their halves …
//!     ▼                                                │ a piece of at most SMALLEST_RETRY_ROWS rows
//!  joined on the device, piece by piece                ▼
//!                                               DataFusion's HashJoinExec over the build side's
//!                                               host copy, its hash table built once per build side
//! ```
//!
//! Each piece's output is sent before the next piece is joined, so that
//! the output of a chunk of a many-to-many join, which may be far larger
//! than memory, is never held whole; the build side's visited flags carry
//! from piece to piece as from chunk to chunk, so that every join type,
//! outer, semi, anti and mark joins among them, is joined on the device
//! however many pairs its rows make.

use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use datafusion::common::resources_datafusion_err;
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_plan::ExecutionPlanProperties;

use super::chunk_jobs::load_and_join;
use super::device_build::DeviceBuild;
use super::output::OutputSender;
use super::probing::Probing;
use super::runtime::{needs_smaller_pieces, run_blocking};
use crate::algorithms::{Emit, HostRows, ProbeColumns};
use crate::backend::{JoinBackend, MAX_RELATION_ROWS, TooManyPairs, too_many_pairs};

/// Below this many rows a piece that runs out of device memory is not
/// split further but handed to DataFusion's operator.
pub(super) const SMALLEST_RETRY_ROWS: usize = 1 << 12;

/// Joins a chunk's rows in pieces, as the module's ladder says. False when
/// no more output is wanted.
pub(super) async fn join_in_pieces<B: JoinBackend>(
    probing: &Probing<'_, B>,
    backend: &B,
    build: &Arc<DeviceBuild<B>>,
    rows: HostRows,
    error: DataFusionError,
    output: &mut OutputSender<'_>,
) -> Result<bool> {
    let batch = run_blocking("assembling a probe chunk to retry", move || rows.whole_batch()).await?;
    log::info!("gpu_join: joining a probe chunk of {} rows again, in pieces: {error}", batch.num_rows());
    let retries = &probing.inputs.metrics.out_of_memory_retries;
    retries.add(1);
    // Pieces are a stack: the last is joined first. Each says whether it
    // takes the device alone: the pieces of a chunk that ran out of memory
    // beside others do; those of one that made more pairs than one match
    // call may need no more memory than any chunk, and share the device.
    let mut pending: Vec<(RecordBatch, bool)> = match too_many_pairs(&error) {
        Some(too_many) => pieces_by_pairs(&batch, too_many).into_iter().map(|piece| (piece, false)).collect(),
        None => vec![(batch, true)],
    };
    while let Some((piece, alone)) = pending.pop() {
        let rows = piece.num_rows();
        // One probe row matches at most every build row: its match call may
        // make that many pairs.
        let instance = match rows {
            1 => backend.clone().with_candidate_limit(MAX_RELATION_ROWS),
            _ => backend.clone(),
        };
        let permit = match alone {
            true => probing.admitted_alone().await?,
            false => probing.admitted().await?,
        };
        // The device is let go once the piece's device work is done, and
        // not held while the consumer takes the output.
        let joined = load_and_join(
            probing,
            &instance,
            build,
            HostRows::whole(piece.clone()),
            ProbeColumns::Upload,
            Emit::ChunkRows,
            permit,
        );
        let error = match joined.await {
            Ok(batches) => {
                if !output.send_all(batches).await? {
                    return Ok(false);
                }
                continue;
            }
            Err(e) if needs_smaller_pieces(&e) => e,
            Err(e) => return Err(e),
        };
        retries.add(1);
        match too_many_pairs(&error) {
            Some(too_many) if rows > 1 => {
                pending.extend(pieces_by_pairs(&piece, too_many).into_iter().map(|piece| (piece, alone)))
            }
            // Out of memory beside others: the same piece, alone.
            None if !alone => pending.push((piece, true)),
            _ if rows <= SMALLEST_RETRY_ROWS => {
                let batches = join_on_cpu(probing, build, piece, error).await?;
                if !output.send_all(batches).await? {
                    return Ok(false);
                }
            }
            // Halves in probe order: the later half is joined last.
            _ => {
                pending.push((piece.slice(rows / 2, rows - rows / 2), true));
                pending.push((piece.slice(0, rows / 2), true));
            }
        }
    }
    Ok(true)
}

/// `piece` cut into consecutive pieces of a size that, at the pairs per
/// row it made, makes about half the pairs one match call may; at least
/// two, in reverse order for the stack of pieces. A piece of skewed rows
/// that still makes too many is cut again by its own pairs.
fn pieces_by_pairs(piece: &RecordBatch, too_many: TooManyPairs) -> Vec<RecordBatch> {
    let rows = piece.num_rows();
    let pairs_per_row = too_many.pairs as f64 / rows.max(1) as f64;
    let piece_rows = ((too_many.limit as f64 / 2.0 / pairs_per_row) as usize).clamp(1, rows.div_ceil(2).max(1));
    (0..rows).step_by(piece_rows).rev().map(|start| piece.slice(start, piece_rows.min(rows - start))).collect()
}

/// The output rows of `piece` from DataFusion's operator, or `error` with
/// what to do where the join type does not allow a piece to be joined on
/// its own: that gives exactly the rows the device would have given only
/// for joins whose probe chunks join independently (no build-side rows
/// emitted at the end, no NOT IN).
async fn join_on_cpu<B: JoinBackend>(
    probing: &Probing<'_, B>,
    build: &Arc<DeviceBuild<B>>,
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
