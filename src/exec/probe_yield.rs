//! Whether a probe chunk's output columns are uploaded as it is loaded.
//!
//! A probe chunk's output columns are gathered either on the device, after
//! being uploaded whole, or on the host, from the rows that matched.
//! Uploading pays for every probe row; taking on the host only for the rows
//! emitted, but more per row. Which is cheaper depends on how many output
//! rows each probe row gives, which neither the plan's statistics nor the
//! build side can tell (TPC-H's lineitem joins at scale factor 10 emit 0.1%
//! to 15% of their probe rows; the operator benchmark's join, all of them).
//! So a chunk's columns are placed after its matching (see
//! [`ProbeColumns::AfterMatching`]), and each joined chunk adds its rows
//! here. Once the join's chunks so far have given at least
//! `gpu_join.probe_device_gather_ratio` output rows per probe row, later
//! chunks upload their columns as they are loaded, ahead of the join, as
//! the pipeline overlaps best; so do all chunks of a join that emits every
//! probe row. The decision is taken as a chunk is assembled, and again
//! before it is loaded: chunks staged ahead while the build side was
//! prepared are loaded after the first chunks have been measured.
//!
//! [`ProbeColumns::AfterMatching`]: crate::algorithms::ProbeColumns::AfterMatching

use std::sync::atomic::{AtomicU64, Ordering};

use crate::algorithms::JoinDefinition;

/// The probe and output rows of the chunks one join has joined so far,
/// over all of its partitions.
#[derive(Debug, Default)]
pub(crate) struct ProbeYield {
    /// Output rows per probe row the join gives whatever its chunks hold:
    /// 1 for joins that emit every probe row, 0 for the others.
    known: f64,
    probe_rows: AtomicU64,
    output_rows: AtomicU64,
    /// Probe rows of chunks each of whose rows matched exactly once.
    passed_through_rows: AtomicU64,
}

impl ProbeYield {
    pub fn for_join(definition: &JoinDefinition) -> Self {
        let known = if definition.emits_every_probe_row() { 1.0 } else { 0.0 };
        Self { known, ..Self::default() }
    }

    /// Adds a joined chunk, and whether its probe rows passed through
    /// (each matched exactly once).
    pub fn record(&self, probe_rows: usize, output_rows: usize, passed_through: bool) {
        if passed_through {
            self.passed_through_rows.fetch_add(probe_rows as u64, Ordering::Relaxed);
        }
        self.probe_rows.fetch_add(probe_rows as u64, Ordering::Relaxed);
        self.output_rows.fetch_add(output_rows as u64, Ordering::Relaxed);
    }

    /// Whether the next chunk's output columns should be uploaded as it is
    /// loaded, given the least output rows per probe row (`ratio`) that
    /// pays for it; the first chunks, loaded before any is measured, are
    /// placed after matching unless the join is known to give that many.
    /// A join whose every measured chunk passed its probe rows through
    /// keeps placing them after matching, where the next chunk will likely
    /// pass them through as well, moving none of their columns.
    pub fn columns_to_device(&self, ratio: f64) -> bool {
        if ratio <= self.known {
            return true;
        }
        let probe_rows = self.probe_rows.load(Ordering::Relaxed);
        if probe_rows > 0 && self.passed_through_rows.load(Ordering::Relaxed) == probe_rows {
            return false;
        }
        probe_rows > 0 && self.output_rows.load(Ordering::Relaxed) as f64 >= ratio * probe_rows as f64
    }

    /// Probe rows per chunk, at most `configured`, such that a chunk of the
    /// join's measured yield gives about half of `max_output` rows: a join
    /// that emits many rows per probe row (a many-to-many join) is joined
    /// in chunks whose output is held in bounded memory, rather than each
    /// chunk overflowing and being split after its matching.
    pub fn chunk_rows(&self, configured: usize, max_output: usize) -> usize {
        let probe_rows = self.probe_rows.load(Ordering::Relaxed);
        let output_rows = self.output_rows.load(Ordering::Relaxed);
        if probe_rows == 0 || output_rows <= probe_rows {
            return configured;
        }
        let fitting = (max_output as u128 * probe_rows as u128 / (2 * output_rows as u128)) as usize;
        fitting.clamp(1, configured.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_go_to_the_device_once_enough_probe_rows_match() {
        let seen = ProbeYield::default();
        assert!(!seen.columns_to_device(0.25), "nothing measured yet");
        assert!(seen.columns_to_device(0.0), "0 uploads always");
        seen.record(1000, 100, false);
        assert!(!seen.columns_to_device(0.25));
        seen.record(1000, 500, false);
        assert!(seen.columns_to_device(0.25));
        assert!(!seen.columns_to_device(f64::INFINITY));
    }

    #[test]
    fn chunks_shrink_to_keep_a_many_to_many_join_s_output_bounded() {
        let seen = ProbeYield::default();
        assert_eq!(seen.chunk_rows(4096, 1 << 20), 4096, "nothing measured yet");
        seen.record(1000, 1000, false);
        assert_eq!(seen.chunk_rows(4096, 1 << 20), 4096, "one row per probe row");
        seen.record(1000, 1_999_000, false);
        assert_eq!(seen.chunk_rows(1 << 20, 1 << 20), 524, "1,000 rows per probe row: 2^19 output rows");
        assert_eq!(seen.chunk_rows(100, 1 << 20), 100, "never more than configured");
        seen.record(1, u32::MAX as usize, false);
        assert_eq!(seen.chunk_rows(100, 1), 1, "at least one row");
    }

    #[test]
    fn joins_that_emit_every_probe_row_upload_from_the_first_chunk() {
        let every = ProbeYield { known: 1.0, ..ProbeYield::default() };
        assert!(every.columns_to_device(0.25) && every.columns_to_device(1.0));
        assert!(!every.columns_to_device(1.5), "nothing measured yet");
    }

    #[test]
    fn columns_stay_on_the_host_while_every_chunk_passes_its_probe_rows_through() {
        let seen = ProbeYield::default();
        seen.record(1000, 1000, true);
        seen.record(24, 24, true);
        assert!(!seen.columns_to_device(0.25), "every row passed through");
        assert!(seen.columns_to_device(0.0), "0 uploads always");
        seen.record(1000, 2000, false);
        assert!(seen.columns_to_device(0.25), "a chunk with duplicate matches");
    }
}
