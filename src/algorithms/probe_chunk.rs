//! A probe chunk: loaded onto the backend (keys encoded as the build side's
//! and uploaded, output columns placed), then joined with the build side:
//! transformed, matched, filtered, resolved by the join type and
//! materialized.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::ArrayRef;
use arrow::record_batch::RecordBatch;
use datafusion::common::{JoinSide, internal_err};
use datafusion::error::Result;

use super::JoinDefinition;
use super::build_side::{BuildSide, KeyedRelation, ProbePlan, needs_row_ids};
use super::host_rows::HostRows;
use super::materialize::{OutputLimits, output_batches, probe_rows_passed_through};
use super::phases::{
    PhaseTimers, find_directory_matches, find_matches, mark_directory_matches, mark_matches, transform_probe,
};
use super::probe_columns::{ProbeColumns, ProbeOutput, upload_pays};
use super::residual;
use super::semantics::{
    each_probe_row_once, in_probe_order, resolve_from_flags, resolve_in_key_order, resolve_probe_chunk,
};
use super::side::{
    ColumnPlacement, PlacedColumns, SideView, columns_held, filter_columns, has_host_columns, place_columns,
};
use super::staged_keys::{KeyedVector, StagedKeys, probe_keys_in_place, upload_keys};
use crate::backend::{Admitted, JoinBackend, MatchFlags, Space, Transformed, check_candidates_within};
use crate::keys::{KeyExactness, NormalizedKey};

/// A joined probe chunk's output.
pub struct JoinedChunk {
    pub batches: Vec<RecordBatch>,
    pub probe_columns: ProbeOutput,
}

/// A probe chunk moved to the backend: keys encoded as the build side's and
/// uploaded, needed columns placed. Loading one chunk overlaps the join of
/// the one before, on another backend instance (another stream).
pub struct LoadedChunk<B: JoinBackend> {
    chunk: HostRows,
    columns: ProbeColumns,
    /// The plan it was loaded by: only the build side prepared with that
    /// plan joins it.
    plan: Arc<ProbePlan>,
    /// The key columns whole, only where candidates are verified against
    /// them (hashed keys); empty otherwise.
    key_arrays: Vec<ArrayRef>,
    keys: Option<KeyedVector<B>>,
    space: Space,
    keep_probe_order: bool,
    with_row_ids: bool,
    placements: Vec<Option<ColumnPlacement<B::Column>>>,
    to_transform: Vec<B::Column>,
    /// The columns the backend compares for the filter.
    filter_columns: Vec<(usize, B::Column)>,
    /// How its output batches are cut.
    limits: OutputLimits,
}

impl<B: JoinBackend> LoadedChunk<B> {
    pub fn rows(&self) -> usize {
        self.chunk.rows()
    }

    /// The chunk as it came from the probe input.
    pub fn chunk(&self) -> &HostRows {
        &self.chunk
    }

    /// When the chunk's output columns are placed.
    pub fn columns(&self) -> ProbeColumns {
        self.columns
    }

    /// Whether it was loaded for `build`: a build side prepared again (once
    /// alone on the device) has a plan of its own.
    pub fn loaded_for(&self, build: &BuildSide<B>) -> bool {
        Arc::ptr_eq(&self.plan, &build.plan)
    }
}

