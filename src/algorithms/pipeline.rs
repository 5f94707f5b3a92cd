//! The join pipeline: prepare the build side once, join each probe chunk,
//! then emit what the build side owes once the probe side is exhausted.

use std::sync::atomic::{AtomicBool, Ordering};

use arrow::array::{Array, ArrayRef};
use arrow::record_batch::RecordBatch;
use datafusion::common::{JoinSide, internal_err};
use datafusion::error::Result;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::metrics::Time;

use super::materialize::output_batch;
use super::phases::{find_matches, transform_build, transform_probe};
use super::residual;
use super::semantics::{ProbeSummary, build_side_rows, resolve_probe_chunk};
use super::side::{ColumnPlacement, PlacedColumns, SideView, has_host_columns, place_columns};
use super::{JoinDefinition, Strategy};
use crate::backend::{JoinBackend, Space, Transformed};
use crate::keys::{KeyEncoder, KeyExactness, NormalizedKey, NormalizedKeys};

/// Where the time of a join goes, phase by phase.
#[derive(Debug, Clone, Default)]
pub struct PhaseTimers {
    pub transform: Time,
    pub matching: Time,
    pub materialize: Time,
}

/// The transformed build relation, in the key width the encoding chose.
enum KeyedRelation<B: JoinBackend> {
    U32(Transformed<B, u32>),
    U64(Transformed<B, u64>),
}

/// What null-aware anti joins need to know about the whole probe side,
/// shared by every probe partition.
#[derive(Debug, Default)]
pub struct NullAwareState {
    probe_non_empty: AtomicBool,
    probe_has_null_key: AtomicBool,
}

impl NullAwareState {
    fn summary(&self) -> ProbeSummary {
        ProbeSummary {
            non_empty: self.probe_non_empty.load(Ordering::Relaxed),
            has_null_key: self.probe_has_null_key.load(Ordering::Relaxed),
        }
    }
}

/// The build side, collected, encoded and transformed once per join (per
/// partition in `Partitioned` mode), then shared by every probe chunk.
pub struct BuildSide<B: JoinBackend> {
    batch: RecordBatch,
    keys: Vec<ArrayRef>,
    encoder: KeyEncoder,
    strategy: Strategy,
    relation: KeyedRelation<B>,
    placements: Vec<Option<ColumnPlacement<B::Column>>>,
    visited: Option<B::Flags>,
    null_aware: NullAwareState,
}

impl<B: JoinBackend> BuildSide<B> {
    pub fn rows(&self) -> usize {
        self.batch.num_rows()
    }

    fn view(&self) -> SideView<'_, B> {
        let (row_ids, payloads) = match &self.relation {
            KeyedRelation::U32(r) => (r.row_ids.as_ref(), r.payloads.as_slice()),
            KeyedRelation::U64(r) => (r.row_ids.as_ref(), r.payloads.as_slice()),
        };
        SideView {
            batch: &self.batch,
            keys: &self.keys,
            space: self.strategy.build_space,
            row_ids,
            placements: &self.placements,
            payloads,
        }
    }
}

fn evaluate_keys(expressions: &[PhysicalExprRef], batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
    expressions.iter().map(|e| e.evaluate(batch)?.into_array(batch.num_rows())).collect()
}

/// Whether a side must carry row ids through its transform: to map matches
/// to original rows, or for host-side work on original rows.
fn needs_row_ids<C>(
    definition: &JoinDefinition,
    side: JoinSide,
    space: Space,
    exactness: KeyExactness,
    placements: &[Option<ColumnPlacement<C>>],
) -> bool {
    space == Space::Original
        || exactness == KeyExactness::NeedsVerification
        || definition.filter_reads(side)
        || has_host_columns(placements)
        || (side == JoinSide::Left && definition.null_aware)
}

/// Collects nothing itself: `batch` is the whole build side.
pub fn prepare_build_side<B: JoinBackend>(
    backend: &B,
    definition: &JoinDefinition,
    batch: RecordBatch,
    timers: &PhaseTimers,
) -> Result<BuildSide<B>> {
    let timer = timers.transform.timer();
    let keys = evaluate_keys(&definition.build_keys, &batch)?;
    let encoder = KeyEncoder::for_build_side(&keys, definition.null_equality)?;
    let strategy = Strategy::choose(B::PREFERRED_GATHER_SPACE, definition);
    let PlacedColumns { placements, to_transform } =
        place_columns(backend, &batch, &definition.build_output_columns(), strategy.build_space)?;
    let with_row_ids =
        needs_row_ids(definition, JoinSide::Left, strategy.build_space, encoder.exactness(), &placements);
    let payloads: Vec<&B::Column> = to_transform.iter().collect();
    let relation = match encoder.encode(&keys)? {
        NormalizedKeys::U32(k) => KeyedRelation::U32(transform_build(
            backend,
            strategy.algorithm,
            &backend.upload(&k)?,
            &payloads,
            with_row_ids,
        )?),
        NormalizedKeys::U64(k) => KeyedRelation::U64(transform_build(
            backend,
            strategy.algorithm,
            &backend.upload(&k)?,
            &payloads,
            with_row_ids,
        )?),
    };
    let visited = match definition.tracks_visited_build_rows() {
        true => Some(backend.new_flags(batch.num_rows())?),
        false => None,
    };
    // Every probe partition reads the build side from here on.
    backend.finish()?;
    timer.done();
    Ok(BuildSide {
        batch,
        keys,
        encoder,
        strategy,
        relation,
        placements,
        visited,
        null_aware: NullAwareState::default(),
    })
}

