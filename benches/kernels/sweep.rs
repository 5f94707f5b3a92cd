//! The sweep of `algorithm = auto` against every fixed strategy.
//!
//! Around a base join (R = 2^24 unique keys, S = 2^25 foreign keys, two
//! 4-byte payload columns per side, every probe row matching), one factor
//! varies at a time: match ratio 1/2 to 1/16, zipf 0.5 to 2 over S's keys,
//! 1 to 6 payload columns, |S|/|R| 1 to 16, 8-byte keys and payloads, and
//! a build side of 1,000 distinct keys (probed by 2^12 rows). Each cell
//! measures the four fixed strategies and auto, whose time includes
//! sampling the build keys and weighing the strategies, as the operator
//! does.

use std::sync::Mutex;
use std::time::Duration;

use criterion::Criterion;
use datafusion_gpu_join::algorithms::Algorithm;
use datafusion_gpu_join::algorithms::Strategy;
use datafusion_gpu_join::algorithms::choice::{
    CostProfile, JoinShape, KeySample, estimate_keys, every_strategy, sample_positions, weigh,
};
use datafusion_gpu_join::backend::cuda::CudaBackend;
use datafusion_gpu_join::backend::{JoinBackend, PartitionSpec, SortSpec, radix_pass_count};
use datafusion_gpu_join::keys::NormalizedKey;
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::{ALGORITHMS, Method, Workload, keys, median, run, upload_side};

fn cells(scale: usize) -> Vec<Workload> {
    let r = (1usize << 24) / scale;
    let base = Workload {
        name: "base",
        build_rows: r,
        probe_rows: 2 * r,
        payloads: 2,
        wide_values: false,
        match_ratio: 1.0,
        zipf: 0.0,
        distinct_build_keys: None,
    };
    let mut cells = vec![base];
    for (name, ratio) in [("match 1/2", 0.5), ("match 1/4", 0.25), ("match 1/8", 0.125), ("match 1/16", 0.0625)] {
        cells.push(Workload { name, match_ratio: ratio, ..base });
    }
    for (name, zipf) in [("zipf 0.5", 0.5), ("zipf 1.0", 1.0), ("zipf 1.5", 1.5), ("zipf 2.0", 2.0)] {
        cells.push(Workload { name, zipf, ..base });
    }
    for (name, payloads) in
        [("1 payload", 1), ("3 payloads", 3), ("4 payloads", 4), ("5 payloads", 5), ("6 payloads", 6)]
    {
        cells.push(Workload { name, payloads, ..base });
    }
    for (name, times) in [("|S| = |R|", 1), ("|S| = 4|R|", 4), ("|S| = 8|R|", 8), ("|S| = 16|R|", 16)] {
        cells.push(Workload { name, probe_rows: times * r, ..base });
    }
    cells.push(Workload { name: "8-byte keys and payloads", wide_values: true, ..base });
    let few_keys = Workload { name: "1000 distinct build keys", distinct_build_keys: Some(1000), ..base };
    cells.push(Workload { probe_rows: 1 << 12, ..few_keys });
    cells
}

/// What the operator would know of the cell: its sizes and widths, the
/// probe side's key range (from statistics), and a sample of build keys.
fn shape<K: NormalizedKey>(
    gpu: &CudaBackend,
    cell: &Workload,
    build_keys: &[u64],
    probe_range: (i64, i64),
    sort: SortSpec,
) -> JoinShape {
    let sampled: Vec<u64> = sample_positions(build_keys.len()).into_iter().map(|p| build_keys[p]).collect();
    let values = Some(sampled.iter().map(|&k| k as i64).collect());
    let sample = KeySample { population: build_keys.len(), keys: sampled, values };
    let width = if cell.wide_values { 8 } else { 4 };
    let partition = PartitionSpec::for_build_rows(cell.build_rows, gpu.partition_target_rows());
    JoinShape {
        build_rows: cell.build_rows,
        probe_rows: cell.probe_rows,
        key_bytes: K::BITS / 8,
        partition_passes: radix_pass_count(partition.digit_bits()),
        sort_passes: radix_pass_count(sort.digit_bits()),
        build_payloads: vec![width; cell.payloads],
        probe_payloads: vec![width; cell.payloads],
        row_ids_anyway: (false, false),
        keys: estimate_keys(&sample, Some(probe_range)),
    }
}