/// Encodes a probe chunk's keys as the build side's and moves the chunk to
/// the backend. Waits for the uploads, so that another instance may use it.
pub fn load_probe_chunk<B: JoinBackend>(
    backend: &B,
    definition: &JoinDefinition,
    plan: &Arc<ProbePlan>,
    chunk: HostRows,
    columns: ProbeColumns,
    limits: OutputLimits,
    timers: &PhaseTimers,
) -> Result<LoadedChunk<B>> {
    let _timer = timers.transform.timer();
    let keys = StagedKeys::evaluate(&definition.probe_keys, chunk.parts())?;
    // Probe order is kept by matching in original probe rows, then
    // ordering the pairs by them; columns placed after matching are
    // gathered by original row, on either side.
    let keep_probe_order = definition.keeps_probe_order(chunk.rows());
    let space = match keep_probe_order || columns == ProbeColumns::AfterMatching {
        true => Space::Original,
        false => plan.choice.strategy.probe_space,
    };
    let key_arrays = match plan.encoder.exactness() {
        KeyExactness::NeedsVerification => keys.concatenated()?,
        KeyExactness::Exact => vec![],
    };
    let mut loaded = LoadedChunk {
        chunk,
        columns,
        plan: Arc::clone(plan),
        key_arrays,
        keys: None,
        space,
        keep_probe_order,
        with_row_ids: false,
        placements: vec![],
        to_transform: vec![],
        filter_columns: vec![],
        limits,
    };
    if definition.null_aware {
        let state = &plan.null_aware;
        if loaded.rows() > 0 {
            state.probe_non_empty.store(true, Ordering::Relaxed);
        }
        if keys.first_key_has_null() {
            state.probe_has_null_key.store(true, Ordering::Relaxed);
        }
        if state.probe_has_null_key.load(Ordering::Relaxed) {
            // Nothing will be emitted, whatever else the probe side holds.
            return Ok(loaded);
        }
    }
    // Columns first: their transfers run while the keys are encoded.
    let placed = match columns {
        ProbeColumns::Upload => place_columns(backend, &loaded.chunk, &definition.probe_output_columns(), true, space)?,
        ProbeColumns::AfterMatching => PlacedColumns { placements: vec![], to_transform: vec![] },
    };
    loaded.filter_columns =
        filter_columns(backend, &loaded.chunk, &definition.pair_filter_columns(JoinSide::Right), &placed)?;
    let PlacedColumns { placements, to_transform } = placed;
    loaded.keys = Some(match probe_keys_in_place(backend, &plan.probe_encoder, &keys)? {
        Some(keys) => keys,
        None => upload_keys(backend, &plan.probe_encoder, &keys)?,
    });
    loaded.with_row_ids = needs_row_ids(definition, JoinSide::Right, space, plan.encoder.exactness(), &placements);
    (loaded.placements, loaded.to_transform) = (placements, to_transform);
    backend.finish()?;
    Ok(loaded)
}

/// Which output rows a joined chunk gives, in which order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emit {
    /// The chunk's own rows; build-side rows come once every chunk is in
    /// ([`super::finish_build_side`]).
    ChunkRows,
    /// The whole probe side of a partition, loaded as one chunk: every
    /// output row of the partition, build-side rows included, in the build
    /// side's key order ([`JoinDefinition::key_order`]).
    AllInKeyOrder,
}

/// Joins a loaded probe chunk with the build side and returns the output
/// rows `output` asks for, letting `admission` go once the device's part is
/// done. Waits for its work before returning, so that the chunk's memory may
/// be freed on the instance that loaded it.
pub fn join_loaded_chunk<B: JoinBackend>(
    backend: &B,
    definition: &JoinDefinition,
    build: &BuildSide<B>,
    chunk: LoadedChunk<B>,
    timers: &PhaseTimers,
    output: Emit,
    mut admission: Admitted,
) -> Result<JoinedChunk> {
    if !chunk.loaded_for(build) {
        return internal_err!("GPU join: a probe chunk was loaded for another preparation of the build side");
    }
    let output = match (&build.relation, &chunk.keys) {
        (_, None) => Ok(JoinedChunk { batches: vec![], probe_columns: ProbeOutput::Gathered }),
        (KeyedRelation::U32(relation), Some(KeyedVector::U32(keys))) => {
            join_keyed_chunk(backend, definition, build, relation, &chunk, keys, timers, output, &mut admission)
        }
        (KeyedRelation::U64(relation), Some(KeyedVector::U64(keys))) => {
            join_keyed_chunk(backend, definition, build, relation, &chunk, keys, timers, output, &mut admission)
        }
        _ => internal_err!("probe keys were loaded in another width than the build keys"),
    };
    backend.finish()?;
    output
}

