//! A partition's probe side joined with one build side on the device, chunk
//! by chunk, in three stages that run side by side:
//!
//! ```text
//!  probe batches ──► assemble ──(channel of 1)──► load ──(channel of 1)──► join ──► output
//!                    stage into chunks,           encode keys, upload       match, materialize,
//!                    assemble on the host         (own CUDA stream)         send in batch_size slices
//! ```
//!
//! So the host copy of chunk k + 2, the upload of chunk k + 1, the kernels
//! and download of chunk k and the hand-off of chunk k - 1's batches
//! overlap, and across partitions the device sees uploads, kernels and
//! downloads of different chunks at once. Every backend call runs on
//! tokio's blocking pool, under the device's bounded admission.
//!
//! Over a build side still being prepared whole, chunks are staged and
//! assembled meanwhile, and loading waits for the build side's probe plan
//! (how chunks encode their keys), which comes while the build side is
//! transformed. Should the build side be split into passes after all, the
//! stages stop, none of their chunks joined ([`ProbeEnd::SplitIntoPasses`]).

use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use datafusion::common::internal_err;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryConsumer;
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::mpsc::{Receiver, Sender, channel};

use super::chunk_jobs::{Chunk, assemble_chunk, join_loaded, load_chunk, upload_columns_if_they_pay};
use super::device_build::DeviceBuild;
use super::out_of_memory::join_in_pieces;
use super::output::OutputSender;
use super::passes::BuildPasses;
use super::probing::{BuildForJob, LoadPlan, Probing};
use super::runtime::needs_smaller_pieces;
use super::staging::{ProbeStaging, held_bytes};
use crate::algorithms::{Emit, HostRows, ProbeColumns};
use crate::backend::{JoinBackend, MAX_RELATION_ROWS};

/// How a partition's probe stages ended.
pub(super) enum ProbeEnd<B: JoinBackend> {
    /// Every chunk joined; false when no more output is wanted.
    Joined(bool),
    /// The build side being prepared whole was split into passes instead;
    /// no chunk was joined.
    SplitIntoPasses(Arc<BuildPasses<B>>),
}

impl<B: JoinBackend> ProbeEnd<B> {
    /// The end of the stages over a build side already placed.
    pub fn joined(self) -> Result<bool> {
        match self {
            ProbeEnd::Joined(finished) => Ok(finished),
            ProbeEnd::SplitIntoPasses(_) => {
                internal_err!("GPU join: a build side already placed was split into passes")
            }
        }
    }
}

/// Joins the probe side with the build side `probing` takes its jobs'
/// build side from, chunk by chunk: the three stages run side by side.
pub(super) async fn join_probe_side<B: JoinBackend>(
    probing: &Probing<'_, B>,
    probe: &mut BoxStream<'_, Result<RecordBatch>>,
    output: &mut OutputSender<'_>,
) -> Result<ProbeEnd<B>> {
    let (assembled_tx, assembled_rx) = channel(1);
    let (chunk_tx, chunk_rx) = channel(1);
    let (assembled, loaded, joined) = futures::join!(
        assemble_chunks(probing, probe, assembled_tx),
        load_chunks(probing, assembled_rx, chunk_tx),
        join_chunks(probing, chunk_rx, output)
    );
    // The joining stage's error explains the others' (a closed channel),
    // not the other way round; the loading stage's explains the assembling
    // stage's, which stops without one when the loading stage stops first.
    let finished = joined?;
    let split = loaded?;
    assembled?;
    Ok(match split {
        Some(passes) => ProbeEnd::SplitIntoPasses(passes),
        None => ProbeEnd::Joined(finished),
    })
}

