//! What the primitives cost on one device: measured once, on the device,
//! and kept on disk, so that `algorithm = auto` weighs the strategies of a
//! join by this device's own figures rather than by another machine's.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use arrow::array::{ArrayRef, UInt32Array, UInt64Array};
use datafusion::common::exec_datafusion_err;
use datafusion::error::Result;

use crate::backend::{JoinBackend, PartitionSpec, SortSpec, Space, Transformed, cache_dir};

/// Rows of the relations the profile is measured on: large enough that
/// launches do not dominate, small enough to take well under a second.
pub const PROFILE_ROWS: usize = 1 << 22;

/// Costs in nanoseconds. Radix passes cost a fixed part per row and a part
/// per byte the row carries; gathers from the transformed relation cost per
/// byte, gathers by row id per value, more as their source outgrows the
/// caches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostProfile {
    pub partition_row_ns: f64,
    pub partition_byte_ns: f64,
    pub sort_row_ns: f64,
    pub sort_byte_ns: f64,
    /// Per input row and matched pair of the hash match.
    pub hash_row_ns: f64,
    /// One step of a row through a run of equal keys in a hash table.
    pub hash_step_ns: f64,
    /// Per input row of one merge-path search.
    pub merge_row_ns: f64,
    /// Per pair written by the load-balanced expansion.
    pub merge_pair_ns: f64,
    /// Per probe row of a directory join's search.
    pub directory_row_ns: f64,
    /// Per byte gathered from a transformed (clustered) column.
    pub clustered_byte_ns: f64,
    /// Per value gathered by row id from a column of 4 MiB, 64 MiB and
    /// 256 MiB.
    pub random_value_ns: [f64; 3],
}

/// The source sizes `random_value_ns` was measured at.
pub const RANDOM_SOURCE_BYTES: [f64; 3] = [4.0 * (1 << 20) as f64, 64.0 * (1 << 20) as f64, 256.0 * (1 << 20) as f64];

impl CostProfile {
    const NAMES: [&'static str; 13] = [
        "partition_row_ns",
        "partition_byte_ns",
        "sort_row_ns",
        "sort_byte_ns",
        "hash_row_ns",
        "hash_step_ns",
        "merge_row_ns",
        "merge_pair_ns",
        "directory_row_ns",
        "clustered_byte_ns",
        "random_value_ns_4mib",
        "random_value_ns_64mib",
        "random_value_ns_256mib",
    ];

    fn values(&self) -> [f64; 13] {
        let [r0, r1, r2] = self.random_value_ns;
        [
            self.partition_row_ns,
            self.partition_byte_ns,
            self.sort_row_ns,
            self.sort_byte_ns,
            self.hash_row_ns,
            self.hash_step_ns,
            self.merge_row_ns,
            self.merge_pair_ns,
            self.directory_row_ns,
            self.clustered_byte_ns,
            r0,
            r1,
            r2,
        ]
    }

    fn from_values(v: [f64; 13]) -> Self {
        Self {
            partition_row_ns: v[0],
            partition_byte_ns: v[1],
            sort_row_ns: v[2],
            sort_byte_ns: v[3],
            hash_row_ns: v[4],
            hash_step_ns: v[5],
            merge_row_ns: v[6],
            merge_pair_ns: v[7],
            directory_row_ns: v[8],
            clustered_byte_ns: v[9],
            random_value_ns: [v[10], v[11], v[12]],
        }
    }

    /// A gather by row id of one value from a column of `source_bytes`,
    /// interpolated between the measured sizes on a log scale.
    pub fn random_value_ns(&self, source_bytes: f64) -> f64 {
        let x = source_bytes.max(1.0).log2();
        let points: Vec<(f64, f64)> = RANDOM_SOURCE_BYTES.iter().map(|b| b.log2()).zip(self.random_value_ns).collect();
        if x <= points[0].0 {
            return points[0].1;
        }
        for pair in points.windows(2) {
            let ((x0, y0), (x1, y1)) = (pair[0], pair[1]);
            if x <= x1 {
                return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
            }
        }
        points[points.len() - 1].1
    }

