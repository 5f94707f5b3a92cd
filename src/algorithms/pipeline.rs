//! The join pipeline: prepare the build side once, join each probe chunk,
//! then emit what the build side owes once the probe side is exhausted.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use arrow::array::{Array, ArrayRef};
use arrow::record_batch::RecordBatch;
use datafusion::common::{JoinSide, exec_datafusion_err, internal_err};
use datafusion::error::Result;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::metrics::Time;
use rayon::prelude::*;

use super::JoinDefinition;
use super::choice::{self, Choice};
use super::host_rows::HostRows;
use super::materialize::{output_batch, probe_rows_passed_through};
use super::phases::{find_directory_matches, find_matches, transform_build, transform_probe};
use super::residual;
use super::semantics::{ProbeSummary, build_side_rows, each_probe_row_once, resolve_in_key_order, resolve_probe_chunk};
use super::side::{
    ColumnPlacement, PlacedColumns, SideView, columns_held, filter_columns, has_host_columns, place_columns,
    upload_columns,
};
use crate::arrays::concat_arrays;
use crate::backend::{JoinBackend, Space, Transformed, check_candidates};
use crate::keys::{KeyEncoder, KeyExactness, KeyRanges, NormalizedKey, RawKeys, RawSpan};

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

/// What loading a probe chunk needs of its build side. It is known once
/// the build side's strategy is chosen; probe chunks load by it once the
/// build side's host work is done, so that they load while it is
/// transformed.
pub struct ProbePlan {
    encoder: KeyEncoder,
    /// How probe chunks encode their keys to meet the build side's.
    probe_encoder: KeyEncoder,
    choice: Choice,
    null_aware: NullAwareState,
}

/// The build side, collected, encoded and transformed once per join (per
/// partition in `Partitioned` mode), then shared by every probe chunk.
pub struct BuildSide<B: JoinBackend> {
    rows: HostRows,
    /// Every column whole, made when DataFusion's operator needs it.
    whole: OnceLock<RecordBatch>,
    /// The key columns whole, only where something reads them on the host
    /// (verification of hashed keys, null-aware joins); empty otherwise.
    keys: Vec<ArrayRef>,
    plan: Arc<ProbePlan>,
    relation: KeyedRelation<B>,
    placements: Vec<Option<ColumnPlacement<B::Column>>>,
    /// The columns the backend compares for the filter.
    filter_columns: Vec<(usize, B::Column)>,
    visited: Option<B::Flags>,
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

    fn view(&self) -> SideView<'_, B> {
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

/// The values of a side's key expressions on one of its batches.
pub fn evaluate_keys(expressions: &[PhysicalExprRef], batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
    expressions.iter().map(|e| e.evaluate(batch)?.into_array(batch.num_rows())).collect()
}

/// A build side's key columns evaluated on each batch as it was collected,
/// in the batches' order: the evaluation is then spread over the tasks
/// reading the input rather than left to the build side's preparation.
pub type CollectedKeys = Vec<Vec<ArrayRef>>;

/// Batches of a side from which on its keys are evaluated on every core;
/// fewer are evaluated on the calling thread.
const PARALLEL_PIECES: usize = 1024;

/// The key columns of one side, evaluated on each batch the side was staged
/// in. A key column that the join reads nowhere else is never concatenated:
/// its values go from DataFusion's batches straight into the memory their
/// upload reads, encoded on the way.
struct StagedKeys {
    /// The side's row at which each piece starts, ascending.
    starts: Vec<usize>,
    /// The key columns of each piece.
    pieces: Vec<Vec<ArrayRef>>,
    rows: usize,
}

impl StagedKeys {
    fn evaluate(expressions: &[PhysicalExprRef], batches: &[RecordBatch]) -> Result<Self> {
        // A build side of DataFusion's small batches is thousands of them,
        // each a few allocations; a probe chunk's few hundred are not worth
        // handing to other threads.
        let evaluate = |batch: &RecordBatch| evaluate_keys(expressions, batch);
        let pieces = match batches.len() >= PARALLEL_PIECES {
            true => batches.par_iter().with_min_len(PARALLEL_PIECES).map(evaluate).collect::<Result<Vec<_>>>()?,
            false => batches.iter().map(evaluate).collect::<Result<Vec<_>>>()?,
        };
        Ok(Self::of_pieces(pieces, batches))
    }

    /// The keys of `batches`: `collected`, where the side's collection
    /// evaluated them batch by batch, else evaluated here.
    fn collected_or_evaluated(
        expressions: &[PhysicalExprRef],
        batches: &[RecordBatch],
        collected: Option<CollectedKeys>,
    ) -> Result<Self> {
        match collected {
            Some(pieces) if pieces.len() == batches.len() => Ok(Self::of_pieces(pieces, batches)),
            _ => Self::evaluate(expressions, batches),
        }
    }

