//! Kernel-level benchmark of the GPU join on the GFTR paper's workload, with
//! inputs and outputs resident in device memory.
//!
//! R holds 2^27 dense shuffled primary keys, S 2^28 uniform foreign keys; one
//! payload column per side (narrow) or two (wide); 4-byte keys and payloads
//! unless stated. One more workload has many duplicates: 2^24 build rows
//! whose keys take 1,000 distinct values, and 2^12 probe rows over them.
//! Each algorithm's time is the sum of transform (partition or sort both
//! sides), match (matched positions) and materialize (gather every payload
//! column of both sides). Criterion measures the total; the table printed
//! at the end gives the median of each phase over the measured runs.
//!
//! ```text
//! cargo bench --bench kernels [-- --quick]       # GPU machine only
//! GPU_JOIN_BENCH_SCALE=4 cargo bench --bench kernels   # 1/4 of the sizes
//! GPU_JOIN_BENCH_ONLY='narrow|wide' cargo bench --bench kernels  # only these workloads
//! GPU_JOIN_BENCH_FULL_SORT=1 cargo bench --bench kernels  # also SMJ-OM sorting every key bit
//! GPU_JOIN_BENCH_SWEEP=1 cargo bench --bench kernels  # the sweep of algorithm = auto instead
//! ```
//!
//! The sort-merge join sorts by the key bits a packed encoding of the build
//! side's keys would use (its values' bits and one more), as the operator
//! does.

#[path = "kernels/sweep.rs"]
mod sweep;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, Int32Array, Int64Array};
use criterion::{Criterion, criterion_group, criterion_main};
use datafusion_gpu_join::algorithms::choice::device_profile;
use datafusion_gpu_join::backend::cuda::{CudaBackend, CudaColumn};
use datafusion_gpu_join::backend::{
    BackendHandle, DeviceCounters, JoinBackend, MAX_RELATION_ROWS, PartitionSpec, SortSpec, Space, Transformed,
    cuda_backend,
};
use datafusion_gpu_join::config::GpuJoinConfig;
use datafusion_gpu_join::keys::NormalizedKey;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

/// One workload of the paper.
#[derive(Debug, Clone, Copy)]
struct Workload {
    name: &'static str,
    build_rows: usize,
    probe_rows: usize,
    payloads: usize,
    wide_values: bool,
    /// Share of R's keys that S can match.
    match_ratio: f64,
    /// Zipf exponent of S's foreign keys (0 = uniform).
    zipf: f64,
    /// Distinct values of R's keys, when they repeat; S's keys are uniform
    /// over them.
    distinct_build_keys: Option<u64>,
}

fn workloads(scale: usize) -> Vec<Workload> {
    let (r, s) = ((1usize << 27) / scale, (1usize << 28) / scale);
    let base = Workload {
        name: "",
        build_rows: r,
        probe_rows: s,
        payloads: 1,
        wide_values: false,
        match_ratio: 1.0,
        zipf: 0.0,
        distinct_build_keys: None,
    };
    vec![
        Workload { name: "narrow", ..base },
        Workload { name: "wide", payloads: 2, ..base },
        Workload { name: "wide, match ratio 1/8", payloads: 2, match_ratio: 0.125, ..base },
        Workload { name: "wide, zipf 1.0, R = S rows", payloads: 2, probe_rows: r, zipf: 1.0, ..base },
        Workload { name: "narrow, 8-byte keys and payloads", wide_values: true, ..base },
        Workload { name: "wide, 8-byte keys and payloads", payloads: 2, wide_values: true, ..base },
        Workload {
            name: "narrow, 1000 distinct build keys",
            build_rows: (1 << 24) / scale,
            probe_rows: 1 << 12,
            distinct_build_keys: Some(1000),
            ..base
        },
    ]
}

