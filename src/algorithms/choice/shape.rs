//! What the cost model knows of a join: sizes and widths observed on the
//! build side, the probe side's size and key range from DataFusion's
//! statistics, and what a sample of build keys says about duplicates and
//! about how many probe rows can match.

/// Rows of the build side whose keys are sampled.
/// Few enough that sampling costs a fraction of a millisecond even when
/// every sampled row misses the caches.
pub const SAMPLE_ROWS: usize = 1 << 12;

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

/// Keys of sampled build rows.
#[derive(Debug, Clone, Default)]
pub struct KeySample {
    /// Rows of the build side the sample was drawn from.
    pub population: usize,
    /// The normalised keys of the sampled rows.
    pub keys: Vec<u64>,
    /// For one integer key column, the sampled rows' non-null values.
    pub values: Option<Vec<i64>>,
}

/// Up to [`SAMPLE_ROWS`] row positions out of `rows`, ascending: one
/// pseudo-random row in each of equal strides, so that neither sorted nor
/// periodic inputs bias the sample much.
pub fn sample_positions(rows: usize) -> Vec<usize> {
    let count = rows.min(SAMPLE_ROWS);
    let mut state = 0x6a6f_696e_u64;
    (0..count)
        .map(|i| {
            let (start, end) = (i * rows / count, (i + 1) * rows / count);
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            start + ((state >> 33) as usize) % (end - start).max(1)
        })
        .collect()
}

/// Estimates from a sample of build keys and, when statistics give one, the
/// range of the probe side's key values (one integer key column).
pub fn estimate_keys(sample: &KeySample, probe_range: Option<(i64, i64)>) -> KeyEstimates {
    let population = sample.population as f64;
    let n = sample.keys.len();
    if n == 0 {
        return KeyEstimates { match_ratio: 0.0, ..KeyEstimates::FOREIGN_KEY };
    }
    let mut keys = sample.keys.clone();
    keys.sort_unstable();
    let equal_pairs: f64 = keys.chunk_by(|a, b| a == b).map(|run| (run.len() * (run.len() - 1) / 2) as f64).sum();
    // Two sampled rows share a key with the probability that two build rows
    // do, so the build rows sharing a row's key are expected to be
    // 1 + (population - 1) * that probability.
    let all_pairs = (n * (n.saturating_sub(1)) / 2).max(1) as f64;
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
        let keys: Vec<u64> = sample_positions(all.len()).into_iter().map(|p| all[p]).collect();
        let values = Some(keys.iter().map(|&k| k as i64).collect());
        KeySample { population: all.len(), keys, values }
    }

    #[test]
    fn sample_positions_are_ascending_distinct_and_in_range() {
        for rows in [0, 1, 5, SAMPLE_ROWS, SAMPLE_ROWS + 1, 3 * SAMPLE_ROWS + 7] {
            let positions = sample_positions(rows);
            assert_eq!(positions.len(), rows.min(SAMPLE_ROWS));
            assert!(positions.windows(2).all(|w| w[0] < w[1]));
            assert!(positions.iter().all(|&p| p < rows));
        }
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