    fn of_pieces(pieces: Vec<Vec<ArrayRef>>, batches: &[RecordBatch]) -> Self {
        let (mut starts, mut rows) = (Vec::with_capacity(batches.len()), 0);
        for batch in batches {
            starts.push(rows);
            rows += batch.num_rows();
        }
        Self { starts, pieces, rows }
    }

    /// Lets the pieces go on every core: a build side's are thousands of
    /// small allocations, which one thread frees in milliseconds while
    /// every probe partition waits for the build side.
    fn release(self) {
        match self.pieces.len() >= PARALLEL_PIECES {
            true => self.pieces.into_par_iter().with_min_len(PARALLEL_PIECES).for_each(drop),
            false => drop(self.pieces),
        }
    }

    /// Encodes rows `first..first + out.len()`, piece by piece.
    fn encode_rows<K: NormalizedKey>(&self, encoder: &KeyEncoder, first: usize, out: &mut [K]) -> Result<()> {
        self.by_piece(first, out, |keys, offset, out| encoder.encode_rows(keys, offset, out))
    }

    /// The raw bits of rows `first..first + out.len()` of the one key
    /// column, piece by piece, widening `span` to their values.
    fn copy_raw_rows(&self, raw: RawKeys, first: usize, out: &mut [u32], span: &RawSpan) -> Result<()> {
        self.by_piece(first, out, |keys, offset, out| match keys {
            [key] => raw.copy(key.as_ref(), offset, out, span),
            _ => internal_err!("raw keys asked of {} key columns", keys.len()),
        })
    }

    /// The one key column's raw bits moved from where they lie, where the
    /// backend reads them there ([`JoinBackend::upload_values_in_place`]).
    fn raw_in_place<B: JoinBackend>(&self, backend: &B) -> Result<Option<B::Vector<u32>>> {
        let arrays = self.pieces.iter().map(|keys| match keys.as_slice() {
            [key] => Some(key.as_ref()),
            _ => None,
        });
        match arrays.collect::<Option<Vec<&dyn Array>>>() {
            Some(arrays) => backend.upload_values_in_place(&arrays),
            None => Ok(None),
        }
    }

    /// Widens `span` to the one key column's values, read where they lie,
    /// piece by piece on every core.
    fn widen_raw_span(&self, raw: RawKeys, span: &RawSpan) -> Result<()> {
        self.pieces.par_iter().with_min_len(PARALLEL_PIECES / 16).try_for_each(|keys| match keys.as_slice() {
            [key] => raw.widen_span(key.as_ref(), span),
            _ => internal_err!("raw keys asked of {} key columns", keys.len()),
        })
    }

    /// Hands `write` each piece's part of rows `first..first + out.len()`:
    /// the piece's key columns, the part's first row in the piece, and
    /// where in `out` it goes.
    fn by_piece<T>(
        &self,
        first: usize,
        out: &mut [T],
        mut write: impl FnMut(&[ArrayRef], usize, &mut [T]) -> Result<()>,
    ) -> Result<()> {
        // The last piece starting at or before `first`: empty pieces that
        // start at the same row come before it.
        let mut piece = self.starts.partition_point(|&start| start <= first).saturating_sub(1);
        let mut done = 0;
        while done < out.len() {
            let (Some(&start), Some(keys)) = (self.starts.get(piece), self.pieces.get(piece)) else {
                return internal_err!("keys of rows {first}..{} asked of {} rows", first + out.len(), self.rows);
            };
            let offset = first + done - start;
            let len = keys.first().map_or(0, |k| k.len()).saturating_sub(offset).min(out.len() - done);
            write(keys, offset, &mut out[done..done + len])?;
            done += len;
            piece += 1;
        }
        Ok(())
    }

    /// How the one key column's raw bits order, where every piece of it
    /// may go up as they are ([`RawKeys`]).
    fn raw_keys(&self) -> Option<RawKeys> {
        let mut columns = self.pieces.iter().map(|keys| match keys.as_slice() {
            [key] => RawKeys::of_column(key.as_ref()),
            _ => None,
        });
        let raw = columns.next().flatten()?;
        columns.all(|c| c == Some(raw)).then_some(raw)
    }

    /// Whether the first key column holds a NULL.
    fn first_key_has_null(&self) -> bool {
        self.pieces.iter().any(|keys| keys.first().is_some_and(|k| k.logical_null_count() > 0))
    }

