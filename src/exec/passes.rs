//! Build sides larger than the device: grace-style passes.
//!
//! A build side whose transformed relation would not fit a quarter of the
//! device budget is split on the host, by a hash of its keys, into passes
//! that do; two passes per device may then be resident while partitions
//! move from one to the next. Pass `j` is held by the `j mod n`-th of the
//! `n` devices it is split over: one, or every device of a join whose one
//! build side they share ([`super::spread`]), so that each partition sends
//! a pass's probe rows to the device that holds it. Each probe partition
//! splits its input by the same hash, holds it on the host (in DataFusion's
//! memory pool) and joins it pass by pass. Equal keys hash alike, so every match of a probe row lies in the
//! row's own pass and each probe row is joined exactly once: only joins
//! whose probe chunks join independently, in no relied-on probe order, are
//! split (see [`crate::algorithms::JoinDefinition::splits_into_passes`]).
//! Both sides are split in groups of DataFusion's batches, on every core,
//! so that a pass holds few large pieces rather than a slice of each batch.
//!
//! A partition holds a pass only for the length of one job, never while its
//! output waits for a consumer. A pass no job holds may be evicted for
//! another: at once when no partition needs it any more, and after a short
//! grace when partitions do (they would have it prepared again), so that a
//! partition ahead of the others waits for them briefly rather than
//! evicting their pass, and never waits long on a partition whose consumer
//! has stopped reading.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::array::ArrayRef;
use arrow::compute::{concat_batches, interleave_record_batch};
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::common::hash_utils::{RandomState, create_hashes};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_expr::PhysicalExprRef;
use futures::StreamExt;
use futures::stream::BoxStream;
use rayon::prelude::*;
use tokio::sync::OnceCell;

use super::device_build::DeviceBuild;
use super::device_join::DeviceJoin;
use super::inputs::PartitionInputs;
use super::staging::held_bytes;
use crate::algorithms::BuildSide;
use crate::backend::JoinBackend;

/// Not the key encoder's seed: rows of one pass must still spread over
/// every radix partition of the pass.
const PASS_HASH_STATE: RandomState = RandomState::with_seed(0x7061_7373);

/// Passes resident on each device at once.
const RESIDENT_PASSES: usize = 2;

/// How long a pass that partitions still need may sit idle before it is
/// evicted for another: longer than a partition takes between two jobs,
/// short enough that a partition whose consumer has stopped reading holds
/// the others up only briefly.
const PASS_IDLE_GRACE: Duration = Duration::from_millis(25);

/// How often a partition waiting for room on the device looks again. Jobs
/// let go of a pass by dropping it, wherever they end (a cancelled job ends
/// on its own thread), so waiters look rather than wait for a word.
const PASS_RECHECK: Duration = Duration::from_millis(5);

/// The fewest passes (a power of two) in which each pass's build side takes
/// at most `pass_bytes` of `build_bytes`, and at most `pass_rows` of
/// `build_rows` rows when that is set.
pub(crate) fn pass_count(build_rows: usize, build_bytes: u64, pass_bytes: Option<u64>, pass_rows: usize) -> usize {
    let by_bytes = match pass_bytes {
        Some(pass) if pass > 0 => build_bytes.div_ceil(pass) as usize,
        _ => 1,
    };
    let by_rows = match pass_rows {
        0 => 1,
        rows => build_rows.div_ceil(rows),
    };
    by_bytes.max(by_rows).max(1).next_power_of_two()
}

/// Rows gathered into each split: DataFusion's batches are small, and a
/// pass piece of each would leave every pass in tiny slices, each costing
/// the staging of a probe chunk more than its bytes do.
pub(crate) const SPLIT_ROWS: usize = 1 << 18;