/// Zipf-distributed ranks in `0..n` by inverting the cumulative weights.
fn zipf_keys(rng: &mut StdRng, n: usize, count: usize, exponent: f64) -> Vec<u64> {
    let mut cumulative = Vec::with_capacity(n);
    let mut total = 0.0;
    for rank in 1..=n {
        total += 1.0 / (rank as f64).powf(exponent);
        cumulative.push(total);
    }
    let seeds: Vec<u64> = (0..count).map(|_| rng.random()).collect();
    seeds
        .par_iter()
        .map(|&seed| {
            let u = (seed >> 11) as f64 / (1u64 << 53) as f64 * total;
            cumulative.partition_point(|&c| c < u).min(n - 1) as u64
        })
        .collect()
}

/// (R keys, S keys) as described by the workload; non-matching R keys lie
/// above every S key.
fn keys(workload: &Workload, rng: &mut StdRng) -> (Vec<u64>, Vec<u64>) {
    let r = workload.build_rows as u64;
    if let Some(distinct) = workload.distinct_build_keys {
        let mut uniform = |rows| (0..rows).map(|_| rng.random_range(0..distinct)).collect::<Vec<u64>>();
        return (uniform(workload.build_rows), uniform(workload.probe_rows));
    }
    let mut build: Vec<u64> = (0..r).collect();
    build.shuffle(rng);
    let matchable = (r as f64 * workload.match_ratio) as u64;
    for key in build.iter_mut() {
        if *key >= matchable {
            *key += r;
        }
    }
    let probe = if workload.zipf > 0.0 {
        zipf_keys(rng, r as usize, workload.probe_rows, workload.zipf)
    } else {
        let seeds: Vec<u64> = (0..workload.probe_rows).map(|_| rng.random()).collect();
        seeds.par_iter().map(|s| s % r).collect()
    };
    (build, probe)
}

fn payload(rows: usize, wide: bool, salt: i64) -> ArrayRef {
    if wide {
        Arc::new(Int64Array::from_iter_values((0..rows as i64).map(|i| i.wrapping_mul(31) ^ salt)))
    } else {
        Arc::new(Int32Array::from_iter_values((0..rows as i32).map(|i| i.wrapping_mul(31) ^ salt as i32)))
    }
}

/// A side on the device: its keys and payload columns, and the key bits a
/// sort orders by.
struct Side<K: NormalizedKey> {
    keys: <CudaBackend as JoinBackend>::Vector<K>,
    payloads: Vec<CudaColumn>,
    sort: SortSpec,
}

fn upload_side<K: NormalizedKey>(
    gpu: &CudaBackend,
    keys: &[u64],
    (payloads, wide): (usize, bool),
    salt: i64,
    sort: SortSpec,
) -> Side<K> {
    let keys: Vec<K> = keys.par_iter().map(|&k| K::from_u64(k)).collect();
    let payloads = (0..payloads)
        .map(|i| gpu.upload_column(&payload(keys.len(), wide, salt + i as i64)).expect("payload upload"))
        .collect();
    Side { keys: gpu.upload(&keys).expect("key upload"), payloads, sort }
}

/// How both sides are transformed and matched.
#[derive(Debug, Clone, Copy)]
enum Method {
    /// Radix partitions, then a hash table per partition.
    PartitionedHash,
    /// Sorted by key, then merged.
    SortMerge,
    /// As `SortMerge`, sorting by every bit of the key.
    SortMergeFullWidth,
    /// The build side sorted with a directory of its key codes; the probe
    /// side as it is, its payloads gathered by row.
    Direct,
}

/// The algorithms measured, with the paper's names: -OM gathers from the
/// transformed relations (payloads travel with the keys, GFTR), -UM by row
/// id (GFUR); a directory join's probe side is never transformed.
const ALGORITHMS: [(&str, Method, Space); 5] = [
    ("PHJ-OM", Method::PartitionedHash, Space::Transformed),
    ("PHJ-UM", Method::PartitionedHash, Space::Original),
    ("SMJ-OM", Method::SortMerge, Space::Transformed),
    ("SMJ-UM", Method::SortMerge, Space::Original),
    ("DIR-OM", Method::Direct, Space::Transformed),
];

#[derive(Debug, Default, Clone, Copy)]
struct Phases {
    transform: Duration,
    matching: Duration,
    materialize: Duration,
}

impl Phases {
    fn total(&self) -> Duration {
        self.transform + self.matching + self.materialize
    }
}