    /// The key columns whole; a copy unless the side is one piece.
    fn concatenated(&self) -> Result<Vec<ArrayRef>> {
        if let [keys] = self.pieces.as_slice() {
            return Ok(keys.clone());
        }
        let columns = self.pieces.first().map_or(0, Vec::len);
        (0..columns)
            .map(|c| concat_arrays(&self.pieces.iter().map(|keys| keys[c].as_ref()).collect::<Vec<_>>()))
            .collect()
    }
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
/// the build side and delayed the join's first output (docs/benchmarks.md).
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

/// The normalised keys of a probe chunk in backend memory.
enum KeyedVector<B: JoinBackend> {
    U32(B::Vector<u32>),
    U64(B::Vector<u64>),
}

/// The normalised keys of one side, encoded straight into the memory their
/// upload reads.
fn upload_keys<B: JoinBackend>(backend: &B, encoder: &KeyEncoder, keys: &StagedKeys) -> Result<KeyedVector<B>> {
    let rows = keys.rows;
    Ok(match encoder.key_bits() {
        32 => KeyedVector::U32(backend.upload_with(rows, &|first, out| keys.encode_rows(encoder, first, out))?),
        _ => KeyedVector::U64(backend.upload_with(rows, &|first, out| keys.encode_rows(encoder, first, out))?),
    })
}

/// A probe chunk's keys coded on the backend, where they go up as they lie
/// (a table kept in the backend's transfer memory) and their raw bits code
/// as the build side's do ([`crate::keys::RawCodes`]); `None` otherwise,
/// for the host to encode them.
fn probe_keys_in_place<B: JoinBackend>(
    backend: &B,
    encoder: &KeyEncoder,
    keys: &StagedKeys,
) -> Result<Option<KeyedVector<B>>> {
    let (Some(codes), Some(_)) = (encoder.raw_codes(), keys.raw_keys()) else {
        return Ok(None);
    };
    match keys.raw_in_place(backend)? {
        Some(raw) => Ok(Some(KeyedVector::U32(backend.raw_codes(raw, codes)?))),
        None => Ok(None),
    }
}

/// When a probe chunk's output columns are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeColumns {
    /// Uploaded as the chunk is loaded (those of types the backend holds),
    /// to be transformed with the keys or gathered by row.
    Upload,
    /// Once the chunk's output rows are known: uploaded and gathered by row
    /// when they are at least [`JoinDefinition::probe_device_gather_ratio`]
    /// per probe row, taken on the host otherwise.
    AfterMatching,
}

/// A joined probe chunk's output.
pub struct JoinedChunk {
    pub batches: Vec<RecordBatch>,
    pub probe_columns: ProbeOutput,
}

/// Where a joined chunk's probe output columns came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeOutput {
    /// Gathered on the device (or there were none to place).
    Gathered,
    /// Taken on the host for the output rows only.
    TakenOnHost,
    /// The chunk's own columns, handed on as they came: each of its rows
    /// matched exactly once.
    PassedThrough,
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
    /// Rows per output batch the session asks for.
    batch_rows: usize,
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
    batch_rows: usize,
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
        batch_rows,
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

/// Which output rows a joined chunk settles, in which order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// The chunk's own rows; build-side rows come once every chunk is in
    /// ([`finish_build_side`]).
    ProbeChunk,
    /// The whole probe side of a partition, loaded as one chunk: every
    /// output row of the partition, build-side rows included, in the build
    /// side's key order ([`JoinDefinition::key_order`]).
    KeyOrder,
}