    /// `name value` lines, after a line naming the device.
    pub fn to_text(&self, device: &str) -> String {
        let mut text = format!("device {device}\n");
        for (name, value) in Self::NAMES.iter().zip(self.values()) {
            text.push_str(&format!("{name} {value}\n"));
        }
        text
    }

    /// The profile in `text` if it was measured on `device` and is whole.
    pub fn from_text(text: &str, device: &str) -> Option<Self> {
        let mut lines = text.lines();
        if lines.next()?.strip_prefix("device ")? != device {
            return None;
        }
        let read: HashMap<&str, f64> = lines
            .filter_map(|line| line.split_once(' '))
            .filter_map(|(name, value)| Some((name, value.parse().ok()?)))
            .collect();
        let mut values = [0.0; 13];
        for (slot, name) in values.iter_mut().zip(Self::NAMES) {
            *slot = *read.get(name).filter(|v| v.is_finite() && **v >= 0.0)?;
        }
        Some(Self::from_values(values))
    }
}

/// A device's cost profile as asked for: `None` for backends without one,
/// an error where it could not be measured.
pub type DeviceProfile = Option<std::result::Result<CostProfile, String>>;

/// The profile of the device `backend` runs on: measured the first time
/// this process asks (other asks wait for it), unless a process measured it
/// before and left it on disk. `None` for backends without one. A failed
/// measurement (the device full, say) is not kept: the next ask measures
/// again.
pub fn device_profile<B: JoinBackend>(backend: &B) -> DeviceProfile {
    /// A device's profile once measured; asks wait on its lock meanwhile.
    type Slot = Arc<Mutex<Option<CostProfile>>>;
    static PROFILES: OnceLock<Mutex<HashMap<String, Slot>>> = OnceLock::new();
    let device = backend.device_label()?;
    let slot = {
        let mut profiles = PROFILES.get_or_init(Mutex::default).lock().ok()?;
        Arc::clone(profiles.entry(device.clone()).or_default())
    };
    let Ok(mut profile) = slot.lock() else {
        return Some(Err("the cost profile's lock is poisoned".to_string()));
    };
    if let Some(profile) = *profile {
        return Some(Ok(profile));
    }
    let measured = load_or_measure(backend, &device);
    if let Ok(measured) = measured {
        *profile = Some(measured);
    }
    Some(measured)
}

fn profile_path(device: &str) -> Option<PathBuf> {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    device.hash(&mut hasher);
    Some(cache_dir()?.join(format!("profile-{:016x}.txt", hasher.finish())))
}

fn load_or_measure<B: JoinBackend>(backend: &B, device: &str) -> std::result::Result<CostProfile, String> {
    let path = profile_path(device);
    if let Some(profile) =
        path.as_ref().and_then(|p| std::fs::read_to_string(p).ok()).and_then(|t| CostProfile::from_text(&t, device))
    {
        return Ok(profile);
    }
    let started = Instant::now();
    // On an instance of its own: the join that asked may be cancelled, or
    // count allocations against its own limits.
    let measured = backend.detached().and_then(|detached| measure(&detached, PROFILE_ROWS));
    let profile = measured.map_err(|e| format!("measuring the device's cost profile: {e}"))?;
    log::info!("gpu_join: measured the cost profile of {device} in {:.0?}: {profile:?}", started.elapsed());
    // A cache that cannot be written only means measuring again next time.
    if let Some(path) = path {
        let written = path.parent().map_or(Ok(()), std::fs::create_dir_all).and_then(|_| {
            let partial = path.with_extension(format!("{}.partial", std::process::id()));
            std::fs::write(&partial, profile.to_text(device))?;
            std::fs::rename(&partial, &path)
        });
        if let Err(e) = written {
            log::debug!("gpu_join: the cost profile was not cached at {}: {e}", path.display());
        }
    }
    Ok(profile)
}

/// SplitMix64: reproducible inputs without a random-number dependency.
struct Mixer(u64);