/// Joins one probe chunk with the build side and returns its output rows
/// (the probe side's part of the result; build-side rows come at the end).
pub fn join_probe_chunk<B: JoinBackend>(
    backend: &B,
    definition: &JoinDefinition,
    build: &BuildSide<B>,
    batch: RecordBatch,
    timers: &PhaseTimers,
) -> Result<RecordBatch> {
    let timer = timers.transform.timer();
    let keys = evaluate_keys(&definition.probe_keys, &batch)?;
    if definition.null_aware {
        let state = &build.null_aware;
        if batch.num_rows() > 0 {
            state.probe_non_empty.store(true, Ordering::Relaxed);
        }
        if keys[0].logical_null_count() > 0 {
            state.probe_has_null_key.store(true, Ordering::Relaxed);
        }
        if state.probe_has_null_key.load(Ordering::Relaxed) {
            // Nothing will be emitted, whatever else the probe side holds.
            return Ok(RecordBatch::new_empty(definition.output_schema.clone()));
        }
    }
    let normalized = build.encoder.encode(&keys)?;
    timer.done();
    match (&build.relation, normalized) {
        (KeyedRelation::U32(relation), NormalizedKeys::U32(k)) => {
            join_keyed_chunk(backend, definition, build, relation, batch, &keys, &k, timers)
        }
        (KeyedRelation::U64(relation), NormalizedKeys::U64(k)) => {
            join_keyed_chunk(backend, definition, build, relation, batch, &keys, &k, timers)
        }
        _ => internal_err!("probe keys were encoded in another width than the build keys"),
    }
}

#[allow(clippy::too_many_arguments)]
fn join_keyed_chunk<B: JoinBackend, K: NormalizedKey>(
    backend: &B,
    definition: &JoinDefinition,
    build: &BuildSide<B>,
    build_relation: &Transformed<B, K>,
    batch: RecordBatch,
    key_arrays: &[ArrayRef],
    keys: &[K],
    timers: &PhaseTimers,
) -> Result<RecordBatch> {
    let timer = timers.transform.timer();
    // Probe order is kept by matching in original probe rows, then
    // ordering the pairs by them.
    let keep_probe_order = definition.keeps_probe_order(batch.num_rows());
    let space = if keep_probe_order { Space::Original } else { build.strategy.probe_space };
    let PlacedColumns { placements, to_transform } =
        place_columns(backend, &batch, &definition.probe_output_columns(), space)?;
    let with_row_ids = needs_row_ids(definition, JoinSide::Right, space, build.encoder.exactness(), &placements);
    let payloads: Vec<&B::Column> = to_transform.iter().collect();
    let probe_relation =
        transform_probe(backend, build_relation.layout, &backend.upload(keys)?, &payloads, with_row_ids)?;
    drop(payloads);
    drop(to_transform);
    timer.done();

    let timer = timers.matching.timer();
    let build_view = build.view();
    let probe_view = SideView {
        batch: &batch,
        keys: key_arrays,
        space,
        row_ids: probe_relation.row_ids.as_ref(),
        placements: &placements,
        payloads: &probe_relation.payloads,
    };
    let candidates = find_matches(backend, build_relation, &probe_relation, (build.strategy.build_space, space))?;
    let matches =
        residual::apply(backend, definition, build.encoder.exactness(), &build_view, &probe_view, candidates)?;
    let rows = resolve_probe_chunk(
        backend,
        definition,
        matches,
        probe_relation.rows,
        build.visited.as_ref(),
        keep_probe_order,
    )?;
    timer.done();

    let _timer = timers.materialize.timer();
    output_batch(backend, definition, &rows, &build_view, Some(&probe_view))
}

/// The build-side rows a join emits once every probe partition has finished:
/// unmatched rows of Left and Full joins, LeftSemi, LeftAnti and LeftMark.
pub fn finish_build_side<B: JoinBackend>(
    backend: &B,
    definition: &JoinDefinition,
    build: &BuildSide<B>,
    timers: &PhaseTimers,
) -> Result<Option<RecordBatch>> {
    let Some(visited) = &build.visited else {
        return Ok(None);
    };
    let _timer = timers.materialize.timer();
    let view = build.view();
    let rows = build_side_rows(backend, definition, &view, visited, build.rows(), build.null_aware.summary())?;
    rows.map(|rows| output_batch(backend, definition, &rows, &view, None)).transpose()
}
