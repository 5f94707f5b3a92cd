//! Build sides larger than the device: grace-style passes.
//!
//! A build side whose transformed relation would not fit a quarter of the
//! device budget is split on the host, by a hash of its keys, into passes
//! that do; two passes may then be resident while partitions move from one
//! to the next. Each probe partition splits its input by the same hash,
//! holds it on the host (in DataFusion's memory pool) and joins it pass by
//! pass. Equal keys hash alike, so every match of a probe row lies in the
//! row's own pass and each probe row is joined exactly once: only joins
//! whose probe chunks join independently, in no relied-on probe order, are
//! split (see [`crate::algorithms::JoinDefinition::splits_into_passes`]).
//!
//! A partition holds a pass only for the length of one job, never while its
//! output waits for a consumer, so no partition ever waits on another
//! partition's consumer; a pass no job holds may be evicted and prepared
//! again later.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::array::{ArrayRef, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::record_batch::RecordBatch;
use datafusion::common::hash_utils::{RandomState, create_hashes};
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_expr::PhysicalExprRef;
use tokio::sync::OnceCell;

use crate::algorithms::BuildSide;
use crate::backend::JoinBackend;

/// Not the key encoder's seed: rows of one pass must still spread over
/// every radix partition of the pass.
const PASS_HASH_STATE: RandomState = RandomState::with_seed(0x7061_7373);

/// Passes resident on the device at once.
const RESIDENT_PASSES: usize = 2;

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

/// Rows of `batch` by pass, in their order within each pass.
pub(crate) fn split_by_pass(batch: &RecordBatch, keys: &[PhysicalExprRef], passes: usize) -> Result<Vec<RecordBatch>> {
    if passes <= 1 {
        return Ok(vec![batch.clone()]);
    }
    let arrays =
        keys.iter().map(|key| key.evaluate(batch)?.into_array(batch.num_rows())).collect::<Result<Vec<ArrayRef>>>()?;
    let mut hashes = vec![0u64; batch.num_rows()];
    create_hashes(&arrays, &PASS_HASH_STATE, &mut hashes)?;
    // One gather puts the rows in pass order; each pass is then a slice.
    let pass_of = |hash: u64| (hash >> 32) as usize % passes; // high bits: low ones of some hashes vary little
    let mut starts = vec![0usize; passes + 1];
    for &hash in &hashes {
        starts[pass_of(hash) + 1] += 1;
    }
    for pass in 0..passes {
        starts[pass + 1] += starts[pass];
    }
    let mut next = starts.clone();
    let mut order = vec![0u32; batch.num_rows()];
    for (row, &hash) in hashes.iter().enumerate() {
        let slot = &mut next[pass_of(hash)];
        order[*slot] = row as u32;
        *slot += 1;
    }
    let ordered = take_record_batch(batch, &UInt32Array::from(order))?;
    Ok(starts.windows(2).map(|w| ordered.slice(w[0], w[1] - w[0])).collect())
}

type SharedPass<B> = std::result::Result<Arc<BuildSide<B>>, Arc<DataFusionError>>;

/// Where a pass is (or is being) prepared; partitions asking at once share it.
type PassCell<B> = Arc<OnceCell<SharedPass<B>>>;

/// The build side split into passes, and the passes now on the device.
pub(crate) struct BuildPasses<B: JoinBackend> {
    /// Each pass's build rows on the host.
    pieces: Vec<RecordBatch>,
    resident: Mutex<Vec<(usize, PassCell<B>)>>,
}

impl<B: JoinBackend> BuildPasses<B> {
    pub fn new(pieces: Vec<RecordBatch>) -> Self {
        Self { pieces, resident: Mutex::default() }
    }

    pub fn count(&self) -> usize {
        self.pieces.len()
    }

    /// Of the passes a partition still has to join, the one to join next:
    /// one already on the device, else the first.
    pub fn next_pass(&self, remaining: &BTreeSet<usize>) -> Option<usize> {
        let resident = self.resident.lock().ok().map(|r| r.iter().map(|(pass, _)| *pass).collect::<Vec<_>>());
        resident
            .and_then(|resident| remaining.iter().copied().find(|pass| resident.contains(pass)))
            .or_else(|| remaining.first().copied())
    }

    /// Pass `pass` on the device, prepared by `prepare` from its build rows
    /// if it is not there. Waits while the device holds as many passes as
    /// it may and jobs hold all of them.
    pub async fn acquire<F, Fut>(&self, pass: usize, prepare: F) -> Result<Arc<BuildSide<B>>>
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
        let prepared =
            cell.get_or_init(|| async { prepare(piece).await.map(Arc::new).map_err(Arc::new) }).await.clone();
        if prepared.is_err() {
            self.evict(pass);
        }
        prepared.map_err(DataFusionError::Shared)
    }

    /// The cell of `pass`, made resident if room can be found by evicting
    /// passes no job holds; `None` while there is none.
    fn resident_cell(&self, pass: usize) -> Result<Option<PassCell<B>>> {
        let mut resident =
            self.resident.lock().map_err(|_| DataFusionError::Internal("GPU join pass lock poisoned".into()))?;
        if let Some((_, cell)) = resident.iter().find(|(p, _)| *p == pass) {
            return Ok(Some(Arc::clone(cell)));
        }
        // A pass is idle when its preparation has ended and only the cell
        // holds it.
        resident.retain(|(_, cell)| {
            Arc::strong_count(cell) > 1
                || match cell.get() {
                    Some(Ok(build)) => Arc::strong_count(build) > 1,
                    Some(Err(_)) => false,
                    None => true,
                }
        });
        if resident.len() >= RESIDENT_PASSES {
            return Ok(None);
        }
        let cell = Arc::new(OnceCell::new());
        resident.push((pass, Arc::clone(&cell)));
        Ok(Some(cell))
    }

    fn evict(&self, pass: usize) {
        if let Ok(mut resident) = self.resident.lock() {
            resident.retain(|(p, _)| *p != pass);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_counts_are_powers_of_two_within_the_limits() {
        assert_eq!(pass_count(1000, 1 << 20, Some(1 << 22), 0), 1);
        assert_eq!(pass_count(1000, 5 << 20, Some(1 << 20), 0), 8);
        assert_eq!(pass_count(1000, 1 << 20, None, 300), 4);
        assert_eq!(pass_count(1000, 1 << 20, Some(0), 0), 1);
        assert_eq!(pass_count(0, 0, Some(1), 1), 1);
    }
}
