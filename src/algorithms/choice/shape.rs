//! What the cost model knows of a join: sizes and widths observed on the
//! build side, the probe side's size and key range from DataFusion's
//! statistics, and what a sample of build keys says about duplicates and
//! about how many probe rows can match.

/// Blocks of consecutive build rows whose keys are sampled. Reading a block
/// costs about what reading one row does (one cache line, one page), so
/// blocks give many rows for few misses: the whole sample costs tens of
/// microseconds even when every block misses the caches and the TLB.
pub const SAMPLE_BLOCKS: usize = 256;
/// Rows in each sampled block.
pub const BLOCK_ROWS: usize = 8;
/// Rows a sample reads.
pub const SAMPLE_ROWS: usize = SAMPLE_BLOCKS * BLOCK_ROWS;

/// The join as the cost model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct JoinShape {
    pub build_rows: usize,
    pub probe_rows: usize,
    /// Bytes of a normalised key (4 or 8).
    pub key_bytes: u32,
    pub partition_passes: u32,
    pub sort_passes: u32,
    /// Bytes per value of each column the device gathers, per side.
    pub build_payloads: Vec<u32>,
    pub probe_payloads: Vec<u32>,
    /// Sides whose transform carries row ids whatever the pattern (keys
    /// verified on the host, filters, columns the device does not hold).
    pub row_ids_anyway: (bool, bool),
    pub keys: KeyEstimates,
}

impl JoinShape {
    /// Matched pairs the join is expected to produce.
    pub fn output_rows(&self) -> f64 {
        self.probe_rows as f64 * self.keys.match_ratio * self.keys.matches_per_match
    }
}

/// What the keys let us expect of the match.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeyEstimates {
    /// Share of probe rows with at least one match.
    pub match_ratio: f64,
    /// Build rows a matching probe row meets: the run of equal build keys
    /// a build row is in, on average over build rows.
    pub matches_per_match: f64,
}

impl KeyEstimates {
    /// A foreign-key join: every probe row meets one build row.
    pub const FOREIGN_KEY: Self = Self { match_ratio: 1.0, matches_per_match: 1.0 };
}

/// The rows a sample reads, ascending, and the block each was read in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SampleRows {
    pub positions: Vec<usize>,
    pub blocks: Vec<u32>,
}

/// The rows to sample out of `rows`: every row of a side of at most
/// [`SAMPLE_ROWS`] (each its own block), else [`SAMPLE_BLOCKS`] distinct
/// aligned blocks of [`BLOCK_ROWS`] rows drawn uniformly. Rows of two blocks
/// are then two rows drawn apart at random, whatever order the side is in;
/// blocks spread evenly over strides would seldom meet a run of equal keys
/// in a sorted side shorter than a stride.
pub fn sample_rows(rows: usize) -> SampleRows {
    if rows <= SAMPLE_ROWS {
        return SampleRows { positions: (0..rows).collect(), blocks: (0..rows as u32).collect() };
    }
    let slots = (rows / BLOCK_ROWS) as u128;
    let mut state = 0x6a6f_696e_u64;
    let mut starts: Vec<usize> = Vec::with_capacity(SAMPLE_BLOCKS);
    // More slots than blocks: redrawing the few repeated ones ends soon.
    while starts.len() < SAMPLE_BLOCKS {
        for _ in starts.len()..SAMPLE_BLOCKS {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            // A multiply and a shift, where a division would cost more than
            // the read.
            starts.push(((u128::from(state >> 32) * slots) >> 32) as usize * BLOCK_ROWS);
        }
        starts.sort_unstable();
        starts.dedup();
    }
    let mut sample = SampleRows::default();
    for (block, first) in starts.into_iter().enumerate() {
        sample.positions.extend(first..first + BLOCK_ROWS);
        sample.blocks.extend([block as u32; BLOCK_ROWS]);
    }
    sample
}