/// Joins a loaded probe chunk with the build side and returns the output
/// rows `settle` asks for. Waits for its work before returning, so that the
/// chunk's memory may be freed on the instance that loaded it.
pub fn join_loaded_chunk<B: JoinBackend>(
    backend: &B,
    definition: &JoinDefinition,
    build: &BuildSide<B>,
    chunk: LoadedChunk<B>,
    timers: &PhaseTimers,
    settle: Settle,
) -> Result<JoinedChunk> {
    if !chunk.loaded_for(build) {
        return internal_err!("GPU join: a probe chunk was loaded for another preparation of the build side");
    }
    let output = match (&build.relation, &chunk.keys) {
        (_, None) => Ok(JoinedChunk { batches: vec![], probe_columns: ProbeOutput::Gathered }),
        (KeyedRelation::U32(relation), Some(KeyedVector::U32(keys))) => {
            join_keyed_chunk(backend, definition, build, relation, &chunk, keys, timers, settle)
        }
        (KeyedRelation::U64(relation), Some(KeyedVector::U64(keys))) => {
            join_keyed_chunk(backend, definition, build, relation, &chunk, keys, timers, settle)
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
    settle: Settle,
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
    let candidates = match &probe_relation {
        Some(probe_relation) => find_matches(backend, build_relation, probe_relation, (build_space, chunk.space))?,
        None => find_directory_matches(backend, build_relation, keys, build_space)?,
    };
    check_candidates(backend.len(&candidates.probe) as u64)?;
    let matches =
        residual::apply(backend, definition, build.plan.encoder.exactness(), &build_view, &probe_view, candidates)?;
    let rows = match settle {
        Settle::ProbeChunk => resolve_probe_chunk(
            backend,
            definition,
            matches,
            chunk.rows(),
            build.visited.as_ref(),
            chunk.keep_probe_order,
        )?,
        Settle::KeyOrder => {
            resolve_in_key_order(backend, definition, &build_view, matches, build.visited.as_ref(), build.rows())?
        }
    };
    // Probe columns not placed yet need no placing if each probe row is
    // once in the output: the chunk's own columns are then the output's.
    let (rows, passed_through) = match (settle, chunk.columns) {
        (Settle::ProbeChunk, ProbeColumns::AfterMatching) if !definition.probe_output_columns().is_empty() => {
            each_probe_row_once(backend, rows, chunk.rows())?
        }
        _ => (rows, false),
    };
    timer.done();

    let _timer = timers.materialize.timer();
    if passed_through {
        let batches =
            probe_rows_passed_through(backend, definition, &rows, &build_view, &chunk.chunk, chunk.batch_rows)?;
        return Ok(JoinedChunk { batches, probe_columns: ProbeOutput::PassedThrough });
    }
    let placed = match chunk.columns {
        ProbeColumns::Upload => None,
        ProbeColumns::AfterMatching => Some(place_after_matching(backend, definition, &chunk.chunk, rows.len)?),
    };
    let probe_view = match &placed {
        Some(placed) => SideView { placements: &placed.placements, ..probe_view },
        None => probe_view,
    };
    let batch = output_batch(backend, definition, &rows, &build_view, Some(&probe_view))?;
    let probe_columns = match placed.is_some_and(|placed| placed.on_host) {
        true => ProbeOutput::TakenOnHost,
        false => ProbeOutput::Gathered,
    };
    Ok(JoinedChunk { batches: vec![batch], probe_columns })
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
    let enough = output_rows as f64 >= definition.probe_device_gather_ratio * chunk.rows() as f64;
    let PlacedColumns { placements, .. } = place_columns(backend, chunk, &columns, enough, Space::Original)?;
    let on_host = !enough && !columns_held(backend, chunk.schema(), &columns).is_empty();
    Ok(PlacedAfterMatching { placements, on_host })
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
    let rows = build_side_rows(backend, definition, &view, visited, build.rows(), build.plan.null_aware.summary())?;
    rows.map(|rows| output_batch(backend, definition, &rows, &view, None)).transpose()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::Int32Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_expr::expressions::Column;

    use super::*;

    /// Keys evaluated on every core come in their batches' order, with the
    /// row each batch starts at, as those evaluated on one thread.
    #[test]
    fn keys_of_many_batches_keep_their_order() -> Result<()> {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int32, false)]));
        let keys: Vec<PhysicalExprRef> = vec![Arc::new(Column::new("k", 0))];
        for count in [PARALLEL_PIECES - 1, 3 * PARALLEL_PIECES + 5] {
            let batches = (0..count as i32)
                .map(|b| {
                    let values = Int32Array::from_iter_values((0..b % 3).map(|i| b * 10 + i));
                    RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(values)])
                })
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let staged = StagedKeys::evaluate(&keys, &batches)?;
            let mut row = 0;
            for ((batch, start), piece) in batches.iter().zip(&staged.starts).zip(&staged.pieces) {
                assert_eq!((*start, piece[0].as_ref()), (row, batch.column(0).as_ref()));
                row += batch.num_rows();
            }
            assert_eq!((staged.pieces.len(), staged.rows), (count, row));
        }
        Ok(())
    }

    /// Keys evaluated as the side was collected are taken one piece per
    /// batch; where their count is not the batches', they are evaluated
    /// again.
    #[test]
    fn collected_keys_are_taken_one_piece_per_batch() -> Result<()> {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int32, false)]));
        let keys: Vec<PhysicalExprRef> = vec![Arc::new(Column::new("k", 0))];
        let batches = [vec![1, 2], vec![3], vec![4, 5, 6]]
            .into_iter()
            .map(|values| RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int32Array::from(values))]))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let collected: CollectedKeys =
            batches.iter().map(|batch| evaluate_keys(&keys, batch)).collect::<Result<_>>()?;
        for given in [Some(collected.clone()), Some(collected[..2].to_vec()), Some(vec![]), None] {
            let staged = StagedKeys::collected_or_evaluated(&keys, &batches, given)?;
            assert_eq!((staged.starts.as_slice(), staged.rows, staged.pieces.len()), ([0, 2, 3].as_slice(), 6, 3));
            for (piece, batch) in staged.pieces.iter().zip(&batches) {
                assert_eq!(piece[0].as_ref(), batch.column(0).as_ref());
            }
        }
        Ok(())
    }
}