/// The rows of `batches` by pass, in their order within each pass: one
/// batch per pass, slices of one gather.
pub(crate) fn split_by_pass(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    keys: &[PhysicalExprRef],
    passes: usize,
) -> Result<Vec<RecordBatch>> {
    let passes = passes.max(1);
    let pass_of = |hash: u64| (hash >> 32) as usize % passes; // high bits: low ones of some hashes vary little
    let mut pass_by_row = Vec::with_capacity(batches.iter().map(RecordBatch::num_rows).sum());
    let mut hashes = vec![];
    for batch in batches {
        let arrays = keys
            .iter()
            .map(|key| key.evaluate(batch)?.into_array(batch.num_rows()))
            .collect::<Result<Vec<ArrayRef>>>()?;
        hashes.clear();
        hashes.resize(batch.num_rows(), 0);
        create_hashes(&arrays, &PASS_HASH_STATE, &mut hashes)?;
        pass_by_row.extend(hashes.iter().map(|&hash| pass_of(hash) as u32));
    }
    let mut starts = vec![0usize; passes + 1];
    for &pass in &pass_by_row {
        starts[pass as usize + 1] += 1;
    }
    for pass in 0..passes {
        starts[pass + 1] += starts[pass];
    }
    // A counting sort of (batch, row) by pass; one gather then puts the
    // rows in pass order, and each pass is a slice.
    let mut next = starts.clone();
    let mut order = vec![(0, 0); pass_by_row.len()];
    let rows = batches.iter().enumerate().flat_map(|(b, batch)| (0..batch.num_rows()).map(move |row| (b, row)));
    for (&pass, at) in pass_by_row.iter().zip(rows) {
        let slot = &mut next[pass as usize];
        order[*slot] = at;
        *slot += 1;
    }
    let ordered = match batches {
        [] => RecordBatch::new_empty(Arc::clone(schema)),
        _ => interleave_record_batch(&batches.iter().collect::<Vec<_>>(), &order)?,
    };
    Ok(starts.windows(2).map(|w| ordered.slice(w[0], w[1] - w[0])).collect())
}

/// The build side's batches split into `passes` passes of one batch each,
/// on every core of the current rayon pool: groups of batches are split,
/// then each pass's pieces concatenated.
pub(crate) fn split_into_passes(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    keys: &[PhysicalExprRef],
    passes: usize,
) -> Result<Vec<RecordBatch>> {
    let split = in_groups(batches, SPLIT_ROWS)
        .par_iter()
        .map(|group| split_by_pass(schema, group, keys, passes))
        .collect::<Result<Vec<_>>>()?;
    (0..passes)
        .into_par_iter()
        .map(|pass| Ok(concat_batches(schema, split.iter().filter_map(|pieces| pieces.get(pass)))?))
        .collect()
}

/// `batches` in consecutive groups of at least `rows` rows (the last may
/// have fewer).
fn in_groups(batches: &[RecordBatch], rows: usize) -> Vec<&[RecordBatch]> {
    let mut groups = vec![];
    let (mut first, mut in_group) = (0, 0);
    for (i, batch) in batches.iter().enumerate() {
        in_group += batch.num_rows();
        if in_group >= rows {
            groups.push(&batches[first..=i]);
            (first, in_group) = (i + 1, 0);
        }
    }
    if first < batches.len() {
        groups.push(&batches[first..]);
    }
    groups
}

/// A partition's probe rows split by pass, held on the host (in
/// DataFusion's memory pool) until their pass is joined.
pub(super) struct ProbeByPass {
    pub pieces: Vec<Vec<RecordBatch>>,
    pub reservation: MemoryReservation,
}

/// Reads the probe side and splits it into `passes` passes, batches
/// gathered into splits of [`SPLIT_ROWS`] rows.
pub(super) async fn split_probe_by_pass(
    inputs: &PartitionInputs,
    probe_keys: &[PhysicalExprRef],
    passes: usize,
    mut probe: BoxStream<'_, Result<RecordBatch>>,
) -> Result<ProbeByPass> {
    let reservation =
        MemoryConsumer::new(format!("GpuJoinProbePasses[{}]", inputs.partition)).register(inputs.context.memory_pool());
    let mut pieces: Vec<Vec<RecordBatch>> = vec![vec![]; passes];
    let schema = inputs.right.schema();
    let mut split = |batches: &mut Vec<RecordBatch>| -> Result<()> {
        let by_pass = split_by_pass(&schema, batches, probe_keys, passes)?;
        for (pass, piece) in by_pass.into_iter().enumerate().filter(|(_, piece)| piece.num_rows() > 0) {
            reservation.try_grow(held_bytes(&piece))?;
            pieces[pass].push(piece);
        }
        reservation.shrink(batches.drain(..).map(|batch| held_bytes(&batch)).sum());
        Ok(())
    };
    let (mut unsplit, mut unsplit_rows) = (vec![], 0);
    while let Some(batch) = probe.next().await {
        let batch = batch?;
        reservation.try_grow(held_bytes(&batch))?;
        unsplit_rows += batch.num_rows();
        unsplit.push(batch);
        if unsplit_rows >= SPLIT_ROWS {
            split(&mut unsplit)?;
            unsplit_rows = 0;
        }
    }
    split(&mut unsplit)?;
    Ok(ProbeByPass { pieces, reservation })
}

