//! Where a probe chunk's output columns come from: the one policy.
//!
//! A probe chunk's output columns are gathered either on the device, after
//! being uploaded whole, or on the host, from the rows that matched.
//! Uploading pays for every probe row; taking on the host only for the rows
//! emitted, but more per row. Which is cheaper depends on how many output
//! rows each probe row gives, which neither the plan's statistics nor the
//! build side can tell (TPC-H's lineitem joins at scale factor 10 emit 0.1%
//! to 15% of their probe rows; the operator benchmark's join, all of them).
//!
//! So the first chunks place their columns after matching
//! ([`ProbeColumns::AfterMatching`]), where each chunk's own output rows
//! decide, and every joined chunk adds its rows to the join's
//! [`ProbeChunkPolicy`]. Once the chunks so far have given at least
//! `gpu_join.probe_device_gather_ratio` output rows per probe row, later
//! chunks upload their columns as they are loaded
//! ([`ProbeColumns::Upload`]), ahead of the join, as the stages overlap
//! best; so do all chunks of a join that emits every probe row. Every one
//! of these decisions is [`upload_pays`].
//!
//! The same measurements size the chunks of a join that emits many rows
//! per probe row ([`ProbeChunkPolicy::chunk_rows`]).

use std::sync::atomic::{AtomicU64, Ordering};

use super::JoinDefinition;

/// When a probe chunk's output columns are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeColumns {
    /// Uploaded as the chunk is loaded (those of types the backend holds),
    /// to be transformed with the keys or gathered by row.
    Upload,
    /// Once the chunk's output rows are known: uploaded and gathered by
    /// row where [`upload_pays`], taken on the host otherwise.
    AfterMatching,
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

/// Whether uploading the output columns of `probe_rows` probe rows that
/// give `output_rows` output rows costs less than taking them on the host:
/// at least `ratio` output rows per probe row.
pub fn upload_pays(ratio: f64, output_rows: u64, probe_rows: u64) -> bool {
    output_rows as f64 >= ratio * probe_rows as f64
}

/// The probe and output rows of the chunks one join has joined so far,
/// over all of its partitions, and what they say of the next chunk.
#[derive(Debug, Default)]
pub struct ProbeChunkPolicy {
    /// `gpu_join.probe_device_gather_ratio`.
    ratio: f64,
    /// Output rows per probe row the join gives whatever its chunks hold:
    /// 1 for joins that emit every probe row, 0 for the others.
    known: f64,
    probe_rows: AtomicU64,
    output_rows: AtomicU64,
    /// Probe rows of chunks each of whose rows matched exactly once.
    passed_through_rows: AtomicU64,
}

impl ProbeChunkPolicy {
    pub fn for_join(definition: &JoinDefinition) -> Self {
        let known = if definition.emits_every_probe_row() { 1.0 } else { 0.0 };
        Self { ratio: definition.probe_device_gather_ratio, known, ..Self::default() }
    }

    /// Adds a joined chunk and where its probe columns came from.
    pub fn record(&self, probe_rows: usize, output_rows: usize, probe_output: ProbeOutput) {
        if probe_output == ProbeOutput::PassedThrough {
            self.passed_through_rows.fetch_add(probe_rows as u64, Ordering::Relaxed);
        }
        self.probe_rows.fetch_add(probe_rows as u64, Ordering::Relaxed);
        self.output_rows.fetch_add(output_rows as u64, Ordering::Relaxed);
    }

    /// When the next chunk's output columns are placed. Before any chunk is
    /// measured, after matching, unless the join is known to give enough
    /// output rows. A join whose every measured chunk passed its probe rows
    /// through keeps placing them after matching, where the next chunk will
    /// likely pass them through as well, moving none of their columns.
    pub fn next_chunk(&self) -> ProbeColumns {
        let upload = if self.ratio <= self.known {
            true
        } else {
            let probe_rows = self.probe_rows.load(Ordering::Relaxed);
            let passed_through = probe_rows > 0 && self.passed_through_rows.load(Ordering::Relaxed) == probe_rows;
            probe_rows > 0
                && !passed_through
                && upload_pays(self.ratio, self.output_rows.load(Ordering::Relaxed), probe_rows)
        };
        match upload {
            true => ProbeColumns::Upload,
            false => ProbeColumns::AfterMatching,
        }
    }