#[allow(clippy::too_many_arguments)]
fn join_keyed_chunk<B: JoinBackend, K: NormalizedKey>(
    backend: &B,
    definition: &JoinDefinition,
    build: &BuildSide<B>,
    build_relation: &Transformed<B, K>,
    chunk: &LoadedChunk<B>,
    keys: &B::Vector<K>,
    timers: &PhaseTimers,
    output: Emit,
    admission: &mut Admitted,
) -> Result<JoinedChunk> {
    let timer = timers.transform.timer();
    let payloads: Vec<&B::Column> = chunk.to_transform.iter().collect();
    let probe_relation = transform_probe(backend, build_relation, keys, &payloads, chunk.with_row_ids)?;
    drop(payloads);
    timer.done();

    let timer = timers.matching.timer();
    let build_view = build.view();
    let probe_view = SideView {
        rows: &chunk.chunk,
        keys: &chunk.key_arrays,
        space: chunk.space,
        row_ids: probe_relation.as_ref().and_then(|r| r.row_ids.as_ref()),
        placements: &chunk.placements,
        payloads: probe_relation.as_ref().map_or(&[], |r| r.payloads.as_slice()),
        filter_columns: &chunk.filter_columns,
    };
    let build_space = build.choice().strategy.build_space;
    let exactness = build.plan.encoder.exactness();
    let rows = if output == Emit::ChunkRows && definition.needs_no_pairs(exactness) {
        let probe_flags = definition.flags_probe_rows().then(|| backend.new_flags(chunk.rows())).transpose()?;
        let flags = MatchFlags { build: build.visited.as_ref(), probe: probe_flags.as_ref() };
        match &probe_relation {
            Some(probe_relation) => {
                mark_matches(backend, build_relation, probe_relation, (build_space, chunk.space), flags)?
            }
            None => mark_directory_matches(backend, build_relation, keys, build_space, flags)?,
        }
        resolve_from_flags(backend, definition, probe_flags.as_ref(), chunk.rows())?
    } else {
        let candidates = match &probe_relation {
            Some(probe_relation) => find_matches(backend, build_relation, probe_relation, (build_space, chunk.space))?,
            None => find_directory_matches(backend, build_relation, keys, build_space)?,
        };
        check_candidates_within(backend.len(&candidates.probe) as u64, backend.candidate_limit())?;
        let matches = residual::apply(backend, definition, exactness, &build_view, &probe_view, candidates)?;
        match output {
            Emit::ChunkRows => resolve_probe_chunk(
                backend,
                definition,
                matches,
                chunk.rows(),
                build.visited.as_ref(),
                chunk.keep_probe_order,
            )?,
            Emit::AllInKeyOrder => {
                resolve_in_key_order(backend, definition, &build_view, matches, build.visited.as_ref(), build.rows())?
            }
        }
    };
    // Probe columns not placed yet need no placing if each probe row is
    // once in the output: the chunk's own columns are then the output's.
    let (rows, passed_through) = match (output, chunk.columns) {
        (Emit::ChunkRows, ProbeColumns::AfterMatching) if !definition.probe_output_columns().is_empty() => {
            each_probe_row_once(backend, rows, chunk.rows())?
        }
        _ => (rows, false),
    };
    timer.done();

    let _timer = timers.materialize.timer();
    if passed_through {
        let batches = probe_rows_passed_through(
            backend,
            definition,
            &rows,
            &build_view,
            &chunk.chunk,
            chunk.limits.batch_rows,
            admission,
        )?;
        return Ok(JoinedChunk { batches, probe_columns: ProbeOutput::PassedThrough });
    }
    let placed = match chunk.columns {
        ProbeColumns::Upload => None,
        ProbeColumns::AfterMatching => Some(place_after_matching(backend, definition, &chunk.chunk, rows.len)?),
    };
    // Any column taken on the host counts, strings included: those are
    // always taken there, and read at random they cost the most.
    let taken_on_host = placed.as_ref().is_some_and(|placed| has_host_columns(&placed.placements));
    let rows = if taken_on_host && output == Emit::ChunkRows && definition.orders_host_takes(chunk.keep_probe_order) {
        in_probe_order(backend, rows)?
    } else {
        rows
    };
    let probe_view = match &placed {
        Some(placed) => SideView { placements: &placed.placements, ..probe_view },
        None => probe_view,
    };
    let batches = output_batches(
        backend,
        definition,
        &rows,
        &build_view,
        Some(&probe_view),
        chunk.limits.array_values,
        admission,
    )?;
    let probe_columns = match placed.is_some_and(|placed| placed.on_host) {
        true => ProbeOutput::TakenOnHost,
        false => ProbeOutput::Gathered,
    };
    Ok(JoinedChunk { batches, probe_columns })
}

/// The placements of a probe chunk's output columns once the chunk's
/// output rows are known: uploaded when there are enough output rows per
/// probe row to pay for moving every row's values, taken on the host
/// otherwise.
struct PlacedAfterMatching<C> {
    placements: Vec<Option<ColumnPlacement<C>>>,
    /// Columns the backend could hold were taken on the host.
    on_host: bool,
}

fn place_after_matching<B: JoinBackend>(
    backend: &B,
    definition: &JoinDefinition,
    chunk: &HostRows,
    output_rows: usize,
) -> Result<PlacedAfterMatching<B::Column>> {
    let columns = definition.probe_output_columns();
    let enough = upload_pays(definition.probe_device_gather_ratio, output_rows as u64, chunk.rows() as u64);
    let PlacedColumns { placements, .. } = place_columns(backend, chunk, &columns, enough, Space::Original)?;
    let on_host = !enough && !columns_held(backend, chunk.schema(), &columns).is_empty();
    Ok(PlacedAfterMatching { placements, on_host })
}