type SharedPass<B> = std::result::Result<Arc<DeviceBuild<B>>, Arc<DataFusionError>>;

/// Where a pass is (or is being) prepared; partitions asking at once share it.
type PassCell<B> = Arc<OnceCell<SharedPass<B>>>;

/// A pass on the device, or being prepared for it.
struct Resident<B: JoinBackend> {
    pass: usize,
    cell: PassCell<B>,
    /// When a look for room first found it idle; cleared when it is used.
    idle_since: Option<Instant>,
}

impl<B: JoinBackend> Resident<B> {
    /// Being prepared, or held by a job.
    fn busy(&self) -> bool {
        Arc::strong_count(&self.cell) > 1
            || match self.cell.get() {
                Some(Ok(build)) => Arc::strong_count(build) > 1,
                Some(Err(_)) => false,
                None => true,
            }
    }
}

/// The build side split into passes, and the passes now on the device.
pub(crate) struct BuildPasses<B: JoinBackend> {
    /// Each pass's build rows on the host.
    pieces: Vec<RecordBatch>,
    /// Per pass, the partitions that may still have probe rows to join
    /// with it.
    needed: Vec<AtomicUsize>,
    resident: Mutex<Vec<Resident<B>>>,
    /// The devices that hold the passes, pass `j` the `j mod n`-th.
    devices: Arc<[Arc<DeviceJoin<B>>]>,
}

impl<B: JoinBackend> BuildPasses<B> {
    pub fn new(pieces: Vec<RecordBatch>, devices: Arc<[Arc<DeviceJoin<B>>]>) -> Self {
        let needed = pieces.iter().map(|_| AtomicUsize::new(0)).collect();
        Self { pieces, needed, resident: Mutex::default(), devices }
    }

    pub fn count(&self) -> usize {
        self.pieces.len()
    }

    /// The device that holds pass `pass`.
    pub fn device_of(&self, pass: usize) -> Result<&Arc<DeviceJoin<B>>> {
        self.devices
            .get(self.holder(pass))
            .ok_or_else(|| DataFusionError::Internal("GPU join: build passes on no device".into()))
    }

    /// The index among [`Self::devices`] of the device holding `pass`.
    fn holder(&self, pass: usize) -> usize {
        pass % self.devices.len().max(1)
    }

