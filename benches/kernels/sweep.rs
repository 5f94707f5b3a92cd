//! The sweep of `algorithm = auto` against every fixed strategy.
//!
//! Around a base join (R = 2^24 unique keys, S = 2^25 foreign keys, two
//! 4-byte payload columns per side, every probe row matching), one factor
//! varies at a time: match ratio 1/2 to 1/16, zipf 0.5 to 2 over S's keys,
//! 1 to 6 payload columns, |S|/|R| 1 to 16, 8-byte keys and payloads, and
//! a build side of 1,000 distinct keys (probed by 2^12 rows). Each cell
//! measures the four fixed strategies and auto, whose time includes
//! sampling the build keys and weighing the strategies, as the operator
//! does. A second table sets each fixed strategy's phases beside the cost
//! model's estimates, to show where the model is off.

use std::sync::Mutex;
use std::time::Duration;

use criterion::Criterion;
use datafusion_gpu_join::algorithms::Algorithm;
use datafusion_gpu_join::algorithms::Strategy;
use datafusion_gpu_join::algorithms::choice::{
    CostProfile, Estimate, JoinShape, KeySample, estimate, estimate_keys, every_strategy, sample_rows, weigh,
};
use datafusion_gpu_join::backend::cuda::CudaBackend;
use datafusion_gpu_join::backend::{JoinBackend, PartitionSpec, SortSpec, Space, radix_pass_count};
use datafusion_gpu_join::keys::NormalizedKey;
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::{ALGORITHMS, Method, Phases, Workload, keys, median, median_phases, run, upload_side};

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
    let rows = sample_rows(build_keys.len());
    let sampled: Vec<u64> = rows.positions.iter().map(|&p| build_keys[p]).collect();
    let values = Some(sampled.iter().map(|&k| k as i64).collect());
    let sample = KeySample::new(build_keys.len(), &rows, sampled.into_iter().map(Some), values);
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
        Algorithm::Direct => Method::Direct,
    }
}

/// One cell's medians: the fixed strategies in `ALGORITHMS` order (and the
/// model's estimates of them), then auto, what it chose, and what choosing
/// cost.
pub struct CellResult {
    name: String,
    fixed: Vec<Phases>,
    estimated: Vec<Estimate>,
    auto: Duration,
    choosing: Duration,
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
                        let phases = run(gpu, &build, &probe, method, (space, space)).0;
                        runs.lock().expect("runs").push(phases);
                        phases.total()
                    })
                    .sum()
            })
        });
        fixed.push(median_phases(runs.into_inner().expect("runs").iter()));
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
                    runs.lock().expect("runs").push((total, chose));
                    *chosen.lock().expect("chosen") = choice.strategy.label();
                    total
                })
                .sum()
        })
    });
    group.finish();
    let shape = shape::<K>(gpu, cell, &build_keys, probe_range, sort);
    let estimated = ALGORITHMS
        .iter()
        .map(|&(_, method, space)| {
            let (algorithm, probe_space) = match method {
                Method::PartitionedHash => (Algorithm::PartitionedHash, space),
                Method::SortMerge | Method::SortMergeFullWidth => (Algorithm::SortMerge, space),
                Method::Direct => (Algorithm::Direct, Space::Original),
            };
            estimate(profile, &shape, Strategy { algorithm, build_space: space, probe_space })
        })
        .collect();
    let runs = runs.into_inner().expect("runs");
    CellResult {
        name: cell.name.to_string(),
        fixed,
        estimated,
        auto: median(runs.iter().map(|r| r.0).collect()),
        choosing: median(runs.iter().map(|r| r.1).collect()),
        chosen: chosen.into_inner().expect("chosen"),
    }
}

/// Runs the sweep and prints its tables: auto's time over the best fixed
/// strategy's in each cell, then each fixed strategy's phases, measured and
/// estimated.
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
    println!("| cell | {} | auto | auto chose | choosing | auto / best |", labels.join(" | "));
    println!("|---|{}---|---|---|---|", "---|".repeat(labels.len()));
    for result in &results {
        let totals: Vec<Duration> = result.fixed.iter().map(Phases::total).collect();
        let best = totals.iter().min().copied().unwrap_or_default();
        let fixed: Vec<String> = totals.iter().map(|&d| format!("{:.2}", ms(d))).collect();
        println!(
            "| {} | {} | {:.2} | {} | {:.3} | {:.3} |",
            result.name,
            fixed.join(" | "),
            ms(result.auto),
            result.chosen,
            ms(result.choosing),
            result.auto.as_secs_f64() / best.as_secs_f64()
        );
    }
    println!("\nsweep: measured / estimated ms per phase");
    println!("| cell | strategy | transform | match | materialize | total |");
    println!("|---|---|---|---|---|---|");
    for result in &results {
        for ((label, phases), estimated) in labels.iter().zip(&result.fixed).zip(&result.estimated) {
            let pair = |measured: Duration, estimated: f64| format!("{:.2} / {:.2}", ms(measured), estimated / 1e6);
            println!(
                "| {} | {label} | {} | {} | {} | {} |",
                result.name,
                pair(phases.transform, estimated.transform),
                pair(phases.matching, estimated.matching),
                pair(phases.materialize, estimated.materialize),
                pair(phases.total(), estimated.total()),
            );
        }
    }
}