/// Keys of sampled build rows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeySample {
    /// Rows of the build side with a key that can match, estimated from the
    /// sample's share of them.
    pub population: usize,
    /// The normalised keys of the sampled rows that can match.
    pub keys: Vec<u64>,
    /// The block each of `keys` was read in.
    pub blocks: Vec<u32>,
    /// For one integer key column, the sampled rows' non-null values.
    pub values: Option<Vec<i64>>,
}

impl KeySample {
    /// The sample of a side of `rows` rows read at `sampled`: `keys` in the
    /// same order, `None` for a key that matches nothing (NULL).
    pub fn new(
        rows: usize,
        sampled: &SampleRows,
        keys: impl IntoIterator<Item = Option<u64>>,
        values: Option<Vec<i64>>,
    ) -> Self {
        let (keys, blocks): (Vec<u64>, Vec<u32>) =
            keys.into_iter().zip(&sampled.blocks).filter_map(|(key, &block)| Some((key?, block))).unzip();
        let population = match sampled.positions.len() {
            0 => 0,
            read => (rows as f64 * keys.len() as f64 / read as f64) as usize,
        };
        Self { population, keys, blocks, values }
    }
}

/// Estimates from a sample of build keys and, when statistics give one, the
/// range of the probe side's key values (one integer key column).
pub fn estimate_keys(sample: &KeySample, probe_range: Option<(i64, i64)>) -> KeyEstimates {
    let population = sample.population as f64;
    let n = sample.keys.len();
    if n == 0 {
        return KeyEstimates { match_ratio: 0.0, ..KeyEstimates::FOREIGN_KEY };
    }
    // Rows of one block are neighbours: sorted or clustered inputs make
    // their keys alike more often than two rows picked apart, so only pairs
    // read in different blocks estimate how often two build rows share a key.
    let pairs = |run: usize| (run * run.saturating_sub(1) / 2) as f64;
    let mut tagged: Vec<(u64, u32)> = sample.keys.iter().copied().zip(sample.blocks.iter().copied()).collect();
    tagged.sort_unstable();
    let equal_pairs: f64 = tagged
        .chunk_by(|a, b| a.0 == b.0)
        .map(|run| pairs(run.len()) - run.chunk_by(|a, b| a.1 == b.1).map(|same| pairs(same.len())).sum::<f64>())
        .sum();
    let within_blocks: f64 = sample.blocks.chunk_by(|a, b| a == b).map(|block| pairs(block.len())).sum();
    let all_pairs = (pairs(n) - within_blocks).max(1.0);
    // Two rows share a key with the probability that two build rows do, so
    // the build rows sharing a row's key are expected to be
    // 1 + (population - 1) * that probability.
    let matches_per_match = (1.0 + (population - 1.0).max(0.0) * equal_pairs / all_pairs).max(1.0);
    let match_ratio = match (&sample.values, probe_range) {
        (Some(values), Some((low, high))) if !values.is_empty() && low <= high => {
            range_match_ratio(values, population / matches_per_match, (low, high))
        }
        _ => 1.0,
    };
    KeyEstimates { match_ratio, matches_per_match }
}