/// One join, phase by phase; `spaces` are where the build and probe sides'
/// payloads are gathered from.
fn run<K: NormalizedKey>(
    gpu: &CudaBackend,
    build: &Side<K>,
    probe: &Side<K>,
    method: Method,
    spaces: (Space, Space),
) -> (Phases, usize) {
    let spec = PartitionSpec::for_build_rows(gpu.len(&build.keys), gpu.partition_target_rows());
    let start = Instant::now();
    let transform = |side: &Side<K>, space: Space| -> Transformed<CudaBackend, K> {
        let payloads: Vec<&CudaColumn> = match space {
            Space::Transformed => side.payloads.iter().collect(),
            Space::Original => vec![],
        };
        let with_row_ids = space == Space::Original;
        match method {
            Method::PartitionedHash => gpu.partition(&side.keys, &payloads, with_row_ids, spec).expect("partition"),
            Method::SortMerge | Method::Direct => {
                gpu.sort(&side.keys, &payloads, with_row_ids, side.sort).expect("sort")
            }
            Method::SortMergeFullWidth => {
                gpu.sort(&side.keys, &payloads, with_row_ids, SortSpec::full::<K>()).expect("sort")
            }
        }
    };
    let build_t = transform(build, spaces.0);
    let (probe_t, directory) = match method {
        // Every code of the sort's key bits but the bit for unmatchable keys.
        Method::Direct => {
            let codes = 1u32.checked_shl(build.sort.key_bits - 1).expect("a directory of at most 2^31 codes");
            (None, Some(gpu.directory(&build_t, codes).expect("directory")))
        }
        _ => (Some(transform(probe, spaces.1)), None),
    };
    gpu.finish().expect("transform");
    let transformed = start.elapsed();

    let matches = match (method, &probe_t, &directory) {
        (Method::PartitionedHash, Some(probe_t), _) => {
            let tables = gpu.hash_tables(&build_t).expect("hash tables");
            gpu.hash_match(&build_t, &tables, probe_t, spaces).expect("match")
        }
        (Method::SortMerge | Method::SortMergeFullWidth, Some(probe_t), _) => {
            gpu.merge_match(&build_t, probe_t, spaces).expect("match")
        }
        (_, _, Some(directory)) => gpu.directory_match(&build_t, directory, &probe.keys, spaces.0).expect("match"),
        _ => unreachable!("a probe side transformed or a directory"),
    };
    gpu.finish().expect("match");
    let matched = start.elapsed();

    let mut output = vec![];
    for (space, transformed, side, positions) in
        [(spaces.0, Some(&build_t), build, &matches.build), (spaces.1, probe_t.as_ref(), probe, &matches.probe)]
    {
        let columns = match (space, transformed) {
            (Space::Transformed, Some(transformed)) => &transformed.payloads,
            _ => &side.payloads,
        };
        for column in columns {
            output.push(gpu.gather_column(column, positions, false).expect("gather"));
        }
    }
    gpu.finish().expect("materialize");
    let done = start.elapsed();
    let rows = gpu.len(&matches.build);
    drop(output);
    (Phases { transform: transformed, matching: matched - transformed, materialize: done - matched }, rows)
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

/// Each phase's median over `runs`.
fn median_phases<'a>(runs: impl Iterator<Item = &'a Phases> + Clone) -> Phases {
    let phase = |f: fn(&Phases) -> Duration| median(runs.clone().map(f).collect());
    Phases { transform: phase(|p| p.transform), matching: phase(|p| p.matching), materialize: phase(|p| p.materialize) }
}

struct Row {
    workload: String,
    algorithm: &'static str,
    phases: Phases,
    rows_per_second: f64,
    output_rows: usize,
}

