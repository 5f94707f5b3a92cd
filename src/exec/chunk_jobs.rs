//! The blocking jobs of one probe chunk: assembled on the host, loaded onto
//! the device, joined with the build side. Each runs on tokio's blocking
//! pool; callers hold the device's admission.

use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result};

use super::device_build::DeviceBuild;
use super::probing::Probing;
use super::runtime::{is_out_of_memory, run_blocking};
use super::staging::StagedChunk;
use crate::algorithms::{
    Emit, HostRows, JoinedChunk, LoadedChunk, ProbeColumns, ProbeOutput, ProbePlan, columns_held, join_loaded_chunk,
    load_probe_chunk,
};
use crate::backend::{Admitted, JoinBackend};

/// A probe chunk on its way from the loading stage to the joining stage.
pub(super) enum Chunk<B: JoinBackend> {
    Loaded(LoadedChunk<B>),
    /// Loading ran out of device memory; the joining stage retries it.
    NotLoaded(HostRows, DataFusionError),
}

/// Assembles a staged chunk on the host, in memory `backend` moves
/// without another copy: with the output columns it will upload where the
/// join's policy says they go up as the chunk is loaded, without them
/// where they are placed after matching.
pub(super) async fn assemble_chunk<B: JoinBackend>(
    probing: &Probing<'_, B>,
    backend: &B,
    staged: StagedChunk,
) -> Result<(HostRows, ProbeColumns)> {
    let _compute = probing.inputs.metrics.baseline.elapsed_compute().timer();
    let _staging = probing.inputs.metrics.probe_staging_time.timer();
    let columns = probing.join.probe_chunks.next_chunk();
    let to_device = uploaded_columns(probing, backend, columns);
    let backend = backend.clone();
    let rows = run_blocking("assembling a probe chunk", move || staged.assemble(&backend, &to_device)).await?;
    Ok((rows, columns))
}

/// The probe output columns a chunk assembles for its upload: those the
/// backend holds, where they go up as the chunk is loaded.
fn uploaded_columns<B: JoinBackend>(probing: &Probing<'_, B>, backend: &B, columns: ProbeColumns) -> Vec<usize> {
    match columns {
        ProbeColumns::Upload => {
            let wanted = probing.join.definition.probe_output_columns();
            columns_held(backend, &probing.inputs.right.schema(), &wanted)
        }
        ProbeColumns::AfterMatching => vec![],
    }
}

/// A chunk assembled to place its columns after matching, which the
/// policy, having measured the chunks joined since, now has upload them as
/// it is loaded: they are assembled now, so that their upload overlaps the
/// previous chunk's join rather than following this one's matching.
pub(super) async fn upload_columns_if_they_pay<B: JoinBackend>(
    probing: &Probing<'_, B>,
    chunk: HostRows,
    columns: ProbeColumns,
) -> Result<(HostRows, ProbeColumns)> {
    if !probing.join.probe_chunks.upload_instead(columns) {
        return Ok((chunk, columns));
    }
    let backend = &probing.build_backend;
    let to_device = uploaded_columns(probing, backend, ProbeColumns::Upload);
    let _compute = probing.inputs.metrics.baseline.elapsed_compute().timer();
    let _staging = probing.inputs.metrics.probe_staging_time.timer();
    let backend = backend.clone();
    let rows = run_blocking("assembling a probe chunk", move || chunk.with_whole_columns(&backend, &to_device)).await?;
    Ok((rows, ProbeColumns::Upload))
}

/// Loads a probe chunk by `plan`, in one blocking job; a chunk that runs
/// out of device memory comes back not loaded.
pub(super) async fn load_chunk<B: JoinBackend>(
    probing: &Probing<'_, B>,
    backend: &B,
    plan: &Arc<ProbePlan>,
    chunk: HostRows,
    columns: ProbeColumns,
) -> Result<Chunk<B>> {
    let inputs = probing.inputs;
    let _compute = inputs.metrics.baseline.elapsed_compute().timer();
    let (backend, definition, timers) =
        (backend.clone(), Arc::clone(&probing.join.definition), inputs.metrics.phases.clone());
    let (plan, limits) = (Arc::clone(plan), inputs.output_limits());
    run_blocking("loading a probe chunk", move || {
        match load_probe_chunk(&backend, &definition, &plan, chunk.clone(), columns, limits, &timers) {
            Ok(loaded) => Ok(Chunk::Loaded(loaded)),
            Err(e) if is_out_of_memory(&e) => Ok(Chunk::NotLoaded(chunk, e)),
            Err(e) => Err(e),
        }
    })
    .await
}

/// Joins a loaded chunk with `build`, in one blocking job that holds the
/// device's `admission` until its device work is done, and records its
/// output rows in the join's policy.
pub(super) async fn join_loaded<B: JoinBackend>(
    probing: &Probing<'_, B>,
    backend: &B,
    build: &Arc<DeviceBuild<B>>,
    loaded: LoadedChunk<B>,
    output: Emit,
    admission: Admitted,
) -> Result<JoinedChunk> {
    let inputs = probing.inputs;
    let (backend, definition, timers) =
        (backend.clone(), Arc::clone(&probing.join.definition), inputs.metrics.phases.clone());
    let (build, probe_rows) = (Arc::clone(build), loaded.rows());
    let _compute = inputs.metrics.baseline.elapsed_compute().timer();
    let joined = run_blocking("joining a probe chunk", move || {
        join_loaded_chunk(&backend, &definition, &build, loaded, &timers, output, admission)
    })
    .await?;
    let output_rows = joined.batches.iter().map(RecordBatch::num_rows).sum();
    probing.join.probe_chunks.record(probe_rows, output_rows, joined.probe_columns);
    match joined.probe_columns {
        ProbeOutput::TakenOnHost => inputs.metrics.probe_chunks_on_host.add(1),
        ProbeOutput::PassedThrough => inputs.metrics.probe_chunks_passed_through.add(1),
        ProbeOutput::Gathered => {}
    }
    Ok(joined)
}

/// Loads `rows` and joins them under `admission`, which the join lets go
/// once its device work is done; an out-of-memory error from either step
/// comes back as it is.
pub(super) async fn load_and_join<B: JoinBackend>(
    probing: &Probing<'_, B>,
    backend: &B,
    build: &Arc<DeviceBuild<B>>,
    rows: HostRows,
    columns: ProbeColumns,
    output: Emit,
    admission: Admitted,
) -> Result<Vec<RecordBatch>> {
    match load_chunk(probing, backend, build.plan(), rows, columns).await? {
        Chunk::Loaded(loaded) => Ok(join_loaded(probing, backend, build, loaded, output, admission).await?.batches),
        Chunk::NotLoaded(_, error) => Err(error),
    }
}