/// Stages probe batches into chunks and assembles them on the host, one
/// ahead of the loading stage.
async fn assemble_chunks<B: JoinBackend>(
    probing: &Probing<'_, B>,
    probe: &mut BoxStream<'_, Result<RecordBatch>>,
    assembled_tx: Sender<(HostRows, ProbeColumns)>,
) -> Result<()> {
    let inputs = probing.inputs;
    // Only its transfer memory is used: no instance (stream) of its own.
    let backend = &probing.build_backend;
    let reservation =
        MemoryConsumer::new(format!("GpuJoinProbe[{}]", inputs.partition)).register(inputs.context.memory_pool());
    let chunk_rows = probing.options.probe_chunk_rows.clamp(1, MAX_RELATION_ROWS);
    let mut staging = ProbeStaging::new(inputs.right.schema(), chunk_rows);
    let policy = &probing.join.probe_chunks;
    let mut input_done = false;
    while !input_done {
        let chunks = match probe.next().await {
            Some(batch) => {
                let batch = batch?;
                let bytes = held_bytes(&batch);
                probing.hold_probe(&batch, bytes)?;
                reservation.try_grow(bytes)?;
                staging.resize(policy.chunk_rows(chunk_rows, inputs.limits.pairs));
                staging.push(batch)
            }
            None => {
                input_done = true;
                staging.finish().into_iter().collect()
            }
        };
        for staged in chunks {
            if assembled_tx.is_closed() {
                // The loading stage has stopped: no use assembling more.
                return Ok(());
            }
            let chunk = assemble_chunk(probing, backend, staged).await?;
            reservation.resize(0);
            if assembled_tx.send(chunk).await.is_err() {
                // The loading stage has stopped: the joining stage
                // stopped, or it failed.
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Encodes and uploads assembled probe chunks, one ahead of the joining
/// stage. Returns the passes a build side being prepared whole was split
/// into instead, if it was.
async fn load_chunks<B: JoinBackend>(
    probing: &Probing<'_, B>,
    mut assembled_rx: Receiver<(HostRows, ProbeColumns)>,
    chunk_tx: Sender<Chunk<B>>,
) -> Result<Option<Arc<BuildPasses<B>>>> {
    let backend = probing.open_backend()?;
    while let Some((chunk, columns)) = assembled_rx.recv().await {
        let (plan, build) = match probing.load_plan().await? {
            LoadPlan::Ready(plan, build) => (plan, build),
            // Nothing is joined yet: the partition joins in passes instead.
            LoadPlan::SplitIntoPasses(passes) => return Ok(Some(passes)),
        };
        let (chunk, columns) = upload_columns_if_they_pay(probing, chunk, columns).await?;
        let permit = probing.admitted().await?;
        let loaded = load_chunk(probing, &backend, &plan, chunk, columns).await?;
        // Neither is held while the joining stage is busy: it may need the
        // device alone, or another pass of the build side.
        drop((permit, build));
        if chunk_tx.send(loaded).await.is_err() {
            // The joining stage has stopped: fetch reached, cancelled, or
            // failed.
            return Ok(None);
        }
    }
    // Chunks loaded by the plan of a build side split since were dropped
    // by the joining stage: the partition joins them in passes too.
    probing.split_instead().await
}

/// What joining a probe chunk gave.
enum ChunkJoined<B: JoinBackend> {
    Output(Vec<RecordBatch>),
    /// Device memory ran out, or the chunk matched more pairs than one
    /// match call makes ([`crate::backend::TooManyPairs`]): its rows are to
    /// be joined again in pieces.
    InPieces {
        rows: HostRows,
        error: DataFusionError,
        build: Arc<DeviceBuild<B>>,
    },
}

/// Joins loaded chunks and sends their output while the next one is
/// awaited and joined: a probe input that stalls does not hold back the
/// output of what it gave. False when no more output is wanted.
async fn join_chunks<B: JoinBackend>(
    probing: &Probing<'_, B>,
    mut chunk_rx: Receiver<Chunk<B>>,
    output: &mut OutputSender<'_>,
) -> Result<bool> {
    let backend = probing.open_backend()?;
    let mut previous: Vec<RecordBatch> = vec![];
    loop {
        // The build side is let go as soon as the chunk is joined, not
        // held while the output waits for its consumer.
        let next = async {
            let Some(chunk) = chunk_rx.recv().await else {
                return Ok(None);
            };
            match probing.build_for_job().await? {
                BuildForJob::Ready(build) => join_chunk(probing, &backend, &build, chunk).await.map(Some),
                // Loaded while the build side was prepared whole, which was
                // split into passes instead: the loading stage says so once
                // done.
                BuildForJob::SplitIntoPasses(_) => Ok(Some(ChunkJoined::Output(vec![]))),
            }
        };
        let (joined, sent) = futures::join!(next, output.send_all(std::mem::take(&mut previous)));
        if !sent? {
            return Ok(false);
        }
        match joined? {
            Some(ChunkJoined::Output(joined)) => previous = joined,
            Some(ChunkJoined::InPieces { rows, error, build }) => {
                if !join_in_pieces(probing, &backend, &build, rows, error, output).await? {
                    return Ok(false);
                }
            }
            None => return Ok(true),
        }
    }
}

/// The output of one chunk, joined on the device; or its rows, where it
/// must be joined in pieces (see [`join_in_pieces`]).
async fn join_chunk<B: JoinBackend>(
    probing: &Probing<'_, B>,
    backend: &B,
    build: &Arc<DeviceBuild<B>>,
    chunk: Chunk<B>,
) -> Result<ChunkJoined<B>> {
    let chunk = match chunk {
        // Loaded by the plan of a preparation since redone (alone on the
        // device): loaded again by this one's.
        Chunk::Loaded(loaded) if !loaded.loaded_for(build) => {
            let (rows, columns) = (loaded.chunk().clone(), loaded.columns());
            drop(loaded);
            let _permit = probing.admitted().await?;
            load_chunk(probing, backend, build.plan(), rows, columns).await?
        }
        chunk => chunk,
    };
    let (rows, error) = match chunk {
        Chunk::Loaded(loaded) => {
            let chunk = loaded.chunk().clone();
            let admission = probing.admitted().await?;
            match join_loaded(probing, backend, build, loaded, Emit::ChunkRows, admission).await {
                Ok(joined) => return Ok(ChunkJoined::Output(joined.batches)),
                Err(e) if needs_smaller_pieces(&e) => (chunk, e),
                Err(e) => return Err(e),
            }
        }
        Chunk::NotLoaded(chunk, error) => (chunk, error),
    };
    Ok(ChunkJoined::InPieces { rows, error, build: Arc::clone(build) })
}