/// Probe keys spread evenly over `probe` meet the distinct build keys
/// inside it: the sampled share of build rows in the range, times the
/// distinct build keys, over the range's width. Only dense build keys (ids,
/// dates) make that assumption sound; sparse ones (hashes, random ids)
/// leave the usual assumption that every probe key has a match.
fn range_match_ratio(values: &[i64], distinct: f64, (low, high): (i64, i64)) -> f64 {
    let (min, max) = values.iter().fold((i64::MAX, i64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let build_width = (max as f64 - min as f64) + 1.0;
    if distinct / build_width < 1.0 / 16.0 {
        return 1.0;
    }
    let inside = values.iter().filter(|&&v| low <= v && v <= high).count() as f64 / values.len() as f64;
    let probe_width = (high as f64 - low as f64) + 1.0;
    (inside * distinct / probe_width).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_of(all: &[u64]) -> KeySample {
        let rows = sample_rows(all.len());
        let keys: Vec<u64> = rows.positions.iter().map(|&p| all[p]).collect();
        let values = Some(keys.iter().map(|&k| k as i64).collect());
        KeySample::new(all.len(), &rows, keys.into_iter().map(Some), values)
    }

    #[test]
    fn sample_rows_are_ascending_distinct_in_range_and_in_blocks() {
        for rows in [0, 1, 5, SAMPLE_ROWS, SAMPLE_ROWS + 1, 3 * SAMPLE_ROWS + 7, 1 << 24] {
            let sample = sample_rows(rows);
            assert_eq!(sample.positions.len(), rows.min(SAMPLE_ROWS));
            assert_eq!(sample.blocks.len(), sample.positions.len());
            assert!(sample.positions.windows(2).all(|w| w[0] < w[1]));
            assert!(sample.positions.iter().all(|&p| p < rows));
            assert!(sample.blocks.windows(2).all(|w| w[0] <= w[1]));
        }
    }

    #[test]
    fn sorted_keys_are_judged_by_rows_of_different_blocks() {
        let rows = 1u64 << 22;
        // Runs of two: a block's neighbours share keys, rows apart do not.
        let pairs: Vec<u64> = (0..rows).map(|i| i / 2).collect();
        let estimate = estimate_keys(&sample_of(&pairs), None);
        assert!(estimate.matches_per_match < 4.0, "{estimate:?}");
        // 1,000 keys in runs of 4,194 rows, shorter than 1/256 of the side.
        let runs: Vec<u64> = (0..rows).map(|i| i * 1000 / rows).collect();
        let estimate = estimate_keys(&sample_of(&runs), None);
        let per_key = rows as f64 / 1000.0;
        assert!(estimate.matches_per_match > per_key / 3.0, "{estimate:?}");
    }

    #[test]
    fn null_keys_are_left_out_of_the_sample_and_its_population() {
        let sampled = sample_rows(4);
        let sample = KeySample::new(4, &sampled, [Some(7), None, Some(7), None], None);
        assert_eq!(
            (sample.population, sample.keys.as_slice(), sample.blocks.as_slice()),
            (2, &[7, 7][..], &[0, 2][..])
        );
        assert_eq!(estimate_keys(&sample, None).matches_per_match, 2.0);
    }

    #[test]
    fn unique_keys_look_like_a_foreign_key_join() {
        let keys: Vec<u64> = (0..1u64 << 20).map(|k| k.wrapping_mul(0x9E37_79B9) % (1 << 20)).collect();
        let sample = sample_of(&keys);
        let estimate = estimate_keys(&sample, Some((0, (1 << 20) - 1)));
        assert!(estimate.matches_per_match < 1.5, "{estimate:?}");
        assert!(estimate.match_ratio > 0.9, "{estimate:?}");
    }

    #[test]
    fn few_distinct_keys_show_long_runs() {
        let keys: Vec<u64> = (0..1u64 << 20).map(|i| (i * 7919) % 1000).collect();
        let sample = sample_of(&keys);
        let estimate = estimate_keys(&sample, Some((0, 999)));
        let per_key = keys.len() as f64 / 1000.0;
        assert!((estimate.matches_per_match / per_key - 1.0).abs() < 0.2, "{estimate:?}");
        assert!(estimate.match_ratio > 0.9, "{estimate:?}");
    }

    #[test]
    fn a_probe_range_holding_few_build_keys_means_few_matches() {
        // An eighth of the build keys lie in the probe side's range.
        let rows = 1u64 << 20;
        let keys: Vec<u64> = (0..rows).map(|k| if k % 8 == 0 { k / 8 } else { k + rows }).collect();
        let sample = sample_of(&keys);
        let estimate = estimate_keys(&sample, Some((0, rows as i64 - 1)));
        assert!((estimate.match_ratio - 0.125).abs() < 0.03, "{estimate:?}");
    }

    #[test]
    fn sparse_keys_keep_the_every_key_matches_assumption() {
        let keys: Vec<u64> = (0..1u64 << 16).map(|k| k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 2).collect();
        let sample = sample_of(&keys);
        assert_eq!(estimate_keys(&sample, Some((0, 1000))).match_ratio, 1.0);
        assert_eq!(estimate_keys(&KeySample::default(), None).match_ratio, 0.0);
    }
}
