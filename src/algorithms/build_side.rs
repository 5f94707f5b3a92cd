//! The build side of a join: its keys encoded, the strategy chosen, its
//! columns uploaded and its relation transformed once, then shared by every
//! probe chunk; and the build-side rows it owes once every probe chunk is in.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use arrow::array::ArrayRef;
use arrow::record_batch::RecordBatch;
use datafusion::common::{JoinSide, exec_datafusion_err};
use datafusion::error::Result;

use super::JoinDefinition;
use super::choice::{self, Choice};
use super::host_rows::HostRows;
use super::materialize::{OutputLimits, output_batches};
use super::phases::{PhaseTimers, transform_build};
use super::semantics::{ProbeSummary, build_side_rows};
use super::side::{ColumnPlacement, PlacedColumns, SideView, filter_columns, has_host_columns, upload_columns};
use super::staged_keys::{CollectedKeys, KeyedVector, StagedKeys, upload_keys};
use crate::backend::{Admitted, JoinBackend, Space, Transformed};
use crate::keys::{KeyEncoder, KeyExactness, KeyRanges, RawSpan};

/// The transformed build relation, in the key width the encoding chose.
pub(super) enum KeyedRelation<B: JoinBackend> {
    U32(Transformed<B, u32>),
    U64(Transformed<B, u64>),
}

/// What null-aware anti joins need to know about the whole probe side,
/// shared by every probe partition.
#[derive(Debug, Default)]
pub struct NullAwareState {
    pub(super) probe_non_empty: AtomicBool,
    pub(super) probe_has_null_key: AtomicBool,
}

impl NullAwareState {
    pub(super) fn summary(&self) -> ProbeSummary {
        ProbeSummary {
            non_empty: self.probe_non_empty.load(Ordering::Relaxed),
            has_null_key: self.probe_has_null_key.load(Ordering::Relaxed),
        }
    }
}

/// What loading a probe chunk needs of its build side. It is known once
/// the build side's strategy is chosen; probe chunks load by it once the
/// build side's host work is done, so that they load while it is
/// transformed.
pub struct ProbePlan {
    pub(super) encoder: KeyEncoder,
    /// How probe chunks encode their keys to meet the build side's.
    pub(super) probe_encoder: KeyEncoder,
    pub(super) choice: Choice,
    pub(super) null_aware: NullAwareState,
}

/// The build side, collected, encoded and transformed once per join (per
/// partition in `Partitioned` mode), then shared by every probe chunk.
pub struct BuildSide<B: JoinBackend> {
    pub(super) rows: HostRows,
    /// Every column whole, made when DataFusion's operator needs it.
    pub(super) whole: OnceLock<RecordBatch>,
    /// The key columns whole, only where something reads them on the host
    /// (verification of hashed keys, null-aware joins); empty otherwise.
    pub(super) keys: Vec<ArrayRef>,
    pub(super) plan: Arc<ProbePlan>,
    pub(super) relation: KeyedRelation<B>,
    pub(super) placements: Vec<Option<ColumnPlacement<B::Column>>>,
    /// The columns the backend compares for the filter.
    pub(super) filter_columns: Vec<(usize, B::Column)>,
    pub(super) visited: Option<B::Flags>,
}

impl<B: JoinBackend> BuildSide<B> {
    pub fn rows(&self) -> usize {
        self.rows.rows()
    }

    /// The strategy this build side was transformed for, and why.
    pub fn choice(&self) -> &Choice {
        &self.plan.choice
    }

    /// How probe chunks are loaded to be joined with it.
    pub fn plan(&self) -> &Arc<ProbePlan> {
        &self.plan
    }

    /// The build side's rows on the host, every column.
    pub fn whole_batch(&self) -> Result<RecordBatch> {
        if let Some(batch) = self.whole.get() {
            return Ok(batch.clone());
        }
        let batch = self.rows.whole_batch()?;
        Ok(self.whole.get_or_init(|| batch).clone())
    }

    pub(super) fn view(&self) -> SideView<'_, B> {
        let (row_ids, payloads) = match &self.relation {
            KeyedRelation::U32(r) => (r.row_ids.as_ref(), r.payloads.as_slice()),
            KeyedRelation::U64(r) => (r.row_ids.as_ref(), r.payloads.as_slice()),
        };
        SideView {
            rows: &self.rows,
            keys: &self.keys,
            space: self.plan.choice.strategy.build_space,
            row_ids,
            placements: &self.placements,
            payloads,
            filter_columns: &self.filter_columns,
        }
    }
}