fn bench_workload<K: NormalizedKey>(
    c: &mut Criterion,
    gpu: &CudaBackend,
    workload: &Workload,
    results: &Mutex<Vec<Row>>,
) {
    let mut rng = StdRng::seed_from_u64(0x6a6f696e);
    let (build_keys, probe_keys) = keys(workload, &mut rng);
    // Every probe key lies within the build side's range here.
    let value_bits = build_keys.iter().max().map_or(0, |k| u64::BITS - k.leading_zeros());
    let sort = SortSpec::for_value_bits::<K>(value_bits);
    let columns = (workload.payloads, workload.wide_values);
    let build = upload_side::<K>(gpu, &build_keys, columns, 1, sort);
    let probe = upload_side::<K>(gpu, &probe_keys, columns, 2, sort);
    drop((build_keys, probe_keys));
    let mut group = c.benchmark_group(workload.name);
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    let full_sort = std::env::var_os("GPU_JOIN_BENCH_FULL_SORT").is_some();
    let full_sort =
        full_sort.then_some(("SMJ-OM, every key bit sorted", Method::SortMergeFullWidth, Space::Transformed));
    for (label, method, space) in ALGORITHMS.into_iter().chain(full_sort) {
        let runs = Mutex::new(vec![]);
        group.bench_function(label, |b| {
            b.iter_custom(|iterations| {
                let mut total = Duration::ZERO;
                for _ in 0..iterations {
                    let (phases, rows) = run(gpu, &build, &probe, method, (space, space));
                    total += phases.total();
                    runs.lock().expect("runs").push((phases, rows));
                }
                total
            })
        });
        let runs = runs.into_inner().expect("runs");
        let phases = median_phases(runs.iter().map(|(p, _)| p));
        let total = median(runs.iter().map(|(p, _)| p.total()).collect());
        results.lock().expect("results").push(Row {
            workload: workload.name.to_string(),
            algorithm: label,
            phases,
            rows_per_second: (workload.build_rows + workload.probe_rows) as f64 / total.as_secs_f64(),
            output_rows: runs.first().map_or(0, |(_, r)| *r),
        });
    }
    group.finish();
}

fn kernels(c: &mut Criterion) {
    let mut options = GpuJoinConfig::default();
    options.memory_limit = "90%".parse().expect("a valid limit");
    let device = match cuda_backend(&options) {
        Ok(BackendHandle::Cuda(device)) => device,
        Ok(_) | Err(_) => {
            eprintln!("kernels benchmark skipped: no usable CUDA device");
            return;
        }
    };
    // Whole relations: a foreign-key join of 2^28 probe rows makes 2^28
    // pairs in one match call, where the operator's chunks make 2^24.
    let gpu = CudaBackend::open(&device, Arc::new(DeviceCounters::default()))
        .expect("a CUDA backend")
        .with_candidate_limit(MAX_RELATION_ROWS);
    let scale = std::env::var("GPU_JOIN_BENCH_SCALE").ok().and_then(|v| v.parse().ok()).unwrap_or(1usize).max(1);
    if std::env::var_os("GPU_JOIN_BENCH_SWEEP").is_some() {
        let started = Instant::now();
        let profile = device_profile(&gpu).expect("a CUDA device has a profile").expect("the cost profile");
        println!("cost profile ready in {:.0?} (measured, or read from the cache)", started.elapsed());
        sweep::sweep(c, &gpu, &profile, scale);
        return;
    }
    let results = Mutex::new(vec![]);
    // Workload names separated by `|`, to run only those.
    let only = std::env::var("GPU_JOIN_BENCH_ONLY").unwrap_or_default();
    let selected = |w: &Workload| only.is_empty() || only.split('|').any(|name| name == w.name);
    for workload in workloads(scale).into_iter().filter(selected) {
        if workload.wide_values {
            bench_workload::<u64>(c, &gpu, &workload, &results);
        } else {
            bench_workload::<u32>(c, &gpu, &workload, &results);
        }
    }
    println!("\nmedian per phase (ms), throughput (|R|+|S|)/time, inputs and outputs in device memory");
    println!("| workload | algorithm | transform | match | materialize | total | G rows/s | output rows |");
    println!("|---|---|---|---|---|---|---|---|");
    for row in results.into_inner().expect("results") {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} |",
            row.workload,
            row.algorithm,
            ms(row.phases.transform),
            ms(row.phases.matching),
            ms(row.phases.materialize),
            ms(row.phases.total()),
            row.rows_per_second / 1e9,
            row.output_rows
        );
    }
}

criterion_group!(benches, kernels);
criterion_main!(benches);