    /// A partition's passes, every one needed until the partition has
    /// joined it, found it has no probe rows for it, or stopped.
    pub fn to_join(&self) -> PassesToJoin<'_, B> {
        for needed in &self.needed {
            needed.fetch_add(1, Ordering::Relaxed);
        }
        PassesToJoin { passes: self, remaining: (0..self.count()).collect() }
    }

    /// Pass `pass` on its device, prepared by `prepare` from its build rows
    /// if it is not there. Waits while the device holds as many passes as
    /// it may and none of them can go (see [`Self::resident_cell`]).
    pub async fn acquire<F, Fut>(&self, pass: usize, prepare: F) -> Result<Arc<DeviceBuild<B>>>
    where
        F: FnOnce(RecordBatch) -> Fut,
        Fut: Future<Output = Result<BuildSide<B>>>,
    {
        let piece = self
            .pieces
            .get(pass)
            .cloned()
            .ok_or_else(|| DataFusionError::Internal(format!("GPU join: build pass {pass} does not exist")))?;
        let cell = loop {
            if let Some(cell) = self.resident_cell(pass)? {
                break cell;
            }
            tokio::time::sleep(PASS_RECHECK).await;
        };
        let prepared = cell
            .get_or_init(|| async {
                prepare(piece).await.map(|side| Arc::new(DeviceBuild::new(side))).map_err(Arc::new)
            })
            .await
            .clone();
        if prepared.is_err() {
            self.evict(pass);
        }
        prepared.map_err(DataFusionError::Shared)
    }

    /// The cell of `pass`, made resident if there is room on its device;
    /// `None` while there is none. Room is made by evicting an idle pass of
    /// the same device: at once one that no partition needs any more, after
    /// [`PASS_IDLE_GRACE`] one that partitions still need, which would have
    /// to be prepared again.
    fn resident_cell(&self, pass: usize) -> Result<Option<PassCell<B>>> {
        let mut resident =
            self.resident.lock().map_err(|_| DataFusionError::Internal("GPU join pass lock poisoned".into()))?;
        if let Some(found) = resident.iter_mut().find(|r| r.pass == pass) {
            found.idle_since = None;
            return Ok(Some(Arc::clone(&found.cell)));
        }
        let now = Instant::now();
        resident.retain(|r| !matches!(r.cell.get(), Some(Err(_))));
        for r in resident.iter_mut() {
            match r.busy() {
                true => r.idle_since = None,
                false => _ = r.idle_since.get_or_insert(now),
            }
        }
        let holder = self.holder(pass);
        let on_device: Vec<usize> = (0..resident.len()).filter(|&i| self.holder(resident[i].pass) == holder).collect();
        let mut held = on_device.len();
        if held >= RESIDENT_PASSES {
            let needed = |pass: usize| self.needed.get(pass).is_some_and(|n| n.load(Ordering::Relaxed) > 0);
            let states: Vec<_> =
                on_device.iter().map(|&i| (resident[i].idle_since, needed(resident[i].pass))).collect();
            if let Some(i) = victim(&states, now) {
                resident.swap_remove(on_device[i]);
                held -= 1;
            }
        }
        if held >= RESIDENT_PASSES {
            return Ok(None);
        }
        let cell = Arc::new(OnceCell::new());
        resident.push(Resident { pass, cell: Arc::clone(&cell), idle_since: None });
        Ok(Some(cell))
    }

    fn evict(&self, pass: usize) {
        if let Ok(mut resident) = self.resident.lock() {
            resident.retain(|r| r.pass != pass);
        }
    }

    fn needed_by_one_less(&self, pass: usize) {
        if let Some(needed) = self.needed.get(pass) {
            needed.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn resident_passes(&self) -> Vec<usize> {
        self.resident.lock().map(|resident| resident.iter().map(|r| r.pass).collect()).unwrap_or_default()
    }
}

/// Of resident passes, each idle since when (`None`: busy) and whether a
/// partition still needs it, the one to evict for another pass: an idle
/// pass no one needs, else the one idle longest, once idle for
/// [`PASS_IDLE_GRACE`]; `None` while none may go.
fn victim(resident: &[(Option<Instant>, bool)], now: Instant) -> Option<usize> {
    let evictable = |&(idle_since, needed): &(Option<Instant>, bool)| {
        idle_since.is_some_and(|since| !needed || now.duration_since(since) >= PASS_IDLE_GRACE)
    };
    (0..resident.len()).filter(|&i| evictable(&resident[i])).min_by_key(|&i| (resident[i].1, resident[i].0))
}

/// The passes one partition has still to join; what it has not joined
/// when dropped (it stopped early, or failed) is no longer needed.
pub(crate) struct PassesToJoin<'a, B: JoinBackend> {
    passes: &'a BuildPasses<B>,
    remaining: BTreeSet<usize>,
}

impl<B: JoinBackend> PassesToJoin<'_, B> {
    /// The pass to join next: one already on the device, else the first.
    pub fn next(&self) -> Option<usize> {
        let resident = self.passes.resident_passes();
        let mut remaining = self.remaining.iter().copied();
        remaining.clone().find(|pass| resident.contains(pass)).or_else(|| remaining.next())
    }

    /// `pass` is joined, or has no probe rows: this partition no longer
    /// needs it.
    pub fn done(&mut self, pass: usize) {
        if self.remaining.remove(&pass) {
            self.passes.needed_by_one_less(pass);
        }
    }
}