fn method(strategy: Strategy) -> Method {
    match strategy.algorithm {
        Algorithm::PartitionedHash => Method::PartitionedHash,
        Algorithm::SortMerge => Method::SortMerge,
    }
}

/// One cell's medians: the fixed strategies in `ALGORITHMS` order, then auto
/// and what it chose.
pub struct CellResult {
    name: String,
    fixed: Vec<Duration>,
    auto: Duration,
    chosen: String,
}

fn sweep_cell<K: NormalizedKey>(
    c: &mut Criterion,
    gpu: &CudaBackend,
    profile: &CostProfile,
    cell: &Workload,
) -> CellResult {
    let mut rng = StdRng::seed_from_u64(0x6a6f696e);
    let (build_keys, probe_keys) = keys(cell, &mut rng);
    let value_bits = build_keys.iter().max().map_or(0, |k| u64::BITS - k.leading_zeros());
    let sort = SortSpec::for_value_bits::<K>(value_bits);
    let probe_range = probe_keys.iter().fold((i64::MAX, i64::MIN), |(lo, hi), &k| (lo.min(k as i64), hi.max(k as i64)));
    let columns = (cell.payloads, cell.wide_values);
    let build = upload_side::<K>(gpu, &build_keys, columns, 1, sort);
    let probe = upload_side::<K>(gpu, &probe_keys, columns, 2, sort);
    drop(probe_keys);
    let mut group = c.benchmark_group(format!("sweep/{}", cell.name));
    group.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    let mut fixed = vec![];
    for (label, method, space) in ALGORITHMS {
        let runs = Mutex::new(vec![]);
        group.bench_function(label, |b| {
            b.iter_custom(|iterations| {
                (0..iterations)
                    .map(|_| {
                        let total = run(gpu, &build, &probe, method, (space, space)).0.total();
                        runs.lock().expect("runs").push(total);
                        total
                    })
                    .sum()
            })
        });
        fixed.push(median(runs.into_inner().expect("runs")));
    }
    let (runs, chosen) = (Mutex::new(vec![]), Mutex::new(String::new()));
    group.bench_function("auto", |b| {
        b.iter_custom(|iterations| {
            (0..iterations)
                .map(|_| {
                    let start = std::time::Instant::now();
                    let shape = shape::<K>(gpu, cell, &build_keys, probe_range, sort);
                    let choice = weigh(profile, &shape, &every_strategy()).expect("a strategy");
                    let chose = start.elapsed();
                    let spaces = (choice.strategy.build_space, choice.strategy.probe_space);
                    let total = chose + run(gpu, &build, &probe, method(choice.strategy), spaces).0.total();
                    runs.lock().expect("runs").push(total);
                    *chosen.lock().expect("chosen") = choice.strategy.label();
                    total
                })
                .sum()
        })
    });
    group.finish();
    CellResult {
        name: cell.name.to_string(),
        fixed,
        auto: median(runs.into_inner().expect("runs")),
        chosen: chosen.into_inner().expect("chosen"),
    }
}

/// Runs the sweep and prints its table, with auto's time over the best
/// fixed strategy's in each cell.
pub fn sweep(c: &mut Criterion, gpu: &CudaBackend, profile: &CostProfile, scale: usize) {
    let mut results = vec![];
    for cell in cells(scale) {
        results.push(match cell.wide_values {
            true => sweep_cell::<u64>(c, gpu, profile, &cell),
            false => sweep_cell::<u32>(c, gpu, profile, &cell),
        });
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("\nsweep: median total (ms), inputs and outputs in device memory; cost profile {profile:?}");
    let labels: Vec<&str> = ALGORITHMS.iter().map(|(label, _, _)| *label).collect();
    println!("| cell | {} | auto | auto chose | auto / best |", labels.join(" | "));
    println!("|---|{}---|---|---|", "---|".repeat(labels.len()));
    for result in results {
        let best = result.fixed.iter().min().copied().unwrap_or_default();
        let fixed: Vec<String> = result.fixed.iter().map(|&d| format!("{:.2}", ms(d))).collect();
        println!(
            "| {} | {} | {:.2} | {} | {:.3} |",
            result.name,
            fixed.join(" | "),
            ms(result.auto),
            result.chosen,
            result.auto.as_secs_f64() / best.as_secs_f64()
        );
    }
}