    /// Whether a chunk whose columns were to be placed after matching,
    /// decided before the chunks joined since were measured, uploads them
    /// instead as it is loaded: chunks staged ahead while the build side
    /// was prepared are loaded after the first chunks have been measured.
    pub fn upload_instead(&self, planned: ProbeColumns) -> bool {
        planned == ProbeColumns::AfterMatching && self.next_chunk() == ProbeColumns::Upload
    }

    /// Probe rows per chunk, at most `configured`, such that a chunk of the
    /// join's measured output rows per probe row gives about half of
    /// `max_output` rows: a join that emits many rows per probe row (a
    /// many-to-many join) is joined in chunks whose output is held in
    /// bounded memory, rather than each chunk overflowing and being split
    /// after its matching.
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

    fn policy(ratio: f64, known: f64) -> ProbeChunkPolicy {
        ProbeChunkPolicy { ratio, known, ..ProbeChunkPolicy::default() }
    }

    #[test]
    fn columns_go_to_the_device_once_enough_probe_rows_match() {
        let seen = policy(0.25, 0.0);
        assert_eq!(seen.next_chunk(), ProbeColumns::AfterMatching, "nothing measured yet");
        assert_eq!(policy(0.0, 0.0).next_chunk(), ProbeColumns::Upload, "0 uploads always");
        seen.record(1000, 100, ProbeOutput::Gathered);
        assert_eq!(seen.next_chunk(), ProbeColumns::AfterMatching);
        assert!(!seen.upload_instead(ProbeColumns::AfterMatching));
        seen.record(1000, 500, ProbeOutput::TakenOnHost);
        assert_eq!(seen.next_chunk(), ProbeColumns::Upload);
        assert!(seen.upload_instead(ProbeColumns::AfterMatching));
        assert!(!seen.upload_instead(ProbeColumns::Upload), "already uploading");
    }

    #[test]
    fn uploading_pays_from_the_ratio_on() {
        assert!(upload_pays(0.25, 250, 1000));
        assert!(!upload_pays(0.25, 249, 1000));
        assert!(upload_pays(0.0, 0, 1000), "0 uploads always");
    }

    #[test]
    fn chunks_shrink_to_keep_a_many_to_many_join_s_output_bounded() {
        let seen = policy(0.25, 0.0);
        assert_eq!(seen.chunk_rows(4096, 1 << 20), 4096, "nothing measured yet");
        seen.record(1000, 1000, ProbeOutput::Gathered);
        assert_eq!(seen.chunk_rows(4096, 1 << 20), 4096, "one row per probe row");
        seen.record(1000, 1_999_000, ProbeOutput::Gathered);
        assert_eq!(seen.chunk_rows(1 << 20, 1 << 20), 524, "1,000 rows per probe row: 2^19 output rows");
        assert_eq!(seen.chunk_rows(100, 1 << 20), 100, "never more than configured");
        seen.record(1, u32::MAX as usize, ProbeOutput::Gathered);
        assert_eq!(seen.chunk_rows(100, 1), 1, "at least one row");
    }

    #[test]
    fn joins_that_emit_every_probe_row_upload_from_the_first_chunk() {
        assert_eq!(policy(0.25, 1.0).next_chunk(), ProbeColumns::Upload);
        assert_eq!(policy(1.0, 1.0).next_chunk(), ProbeColumns::Upload);
        assert_eq!(policy(1.5, 1.0).next_chunk(), ProbeColumns::AfterMatching, "nothing measured yet");
    }

    #[test]
    fn columns_stay_on_the_host_while_every_chunk_passes_its_probe_rows_through() {
        let seen = policy(0.25, 0.0);
        seen.record(1000, 1000, ProbeOutput::PassedThrough);
        seen.record(24, 24, ProbeOutput::PassedThrough);
        assert_eq!(seen.next_chunk(), ProbeColumns::AfterMatching, "every row passed through");
        seen.record(1000, 2000, ProbeOutput::Gathered);
        assert_eq!(seen.next_chunk(), ProbeColumns::Upload, "a chunk with duplicate matches");
    }
}