impl<B: JoinBackend> Drop for PassesToJoin<'_, B> {
    fn drop(&mut self) {
        for pass in std::mem::take(&mut self.remaining) {
            self.passes.needed_by_one_less(pass);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_pass_no_one_needs_goes_first_and_a_needed_one_only_after_the_grace() {
        let now = Instant::now();
        let (within, past) = (now - PASS_IDLE_GRACE / 2, now - PASS_IDLE_GRACE * 2);
        assert_eq!(victim(&[(None, false), (None, true)], now), None, "busy passes stay");
        assert_eq!(victim(&[(Some(within), true), (Some(now), false)], now), Some(1));
        assert_eq!(victim(&[(Some(within), true), (Some(now), true)], now), None, "needed, within the grace");
        assert_eq!(victim(&[(Some(within), true), (Some(past), true)], now), Some(1));
        assert_eq!(victim(&[(Some(past), true), (Some(within), false)], now), Some(1), "no one needs it");
        assert_eq!(victim(&[(Some(within), false), (Some(past), false)], now), Some(1), "idle longest");
    }

    #[test]
    fn every_row_lands_in_one_pass_in_its_order() -> Result<()> {
        use arrow::array::{Array, AsArray, Int32Array, UInt32Array};
        use arrow::datatypes::{DataType, Field, Schema, UInt32Type};
        use datafusion::physical_expr::expressions::col;
        use rand::{Rng, SeedableRng};

        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int32, true),
            Field::new("at", DataType::UInt32, false),
        ]));
        let mut rng = rand::rngs::StdRng::seed_from_u64(17);
        let (mut batches, mut at) = (vec![], 0u32);
        for rows in [0, 1, 777, 4099, 3] {
            // Few distinct keys, a tenth null: duplicates land together.
            let keys: Int32Array = (0..rows).map(|_| rng.random_bool(0.9).then(|| rng.random_range(0..50))).collect();
            let positions = UInt32Array::from_iter_values(at..at + rows);
            at += rows;
            batches.push(RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(keys), Arc::new(positions)])?);
        }
        let keys = [col("k", &schema)?];
        let passes = split_by_pass(&schema, &batches, &keys, 8)?;
        assert_eq!(passes.len(), 8);
        let mut pass_of_key = std::collections::HashMap::new();
        let mut seen = vec![false; at as usize];
        for (pass, piece) in passes.iter().enumerate() {
            let (k, positions) = (piece.column(0).as_primitive::<arrow::datatypes::Int32Type>(), piece.column(1));
            let positions = positions.as_primitive::<UInt32Type>().values();
            assert!(positions.windows(2).all(|w| w[0] < w[1]), "pass {pass} keeps the input order");
            for (row, &position) in positions.iter().enumerate() {
                let key = k.is_valid(row).then(|| k.value(row));
                assert_eq!(*pass_of_key.entry(key).or_insert(pass), pass, "key {key:?} in two passes");
                seen[position as usize] = true;
            }
        }
        assert!(seen.iter().all(|&s| s), "every row in some pass");
        assert_eq!(passes.iter().map(RecordBatch::num_rows).sum::<usize>(), at as usize);
        let whole = split_into_passes(&schema, &batches, &keys, 8)?;
        assert_eq!(whole, passes, "split in groups, the build side's passes are the same");
        Ok(())
    }

    #[test]
    fn groups_hold_at_least_the_rows_asked_but_the_last() {
        let schema = Arc::new(arrow::datatypes::Schema::empty());
        let batch = |rows| {
            let options = arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(rows));
            RecordBatch::try_new_with_options(Arc::clone(&schema), vec![], &options)
        };
        let batches = [3, 4, 1, 9, 2].map(|rows| batch(rows).expect("a batch"));
        let sizes: Vec<usize> = in_groups(&batches, 5).iter().map(|group| group.len()).collect();
        assert_eq!(sizes, [2, 2, 1]);
        assert!(in_groups(&[], 5).is_empty());
    }

    #[test]
    fn pass_counts_are_powers_of_two_within_the_limits() {
        assert_eq!(pass_count(1000, 1 << 20, Some(1 << 22), 0), 1);
        assert_eq!(pass_count(1000, 5 << 20, Some(1 << 20), 0), 8);
        assert_eq!(pass_count(1000, 1 << 20, None, 300), 4);
        assert_eq!(pass_count(1000, 1 << 20, Some(0), 0), 1);
        assert_eq!(pass_count(0, 0, Some(1), 1), 1);
    }
}