/// Whether a side must carry row ids through its transform: to map matches
/// to original rows, or for host-side work on original rows.
pub(super) fn needs_row_ids<C>(
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

/// A build side's keys, the encoding they take and the strategy chosen for
/// them.
struct EncodedChoice<B: JoinBackend> {
    staged_keys: StagedKeys,
    plan: Arc<ProbePlan>,
    /// The key columns whole, only where something reads them on the host
    /// (verification of hashed keys, null-aware joins); empty otherwise.
    keys: Vec<ArrayRef>,
    /// The keys' raw bits on the backend, where they went up before their
    /// encoding was known ([`upload_raw_keys`]).
    raw_keys: Option<B::Vector<u32>>,
}

/// A build side's keys staged before its encoding is chosen, for keys that
/// may go up as their raw bits ([`RawKeys`]); where they did, those bits on
/// the backend and the span gathered on the way.
struct EarlyKeys<B: JoinBackend> {
    staged: StagedKeys,
    raw: Option<(B::Vector<u32>, KeyRanges)>,
}

/// Uploads the build side's staged keys as their raw bits, gathering their
/// span on the way, where none of them is NULL.
fn upload_raw_keys<B: JoinBackend>(backend: &B, staged: StagedKeys) -> Result<EarlyKeys<B>> {
    let raw = match staged.raw_keys() {
        Some(raw) => {
            let span = RawSpan::default();
            let keys = match staged.raw_in_place(backend)? {
                // On their way up as they lie, while the host reads them
                // for their span.
                Some(keys) => {
                    staged.widen_raw_span(raw, &span)?;
                    keys
                }
                None => backend.upload_with(staged.rows, &|first, out| staged.copy_raw_rows(raw, first, out, &span))?,
            };
            Some((keys, span.ranges()))
        }
        // A NULL among them: encoded on the host, from the keys staged here.
        None => None,
    };
    Ok(EarlyKeys { staged, raw })
}

/// Stages the build side's key columns (unless staged early), picks the
/// encoding their spans allow and chooses the strategy from a sample of
/// them.
fn encode_and_choose<B: JoinBackend>(
    backend: &B,
    definition: &JoinDefinition,
    rows: &HostRows,
    ranges: Option<&KeyRanges>,
    early: Option<EarlyKeys<B>>,
    collected: Option<CollectedKeys>,
    profile: choice::DeviceProfile,
) -> Result<EncodedChoice<B>> {
    let (staged_keys, ranges, raw_keys) = match early {
        Some(EarlyKeys { staged, raw: Some((keys, ranges)) }) => (staged, ranges, Some(keys)),
        early => {
            let staged = match early {
                Some(early) => early.staged,
                None => StagedKeys::collected_or_evaluated(&definition.build_keys, rows.parts(), collected)?,
            };
            let ranges = match ranges {
                Some(ranges) => ranges.clone(),
                None => KeyRanges::of_pieces(&staged.pieces),
            };
            (staged, ranges, None)
        }
    };
    let encoder = match &definition.key_order {
        Some(order) => KeyEncoder::for_ordered_keys(&ranges, definition.null_equality, &order.sort_options)?
            .ok_or_else(|| exec_datafusion_err!("GPU join: the build side's keys span too wide a range to sort"))?,
        None => KeyEncoder::for_key_ranges(&ranges, definition.null_equality)?,
    };
    let keys = match encoder.exactness() == KeyExactness::NeedsVerification || definition.null_aware {
        true => staged_keys.concatenated()?,
        false => vec![],
    };
    let directory = choice::directory_codes(encoder.code_count(), rows.rows());
    let choice = choice::choose(profile, B::PREFERRED_GATHER_SPACE, definition, directory, || {
        choice::observe_shape(backend, definition, &encoder, &staged_keys.pieces, rows.rows())
    })?;
    let probe_encoder = encoder.for_probe_side();
    let plan = Arc::new(ProbePlan { encoder, probe_encoder, choice, null_aware: NullAwareState::default() });
    Ok(EncodedChoice { staged_keys, plan, keys, raw_keys })
}

/// Collects nothing itself: `rows` are the whole build side, `ranges` the
/// spans of its keys where they were gathered as it was collected, and
/// `collected` its keys where they were evaluated then, batch by batch.
/// Where the spans were not gathered, keys that may go up as their raw bits
/// go up first, their spans gathered on the way, for the encoding and the
/// choice wait for the spans and the output columns' upload does not.
/// `planned` is handed the probe plan once the host has encoded the build
/// side's keys and copied its columns for the upload: loading probe chunks
/// earlier (as soon as the plan is known) took the host and the link from
/// the build side and delayed the join's first output.
pub fn prepare_build_side<B: JoinBackend>(
    backend: &B,
    definition: &JoinDefinition,
    rows: HostRows,
    ranges: Option<&KeyRanges>,
    mut collected: Option<CollectedKeys>,
    timers: &PhaseTimers,
    planned: impl FnOnce(&Arc<ProbePlan>),
) -> Result<BuildSide<B>> {
    let timer = timers.transform.timer();
    // Measured once per device and kept: measured beside this side's
    // upload, it would time the primitives against that upload.
    let profile = choice::device_profile(backend);
    let raw = rows.parts().first().is_some_and(|batch| definition.build_keys_may_go_up_raw(&batch.schema()));
    let early = match (ranges, raw) {
        (None, true) => {
            let keys = &definition.build_keys;
            Some(upload_raw_keys(backend, StagedKeys::collected_or_evaluated(keys, rows.parts(), collected.take())?)?)
        }
        _ => None,
    };
    // The output columns go up while the host works out how to encode the
    // keys and which strategy to use: their upload depends on neither, and
    // that work (a sample of scattered keys, mostly) leaves the memory
    // bandwidth the copies need.
    let (uploaded, keyed) = rayon::join(
        || upload_columns(backend, &rows, &definition.build_output_columns(), true),
        || encode_and_choose(backend, definition, &rows, ranges, early, collected, profile),
    );
    let (uploaded, EncodedChoice { staged_keys, plan, keys, raw_keys }) = (uploaded?, keyed?);
    let (encoder, strategy) = (&plan.encoder, plan.choice.strategy);
    let placed = uploaded.placed(strategy.build_space);
    let filter_columns = filter_columns(backend, &rows, &definition.pair_filter_columns(JoinSide::Left), &placed)?;
    let PlacedColumns { placements, to_transform } = placed;
    let with_row_ids =
        needs_row_ids(definition, JoinSide::Left, strategy.build_space, encoder.exactness(), &placements);
    let payloads: Vec<&B::Column> = to_transform.iter().collect();
    let keys_on_backend = match (raw_keys, encoder.raw_codes()) {
        (Some(raw), Some(codes)) => KeyedVector::U32(backend.raw_codes(raw, codes)?),
        _ => upload_keys(backend, encoder, &staged_keys)?,
    };
    planned(&plan);
    let relation = match keys_on_backend {
        KeyedVector::U32(k) => {
            KeyedRelation::U32(transform_build(backend, strategy.algorithm, encoder, &k, &payloads, with_row_ids)?)
        }
        KeyedVector::U64(k) => {
            KeyedRelation::U64(transform_build(backend, strategy.algorithm, encoder, &k, &payloads, with_row_ids)?)
        }
    };
    // Let go while the device transforms, not on the way to the probe
    // partitions.
    staged_keys.release();
    let visited = match definition.tracks_visited_build_rows() {
        true => Some(backend.new_flags(rows.rows())?),
        false => None,
    };
    // Every probe partition reads the build side from here on.
    backend.finish()?;
    timer.done();
    Ok(BuildSide { rows, whole: OnceLock::new(), keys, plan, relation, placements, filter_columns, visited })
}

/// The build-side rows a join emits once every probe partition has finished:
/// unmatched rows of Left and Full joins, LeftSemi, LeftAnti and LeftMark;
/// `admission` let go once the device's part is done.
pub fn finish_build_side<B: JoinBackend>(
    backend: &B,
    definition: &JoinDefinition,
    build: &BuildSide<B>,
    timers: &PhaseTimers,
    limits: OutputLimits,
    mut admission: Admitted,
) -> Result<Vec<RecordBatch>> {
    let Some(visited) = &build.visited else {
        return Ok(vec![]);
    };
    let _timer = timers.materialize.timer();
    let view = build.view();
    let rows = build_side_rows(backend, definition, &view, visited, build.rows(), build.plan.null_aware.summary())?;
    match rows {
        Some(rows) => output_batches(backend, definition, &rows, &view, None, limits.array_values, &mut admission),
        None => Ok(vec![]),
    }
}