impl Mixer {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> u32 {
        (self.next() % n.max(1) as u64) as u32
    }
}

/// Best of three runs after one to warm up, in nanoseconds.
fn time<B: JoinBackend, T>(backend: &B, mut run: impl FnMut() -> Result<T>) -> Result<f64> {
    let mut best = f64::INFINITY;
    for attempt in 0..4 {
        backend.finish()?;
        let start = Instant::now();
        let output = run()?;
        backend.finish()?;
        let elapsed = start.elapsed().as_secs_f64() * 1e9;
        drop(output);
        if attempt > 0 {
            best = best.min(elapsed);
        }
    }
    Ok(best)
}

fn per(total_ns: f64, units: f64) -> f64 {
    (total_ns / units.max(1.0)).max(0.0)
}

/// Measures the primitives on relations of `rows` rows (more for the
/// gathers by row id, whose cost depends on their source's size).
pub fn measure<B: JoinBackend>(backend: &B, rows: usize) -> Result<CostProfile> {
    let rows = rows.max(1 << 10);
    let n = rows as f64;
    let mut mixer = Mixer(0x6a6f_696e);
    // A foreign-key join: unique build keys, probe keys drawn from them.
    let mut build_keys: Vec<u32> = (0..rows as u32).collect();
    for i in (1..rows).rev() {
        build_keys.swap(i, mixer.below(i + 1) as usize);
    }
    let probe_keys: Vec<u32> = (0..rows).map(|_| mixer.below(rows)).collect();
    let build = backend.upload(&build_keys)?;
    let probe = backend.upload(&probe_keys)?;
    let narrow: ArrayRef = Arc::new(UInt32Array::from_iter_values(0..rows as u32));
    let wide: ArrayRef = Arc::new(UInt64Array::from_iter_values(0..rows as u64));
    let (narrow, wide) = (backend.upload_column(&narrow)?, backend.upload_column(&wide)?);

    let partition_spec = PartitionSpec::for_build_rows(rows, backend.partition_target_rows());
    let value_bits = u32::BITS - (rows as u32 - 1).leading_zeros();
    let sort_spec = SortSpec::for_value_bits::<u32>(value_bits);
    let radix_rates = |passes: u32, keys_only: f64, with_payloads: f64| {
        // Keys only move 4 bytes a row; with a u64 and a u32 payload, 16.
        let per_row_pass = |t: f64| per(t, n * passes as f64);
        let byte = ((per_row_pass(with_payloads) - per_row_pass(keys_only)) / 12.0).max(0.0);
        ((per_row_pass(keys_only) - 4.0 * byte).max(0.0), byte)
    };
    let partition_passes = crate::backend::radix_pass_count(partition_spec.digit_bits());
    let (partition_row_ns, partition_byte_ns) = radix_rates(
        partition_passes,
        time(backend, || backend.partition(&build, &[], false, partition_spec))?,
        time(backend, || backend.partition(&build, &[&wide, &narrow], false, partition_spec))?,
    );
    let sort_passes = crate::backend::radix_pass_count(sort_spec.digit_bits());
    let (sort_row_ns, sort_byte_ns) = radix_rates(
        sort_passes,
        time(backend, || backend.sort(&build, &[], false, sort_spec))?,
        time(backend, || backend.sort(&build, &[&wide, &narrow], false, sort_spec))?,
    );

    let spaces = (Space::Transformed, Space::Transformed);
    let partitioned = |keys| backend.partition(keys, &[], false, partition_spec);
    let sorted = |keys| backend.sort(keys, &[], false, sort_spec);
    let (build_p, probe_p) = (partitioned(&build)?, partitioned(&probe)?);
    // A join of one probe chunk: the build side's tables, then the match.
    let hash_join = |build: &Transformed<B, u32>, probe: &Transformed<B, u32>| {
        backend.hash_match(build, &backend.hash_tables(build)?, probe, spaces)
    };
    let hash_row_ns = per(time(backend, || hash_join(&build_p, &probe_p))?, 3.0 * n);
    let (build_s, probe_s) = (sorted(&build)?, sorted(&probe)?);
    let merge_row_ns = per(time(backend, || backend.merge_match(&build_s, &probe_s, spaces))?, 2.0 * n);
    let directory = backend.directory(&build_s, 1 << value_bits)?;
    let directory_row_ns =
        per(time(backend, || backend.directory_match(&build_s, &directory, &probe, Space::Transformed))?, n);
    drop((build_p, probe_p, build_s, probe_s, directory));

    // Long runs of equal build keys: `run` build rows per key, a probe row
    // per key and then some, so that every probe row walks a whole run.
    let distinct = 256usize;
    let run = (rows / 8 / distinct).max(1);
    let dup_build: Vec<u32> = (0..distinct * run).map(|i| (i % distinct) as u32).collect();
    let dup_probe: Vec<u32> = (0..1024).map(|i| (i % distinct) as u32).collect();
    let (dup_build, dup_probe) = (backend.upload(&dup_build)?, backend.upload(&dup_probe)?);
    let pairs = (1024 * run) as f64;
    let dup_rows = (distinct * run + 1024) as f64;
    let dup_spec = PartitionSpec::for_build_rows(distinct * run, backend.partition_target_rows());
    let (build_p, probe_p): (Transformed<B, u32>, Transformed<B, u32>) =
        (backend.partition(&dup_build, &[], false, dup_spec)?, backend.partition(&dup_probe, &[], false, dup_spec)?);
    let dup_hash = time(backend, || hash_join(&build_p, &probe_p))?;
    let hash_step_ns = per(dup_hash - hash_row_ns * (dup_rows + pairs), dup_rows * (run as f64 - 1.0));
    let dup_sort = SortSpec::for_value_bits::<u32>(8);
    let (build_s, probe_s) =
        (backend.sort(&dup_build, &[], false, dup_sort)?, backend.sort(&dup_probe, &[], false, dup_sort)?);
    let dup_merge = time(backend, || backend.merge_match(&build_s, &probe_s, spaces))?;
    let merge_pair_ns = per(dup_merge - 2.0 * merge_row_ns * dup_rows, pairs);
    drop((build_p, probe_p, build_s, probe_s));

    // Matches gathered from a transformed relation fall within one
    // partition's rows at a time, in no particular order within it.
    let window = partition_spec.partitions().max(1);
    let window_rows = rows.div_ceil(window).max(1);
    let clustered: Vec<u32> = (0..rows)
        .map(|i| ((i / window_rows * window_rows) as u32 + mixer.below(window_rows)).min(rows as u32 - 1))
        .collect();
    let clustered = backend.upload(&clustered)?;
    let clustered = time(backend, || backend.gather_column(&narrow, &clustered, false))?
        + time(backend, || backend.gather_column(&wide, &clustered, false))?;
    let clustered_byte_ns = per(clustered, 12.0 * n);
    let mut random_value_ns = [0.0; 3];
    for (slot, bytes) in random_value_ns.iter_mut().zip(RANDOM_SOURCE_BYTES) {
        let source_rows = (bytes / 4.0) as usize;
        let source: ArrayRef = Arc::new(UInt32Array::from_iter_values(0..source_rows as u32));
        let source = backend.upload_column(&source)?;
        let positions: Vec<u32> = (0..rows).map(|_| mixer.below(source_rows)).collect();
        let positions = backend.upload(&positions)?;
        *slot = per(time(backend, || backend.gather_column(&source, &positions, false))?, n);
    }
    let profile = CostProfile {
        partition_row_ns,
        partition_byte_ns,
        sort_row_ns,
        sort_byte_ns,
        hash_row_ns,
        hash_step_ns,
        merge_row_ns,
        merge_pair_ns,
        directory_row_ns,
        clustered_byte_ns,
        random_value_ns,
    };
    if profile.values().iter().any(|v| !v.is_finite()) {
        return Err(exec_datafusion_err!("the cost profile holds a value that is not finite: {profile:?}"));
    }
    Ok(profile)
}
