//! Operator-level benchmark: a DataFusion session with the GPU join against
//! DataFusion alone, in one process, on the GFTR paper's data as Arrow
//! batches in host memory (`target_partitions = 16`).
//!
//! The GPU session runs every join on the GPU (`gpu_join.min_rows = 0`,
//! `gpu_join.min_build_rows = 0`).
//! R holds 2^27 dense shuffled primary keys, S 2^28 uniform foreign keys,
//! 4-byte keys and payloads, one payload column per side (narrow) or two
//! (wide). For each workload it times the whole query
//! (`select count(*), sum(..) from r join s on r.k = s.k`) on both sessions,
//! and the GPU join operator alone (every output partition of the join
//! drained), against the PCIe floor: the workload's input bytes up or its
//! output bytes down at 55 GB/s, whichever take longer. Beside it, the
//! floors of the host (one copy of every input byte) and of the host and
//! the bus together (that copy through pinned memory and up, while the
//! output's bytes come down), and DataFusion's aggregation of the query
//! over the join's output held in memory.
//!
//! `ordered` (only when named) runs the narrow join planned as a sort-merge
//! join whose order an aggregate relies on, against DataFusion's.
//!
//! `pruned` (only when named) runs a star join over Parquet, where the
//! hash join's dynamic filter lets the fact table's scan skip most of it:
//! both sessions with the filter and without.
//!
//! `exploding` (only when named) runs joins whose pairs outgrow one match
//! call: a left join of two 6,000-row tables whose keys are all equal (36
//! million rows), and anti and semi joins of 10 million probe rows, half of
//! one key, against 1,000 build rows of that key.
//!
//! Last, `passes` runs the narrow query with a device budget of half the
//! build side's bytes, so that the build side is joined in passes, and
//! checks its result against DataFusion's (median of 3 runs after one).
//!
//! ```text
//! cargo bench --bench operator                       # GPU machine
//! GPU_JOIN_BENCH_SCALE=64 cargo bench --bench operator   # 1/64 of the sizes
//! GPU_JOIN_BENCH_ONLY=narrow cargo bench --bench operator  # one workload
//! GPU_JOIN_BENCH_ONLY=passes cargo bench --bench operator  # build side twice the budget
//! GPU_JOIN_BENCH_ONLY=ordered cargo bench --bench operator # a sort-merge join's order kept
//! GPU_JOIN_BENCH_ONLY=pruned cargo bench --bench operator  # the probe scan pruned by the build side
//! GPU_JOIN_BENCH_ONLY=exploding cargo bench --bench operator  # joins of more pairs than a match call makes
//! GPU_JOIN_BENCH_BATCH_ROWS=131072 cargo bench --bench operator # input batches of 131072 rows
//! GPU_JOIN_BENCH_SETTINGS='set gpu_join.probe_chunk_rows = 4194304' \
//!   GPU_JOIN_BENCH_GPU_ONLY=1 cargo bench --bench operator  # GPU session settings; DataFusion not timed
//! GPU_JOIN_BENCH_SESSION_SETTINGS='set datafusion.execution.batch_size = 65536' \
//!   cargo bench --bench operator                       # settings of both sessions
//! GPU_JOIN_BENCH_PINNED=1 cargo bench --bench operator # tables kept in pinned memory
//! ```
//!
//! With `GPU_JOIN_BENCH_PINNED` both sessions read the narrow and wide
//! tables from batches kept in pinned memory (`gpu_join_pin_batches`), which
//! the GPU join reads where they lie; the floors are still measured on the
//! tables' batches as made, in pageable memory.

// Both sessions run on mimalloc, the allocator DataFusion's own command-line
// tool and benchmark runner are built with, so DataFusion is timed as its own
// benchmarks time it. The library itself sets no allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, AsArray, Int32Array};
use arrow::datatypes::{DataType, Field, Int32Type, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use arrow::util::pretty::pretty_format_batches;
use criterion::{Criterion, criterion_group, criterion_main};
use cudarc::driver::{CudaContext, DriverError, result};
use datafusion::datasource::MemTable;
use datafusion::execution::SessionStateBuilder;
use datafusion::physical_plan::{ExecutionPlan, execute_stream_partitioned};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu_join::backend::cuda_backend;
use datafusion_gpu_join::config::GpuJoinConfig;
use datafusion_gpu_join::{GpuJoinExec, SessionStateBuilderExt};
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

const PARTITIONS: usize = 16;
/// Rows per input batch unless `GPU_JOIN_BENCH_BATCH_ROWS` says otherwise:
/// DataFusion's default `batch_size`, what its scans produce.
const BATCH_ROWS: usize = 8192;
/// Pinned host-device bandwidth each way on the GPU machines.
const PCIE_BYTES_PER_SECOND: f64 = 55e9;

struct Workload {
    name: &'static str,
    /// Its name where the tables are kept in pinned memory.
    pinned_name: &'static str,
    payloads: usize,
}

const WORKLOADS: [Workload; 2] = [
    Workload { name: "narrow", pinned_name: "narrow, tables pinned", payloads: 1 },
    Workload { name: "wide", pinned_name: "wide, tables pinned", payloads: 2 },
];

/// A table's batches, partition by partition.
type Partitions = Vec<Vec<RecordBatch>>;

fn table(prefix: &str, keys: Vec<i32>, payloads: usize) -> (MemTable, Partitions) {
    let batch_rows =
        std::env::var("GPU_JOIN_BENCH_BATCH_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(BATCH_ROWS).max(1);
    let mut fields = vec![Field::new("k", DataType::Int32, false)];
    fields.extend((1..=payloads).map(|i| Field::new(format!("{prefix}{i}"), DataType::Int32, false)));
    let schema: SchemaRef = Arc::new(Schema::new(fields));
    let per_partition = keys.len().div_ceil(PARTITIONS);
    let partitions: Vec<Vec<RecordBatch>> = keys
        .par_chunks(per_partition)
        .enumerate()
        .map(|(p, keys)| {
            keys.chunks(batch_rows)
                .enumerate()
                .map(|(b, keys)| {
                    let first = (p * per_partition + b * batch_rows) as i32;
                    let mut columns: Vec<ArrayRef> = vec![Arc::new(Int32Array::from(keys.to_vec()))];
                    for i in 1..=payloads as i32 {
                        let values = (0..keys.len() as i32).map(|r| (first + r).wrapping_mul(i) % 1000);
                        columns.push(Arc::new(Int32Array::from_iter_values(values)));
                    }
                    RecordBatch::try_new(Arc::clone(&schema), columns).expect("a batch")
                })
                .collect()
        })
        .collect();
    (MemTable::try_new(schema, partitions.clone()).expect("a table"), partitions)
}

/// A table over `partitions` kept in pinned memory; prints what pinning
/// took, the cost a table pays once.
fn pinned_table(name: &str, partitions: Partitions) -> MemTable {
    let backend = cuda_backend(&GpuJoinConfig::default()).expect("a CUDA device");
    let values = |batch: &RecordBatch| -> usize {
        batch.columns().iter().filter_map(|c| c.data_type().primitive_width().map(|width| width * c.len())).sum()
    };
    let bytes: usize = partitions.iter().flatten().map(values).sum();
    let start = Instant::now();
    let pinned = backend.pin_partitions(partitions).expect("the batches pinned");
    println!("{name}: {:.2} GB pinned in {:.0} ms", bytes as f64 / 1e9, start.elapsed().as_secs_f64() * 1e3);
    MemTable::try_new(pinned[0][0].schema(), pinned).expect("a table")
}

/// The values of every column of the tables' batches, batch by batch.
fn input_buffers<'a>(tables: &[&'a Partitions]) -> Vec<&'a [u8]> {
    tables
        .iter()
        .flat_map(|partitions| partitions.iter().flatten())
        .flat_map(|batch| batch.columns().iter().map(|c| c.as_primitive::<Int32Type>().values().inner().as_slice()))
        .collect()
}

/// Copies `buffers` one after another to the start of `target`, on every
/// core.
fn copy_in_parallel(target: &mut [u8], buffers: &[&[u8]]) {
    let mut pieces = Vec::with_capacity(buffers.len());
    let mut rest = target;
    for buffer in buffers {
        let (piece, tail) = rest.split_at_mut(buffer.len());
        pieces.push((piece, *buffer));
        rest = tail;
    }
    pieces.into_par_iter().for_each(|(to, from)| to.copy_from_slice(from));
}

/// The host's own floor for the join: the time to copy every input byte
/// once, from the tables' batches into memory already touched, on every
/// core (median of 5 after one). The operator cannot move DataFusion's
/// pageable batches to the device without such a copy.
fn host_copy_floor(tables: &[&Partitions]) -> Duration {
    let buffers = input_buffers(tables);
    let mut target = vec![1u8; buffers.iter().map(|b| b.len()).sum()];
    let mut runs = vec![];
    for _ in 0..6 {
        let start = Instant::now();
        copy_in_parallel(&mut target, &buffers);
        runs.push(start.elapsed());
    }
    median(runs.split_off(1))
}

/// Pinned slots the transfer floor fills in turn, and the bytes of each.
const FLOOR_SLOTS: usize = 8;
const FLOOR_SLOT_BYTES: usize = 64 << 20;

/// The transfer floor: the time to move every input byte to the device as
/// any operator over DataFusion's pageable batches must (copied on every
/// core into pinned memory a slot at a time, each slot's upload enqueued as
/// soon as it is filled) while `down` bytes come back into pinned memory on
/// a stream of their own; no join work at all (median of 5 after one). The
/// PCIe floor leaves the host out; this is what the host and the bus give
/// together.
fn transfer_floor(tables: &[&Partitions], down: usize) -> Result<Duration, DriverError> {
    // Slots of whole buffers, each under FLOOR_SLOT_BYTES.
    let mut slots: Vec<Vec<&[u8]>> = vec![vec![]];
    let mut filled = 0;
    for buffer in input_buffers(tables) {
        if filled + buffer.len() > FLOOR_SLOT_BYTES {
            slots.push(vec![]);
            filled = 0;
        }
        filled += buffer.len();
        slots.last_mut().expect("a slot").push(buffer);
    }
    let up: usize = slots.iter().flatten().map(|b| b.len()).sum();
    let context = CudaContext::new(0)?;
    context.bind_to_thread()?;
    let (up_stream, down_stream) = (context.new_stream()?, context.new_stream()?);
    let events = (0..FLOOR_SLOTS).map(|_| context.new_event(None)).collect::<Result<Vec<_>, _>>()?;
    // SAFETY: every allocation below is freed at the end, after both streams
    // are synchronized; the pinned memory is only used through the slices.
    unsafe {
        let (device_in, device_out) = (result::malloc_sync(up)?, result::malloc_sync(down.max(1))?);
        let pinned = result::malloc_host(FLOOR_SLOTS * FLOOR_SLOT_BYTES + down, 0)?.cast::<u8>();
        let pinned = std::slice::from_raw_parts_mut(pinned, FLOOR_SLOTS * FLOOR_SLOT_BYTES + down);
        pinned.par_chunks_mut(1 << 20).for_each(|c| c.fill(1));
        let (ring, output) = pinned.split_at_mut(FLOOR_SLOTS * FLOOR_SLOT_BYTES);
        let mut runs = vec![];
        for _ in 0..6 {
            let start = Instant::now();
            result::memcpy_dtoh_async(&mut *output, device_out, down_stream.cu_stream())?;
            let mut offset = 0u64;
            for (i, slot) in slots.iter().enumerate() {
                let at = i % FLOOR_SLOTS;
                if i >= FLOOR_SLOTS {
                    events[at].synchronize()?;
                }
                let target = &mut ring[at * FLOOR_SLOT_BYTES..(at + 1) * FLOOR_SLOT_BYTES];
                copy_in_parallel(target, slot);
                let len: usize = slot.iter().map(|b| b.len()).sum();
                result::memcpy_htod_async(device_in + offset, &target[..len], up_stream.cu_stream())?;
                events[at].record(&up_stream)?;
                offset += len as u64;
            }
            up_stream.synchronize()?;
            down_stream.synchronize()?;
            runs.push(start.elapsed());
        }
        result::free_host(pinned.as_mut_ptr().cast())?;
        result::free_sync(device_in)?;
        result::free_sync(device_out)?;
        Ok(median(runs.split_off(1)))
    }
}

/// R's shuffled primary keys and S's uniform foreign keys.
fn keys(scale: usize) -> (Vec<i32>, Vec<i32>) {
    let (r, s) = ((1usize << 27) / scale, (1usize << 28) / scale);
    let mut build: Vec<i32> = (0..r as i32).collect();
    build.shuffle(&mut StdRng::seed_from_u64(1));
    let probe = (0..s)
        .into_par_iter()
        .map_init(
            || StdRng::seed_from_u64(rayon::current_thread_index().unwrap_or(0) as u64 + 2),
            |rng, _| rng.random_range(0..r as i32),
        )
        .collect();
    (build, probe)
}

fn session(gpu: bool, r: &Arc<MemTable>, s: &Arc<MemTable>) -> SessionContext {
    let ctx = session_without_tables(gpu);
    ctx.register_table("r", Arc::clone(r) as _).expect("r");
    ctx.register_table("s", Arc::clone(s) as _).expect("s");
    ctx
}

fn session_without_tables(gpu: bool) -> SessionContext {
    // Every size on the GPU, so that scaled-down runs measure the GPU join
    // too rather than `min_rows` or `min_build_rows` keeping it on DataFusion.
    let mut options = GpuJoinConfig::default();
    options.min_rows = 0;
    options.min_build_rows = 0;
    let config = SessionConfig::new().with_target_partitions(PARTITIONS).with_option_extension(options);
    let builder = SessionStateBuilder::new().with_config(config).with_default_features();
    SessionContext::new_with_state(if gpu { builder.with_gpu_join() } else { builder }.build())
}

/// The SQL statements of a `;`-separated settings variable.
fn statements(settings: &str) -> impl Iterator<Item = &str> {
    settings.split(';').map(str::trim).filter(|s| !s.is_empty())
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

fn find_join(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    if plan.is::<GpuJoinExec>() {
        return Some(Arc::clone(plan));
    }
    plan.children().into_iter().find_map(find_join)
}

/// Runs the query; its time and its result.
async fn run_query(ctx: &SessionContext, sql: &str) -> (Duration, Vec<RecordBatch>) {
    let start = Instant::now();
    let batches = ctx.sql(sql).await.expect("planned").collect().await.expect("ran");
    (start.elapsed(), batches)
}

/// Median time to plan the query (logical and physical, optimizer rules
/// included) over 5 plannings after one: part of every timed run of a
/// session, and the same work in both but for the GPU join's rule.
async fn planning_time(ctx: &SessionContext, sql: &str) -> Duration {
    let mut runs = vec![];
    for _ in 0..6 {
        let start = Instant::now();
        ctx.sql(sql).await.expect("planned").create_physical_plan().await.expect("a plan");
        runs.push(start.elapsed());
    }
    median(runs.split_off(1))
}

/// DataFusion's time for `query`'s aggregation alone (median of 5 after
/// one): over the output of `join_only` in `ctx`, held in memory as a table
/// of as many partitions, in a session without the GPU join.
async fn aggregation_alone(ctx: &SessionContext, join_only: &str, query: &str) -> Duration {
    let joined = ctx.sql(join_only).await.expect("planned").collect_partitioned().await.expect("ran");
    let schema = joined.iter().flatten().next().expect("output").schema();
    let table = MemTable::try_new(schema, joined).expect("a table");
    let config = SessionConfig::new().with_target_partitions(PARTITIONS);
    let cpu = SessionContext::new_with_config(config);
    cpu.register_table("joined", Arc::new(table)).expect("joined");
    let sql = query.split(" from ").next().expect("a select list").to_string() + " from joined";
    let mut runs = vec![];
    for _ in 0..6 {
        runs.push(run_query(&cpu, &sql).await.0);
    }
    median(runs.split_off(1))
}

/// One run of the GPU join alone.
#[derive(Debug, Clone, Default)]
struct JoinRun {
    elapsed: Duration,
    /// Until the first output batch of any partition.
    first_output: Duration,
    rows: usize,
    up: u64,
    down: u64,
    metrics: String,
}

/// Drains every output partition of the GPU join alone, all at once.
async fn run_join(ctx: &SessionContext, sql: &str) -> JoinRun {
    let plan = ctx.sql(sql).await.expect("planned").create_physical_plan().await.expect("a plan");
    let join = find_join(&plan).expect("the join runs on the GPU");
    let start = Instant::now();
    let streams = execute_stream_partitioned(Arc::clone(&join), ctx.task_ctx()).expect("streams");
    let tasks: Vec<_> = streams
        .into_iter()
        .map(|mut stream| {
            tokio::spawn(async move {
                let (mut rows, mut first) = (0, None);
                while let Some(batch) = stream.next().await {
                    first.get_or_insert_with(Instant::now);
                    rows += batch.expect("a batch").num_rows();
                }
                (rows, first)
            })
        })
        .collect();
    let (mut rows, mut first) = (0, None::<Instant>);
    for task in tasks {
        let (partition_rows, partition_first) = task.await.expect("a partition");
        rows += partition_rows;
        first = first.into_iter().chain(partition_first).min();
    }
    let elapsed = start.elapsed();
    let metrics = join.metrics().expect("metrics");
    let sum = |name: &str| metrics.sum_by_name(name).map_or(0, |v| v.as_usize() as u64);
    let (strategy, reasons) = join.downcast_ref::<GpuJoinExec>().expect("a GPU join").strategy_text();
    JoinRun {
        elapsed,
        first_output: first.map_or(elapsed, |f| f - start),
        rows,
        up: sum("bytes_to_device"),
        down: sum("bytes_from_device"),
        metrics: format!(
            "{}; strategy {strategy} ({})",
            metrics.aggregate_by_name().sorted_for_display(),
            reasons.unwrap_or_default()
        ),
    }
}

struct Row {
    workload: &'static str,
    datafusion: Duration,
    gpu: Duration,
    join: Duration,
    first_output: Duration,
    host_floor: Duration,
    transfer_floor: Duration,
    /// The workload's input bytes up or its output bytes down, whichever
    /// is more, at the PCIe speed.
    pcie_floor: Duration,
    /// DataFusion's session, then the GPU session.
    planning: [Duration; 2],
    /// DataFusion's aggregation of the query over the join's output held in
    /// memory: the part of a session's time above any join.
    aggregation: Duration,
    up: u64,
    down: u64,
    rows: usize,
}

fn operator(c: &mut Criterion) {
    if let Err(why) = cuda_backend(&GpuJoinConfig::default()) {
        eprintln!("operator benchmark skipped: no usable CUDA device ({why})");
        return;
    }
    let scale = std::env::var("GPU_JOIN_BENCH_SCALE").ok().and_then(|v| v.parse().ok()).unwrap_or(1usize).max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
    let (build_keys, probe_keys) = keys(scale);
    let only = std::env::var("GPU_JOIN_BENCH_ONLY").unwrap_or_default();
    let settings = std::env::var("GPU_JOIN_BENCH_SETTINGS").unwrap_or_default();
    let session_settings = std::env::var("GPU_JOIN_BENCH_SESSION_SETTINGS").unwrap_or_default();
    let gpu_only = std::env::var("GPU_JOIN_BENCH_GPU_ONLY").is_ok();
    let pinned = std::env::var("GPU_JOIN_BENCH_PINNED").is_ok();
    let mut rows = vec![];
    for workload in WORKLOADS.iter().filter(|w| only.is_empty() || only.split('|').any(|n| n == w.name)) {
        let (r, r_batches) = table("p", build_keys.clone(), workload.payloads);
        let (s, s_batches) = table("q", probe_keys.clone(), workload.payloads);
        let host_floor = host_copy_floor(&[&r_batches, &s_batches]);
        let name = if pinned { workload.pinned_name } else { workload.name };
        // The workload's bytes: every input column up, the projected output
        // (every probe row matches once) down.
        let input_bytes = (build_keys.len() + probe_keys.len()) * size_of::<i32>() * (1 + workload.payloads);
        let output_bytes = probe_keys.len() * size_of::<i32>() * 2 * workload.payloads;
        let transfer_floor =
            transfer_floor(&[&r_batches, &s_batches], output_bytes).expect("the transfer floor measured");
        let (r, s) = match pinned {
            true => {
                drop((r, s));
                (pinned_table("r", r_batches), pinned_table("s", s_batches))
            }
            false => {
                drop((r_batches, s_batches));
                (r, s)
            }
        };
        let (r, s) = (Arc::new(r), Arc::new(s));
        let sums: Vec<String> =
            (1..=workload.payloads).flat_map(|i| [format!("sum(p{i})"), format!("sum(q{i})")]).collect();
        let query = format!("select count(*), {} from r join s on r.k = s.k", sums.join(", "));
        let columns: Vec<String> = (1..=workload.payloads).flat_map(|i| [format!("p{i}"), format!("q{i}")]).collect();
        let join_only = format!("select {} from r join s on r.k = s.k", columns.join(", "));
        let (cpu, gpu) = (session(false, &r, &s), session(true, &r, &s));
        for (ctx, settings) in [(&cpu, &session_settings), (&gpu, &session_settings), (&gpu, &settings)] {
            for setting in statements(settings) {
                runtime.block_on(async { ctx.sql(setting).await.expect("a setting").collect().await.expect("set") });
            }
        }

        let (_, expected) = runtime.block_on(run_query(&cpu, &query));
        let (_, actual) = runtime.block_on(run_query(&gpu, &query));
        assert_eq!(expected, actual, "{name}: the GPU session's result differs from DataFusion's");

        let mut group = c.benchmark_group(format!("operator-{}", name.replace(", ", "-").replace(' ', "-")));
        group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(5));
        let mut times = vec![];
        let engines: &[(&str, &SessionContext)] = match gpu_only {
            true => &[("gpu-session", &gpu)],
            false => &[("datafusion", &cpu), ("gpu-session", &gpu)],
        };
        if gpu_only {
            times.push(Duration::ZERO);
        }
        for &(label, ctx) in engines {
            let runs = Mutex::new(vec![]);
            group.bench_function(label, |b| {
                b.iter_custom(|iterations| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iterations {
                        let (elapsed, _) = runtime.block_on(run_query(ctx, &query));
                        runs.lock().expect("runs").push(elapsed);
                        total += elapsed;
                    }
                    total
                })
            });
            times.push(median(runs.into_inner().expect("runs")));
        }
        let joins = Mutex::new(vec![]);
        group.bench_function("gpu-join-operator", |b| {
            b.iter_custom(|iterations| {
                let mut total = Duration::ZERO;
                for _ in 0..iterations {
                    let run = runtime.block_on(run_join(&gpu, &join_only));
                    total += run.elapsed;
                    joins.lock().expect("joins").push(run);
                }
                total
            })
        });
        group.finish();
        let joins = joins.into_inner().expect("joins");
        let last = joins.last().cloned().unwrap_or_default();
        println!("{name}: GPU join metrics of the last run, summed over partitions: {}", last.metrics);
        let analyzed = runtime.block_on(run_query(&gpu, &format!("explain analyze {query}"))).1;
        println!("{}: the GPU session's plan, analyzed:\n{}", name, pretty_format_batches(&analyzed).expect("a plan"));
        rows.push(Row {
            workload: name,
            datafusion: times[0],
            gpu: times[1],
            join: median(joins.iter().map(|j| j.elapsed).collect()),
            first_output: median(joins.iter().map(|j| j.first_output).collect()),
            host_floor,
            transfer_floor,
            planning: [&cpu, &gpu].map(|ctx| runtime.block_on(planning_time(ctx, &query))),
            aggregation: runtime.block_on(aggregation_alone(&gpu, &join_only, &query)),
            pcie_floor: Duration::from_secs_f64(input_bytes.max(output_bytes) as f64 / PCIE_BYTES_PER_SECOND),
            up: last.up,
            down: last.down,
            rows: last.rows,
        });
    }
    if only.split('|').any(|n| n == "ordered") {
        runtime.block_on(sort_merge_order_relied_on(build_keys.clone(), probe_keys.clone()));
    }
    if only.split('|').any(|n| n == "pruned") {
        runtime.block_on(probe_scan_pruned(scale));
    }
    if only.split('|').any(|n| n == "exploding") {
        runtime.block_on(exploding_joins(scale));
    }
    if only.is_empty() || only.split('|').any(|n| n == "passes") {
        runtime.block_on(build_twice_the_budget(build_keys, probe_keys, &settings));
    }
    if rows.is_empty() {
        return;
    }
    println!(
        "\nmedian (ms) over the measured runs; GB up / down = what the join moved; PCIe floor = the larger of the \
         workload's input bytes (up) and output bytes (down) / 55 GB/s; host floor = one copy \
         of every input byte on every core; transfer floor = that copy into pinned slots with each slot's upload, \
         while the output's bytes come down; planning = the query's planning in each session, part of its time; \
         aggregation alone = DataFusion's aggregation of the query over the join's output in memory"
    );
    println!(
        "| workload | DataFusion | GPU session | speed-up | GPU join alone | first output | GB up | GB down | PCIe floor \
         | join / floor | host floor | transfer floor | planning (DataFusion / GPU) | aggregation alone | output rows |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "| {} | {:.0} | {:.0} | {:.1}x | {:.0} | {:.0} | {:.2} | {:.2} | {:.0} | {:.2} | {:.0} | {:.0} | {:.0} / {:.0} | {:.0} | {} |",
            row.workload,
            ms(row.datafusion),
            ms(row.gpu),
            row.datafusion.as_secs_f64() / row.gpu.as_secs_f64(),
            ms(row.join),
            ms(row.first_output),
            row.up as f64 / 1e9,
            row.down as f64 / 1e9,
            ms(row.pcie_floor),
            row.join.as_secs_f64() / row.pcie_floor.as_secs_f64(),
            ms(row.host_floor),
            ms(row.transfer_floor),
            ms(row.planning[0]),
            ms(row.planning[1]),
            ms(row.aggregation),
            row.rows
        );
    }
}

/// Checks that both sessions give the same result (the first, warm-up run),
/// then times `runs` more runs of each, the sessions taking turns; the
/// medians.
async fn checked_medians(
    label: &str,
    cpu: &SessionContext,
    gpu: &SessionContext,
    query: &str,
    runs: usize,
) -> (Duration, Duration) {
    let (_, expected) = run_query(cpu, query).await;
    let (_, actual) = run_query(gpu, query).await;
    assert_eq!(expected, actual, "{label}: the GPU session's result differs from DataFusion's");
    let (mut cpu_runs, mut gpu_runs) = (vec![], vec![]);
    for _ in 0..runs {
        cpu_runs.push(run_query(cpu, query).await.0);
        gpu_runs.push(run_query(gpu, query).await.0);
    }
    (median(cpu_runs), median(gpu_runs))
}

/// The narrow join planned as a sort-merge join whose order an aggregate
/// streams over: DataFusion sorts both sides and merges on the CPU; the GPU
/// session sorts and joins on the device, in the same order (median of 5
/// runs after one, the sessions taking turns).
async fn sort_merge_order_relied_on(build_keys: Vec<i32>, probe_keys: Vec<i32>) {
    let (build_rows, probe_rows) = (build_keys.len(), probe_keys.len());
    let (r, s) = (Arc::new(table("p", build_keys, 1).0), Arc::new(table("q", probe_keys, 1).0));
    let (cpu, gpu) = (session(false, &r, &s), session(true, &r, &s));
    for ctx in [&cpu, &gpu] {
        let setting = "set datafusion.optimizer.prefer_hash_join = false";
        ctx.sql(setting).await.expect("a setting").collect().await.expect("set");
    }
    let query = "select count(*), sum(total), sum(k) from \
                 (select r.k, sum(s.q1) as total from r join s on r.k = s.k group by r.k)";
    let explain = |ctx: SessionContext| async move {
        let plan = ctx.sql(query).await.expect("planned").create_physical_plan().await.expect("a plan");
        datafusion::physical_plan::displayable(plan.as_ref()).indent(true).to_string()
    };
    let (cpu_plan, gpu_plan) = (explain(cpu.clone()).await, explain(gpu.clone()).await);
    assert!(cpu_plan.contains("SortMergeJoinExec"), "DataFusion plans no sort-merge join:\n{cpu_plan}");
    assert!(
        gpu_plan.contains("output_ordering=[") && !gpu_plan.contains("SortExec"),
        "the GPU join does not keep the sort-merge order without sorts:\n{gpu_plan}"
    );
    let (cpu_time, gpu_time) = checked_medians("ordered", &cpu, &gpu, query, 5).await;
    println!("ordered: GPU plan:\n{gpu_plan}");
    let (cpu_ms, gpu_ms) = (cpu_time.as_secs_f64() * 1e3, gpu_time.as_secs_f64() * 1e3);
    println!(
        "\nsort-merge join whose order an aggregate relies on ({build_rows} build rows, {probe_rows} probe rows):"
    );
    println!("| DataFusion (SortMergeJoinExec) | GPU session (GpuJoinExec in key order) | speed-up | result |");
    println!("|---|---|---|---|");
    println!("| {cpu_ms:.0} ms | {gpu_ms:.0} ms | {:.1}x | equal to DataFusion's |", cpu_ms / gpu_ms);
}

/// Joins whose pairs outgrow one match call, each query timed in both
/// sessions (median of 5 runs after one, the sessions taking turns).
async fn exploding_joins(scale: usize) {
    let (equal, probe, build) = (6000 / scale.min(6000), 10_000_000 / scale, 1000);
    let tables = [
        format!("create table a as select 7 as k, value as p from generate_series(1, {equal})"),
        format!("create table b as select 7 as k, value as q from generate_series(1, {equal})"),
        format!(
            "create table f as select case when value % 2 = 0 then 7 else value end as k, value as p \
             from generate_series(1, {probe})"
        ),
        format!("create table d as select 7 as k, value as q from generate_series(1, {build})"),
    ];
    let (cpu, gpu) = (session_without_tables(false), session_without_tables(true));
    for ctx in [&cpu, &gpu] {
        for statement in &tables {
            ctx.sql(statement).await.expect("a table").collect().await.expect("created");
        }
    }
    let queries = [
        ("left join, every key equal", "select count(*), sum(p), sum(q) from a left join b on a.k = b.k"),
        (
            "anti join, one key half the probe rows",
            "select count(*) from f where not exists (select 1 from d where d.k = f.k)",
        ),
        (
            "semi join, one key half the probe rows",
            "select count(*) from d where exists (select 1 from f where f.k = d.k)",
        ),
    ];
    println!(
        "\njoins whose pairs outgrow one match call ({equal} rows a side of equal keys; {probe} probe rows, half of one key, against {build} build rows):"
    );
    println!("| join | DataFusion | GPU session | speed-up | result |");
    println!("|---|---|---|---|---|");
    for (label, query) in queries {
        let (cpu_time, gpu_time) = checked_medians(label, &cpu, &gpu, query, 5).await;
        let (cpu_ms, gpu_ms) = (cpu_time.as_secs_f64() * 1e3, gpu_time.as_secs_f64() * 1e3);
        println!("| {label} | {cpu_ms:.0} ms | {gpu_ms:.0} ms | {:.1}x | equal to DataFusion's |", cpu_ms / gpu_ms);
    }
}

/// A star join over Parquet: the fact table `f` (2^26 rows, sorted by its
/// key, in row groups of DataFusion's default 1M rows) with the rows of one
/// band of 1/64 of the dimension `d`'s keys, picked by an attribute.
/// DataFusion's hash join hands the span of the build side's keys to `f`'s
/// scan, which skips the row groups outside it; so does the GPU join. Each
/// session also runs with `enable_join_dynamic_filter_pushdown` off: for
/// the GPU session that is what it did before it planted the filter. Median
/// of 5 runs after one, the sessions taking turns.
async fn probe_scan_pruned(scale: usize) {
    let rows = (1usize << 26) / scale;
    let dir = tempfile::tempdir().expect("a directory for the tables");
    let writer = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(PARTITIONS));
    let band = rows / 64;
    for (table, select) in [
        ("f", format!("select value as k, (value * 7) % 1000 as v from generate_series(0, {})", rows - 1)),
        (
            "d",
            format!(
                "select value as k, value / {band} as band, value % 100 as w from generate_series(0, {})",
                rows - 1
            ),
        ),
    ] {
        let path = dir.path().join(format!("{table}.parquet"));
        let copy = format!("copy ({select}) to '{}' stored as parquet", path.display());
        writer.sql(&copy).await.expect("a copy").collect().await.expect("written");
    }
    let off = "set datafusion.optimizer.enable_join_dynamic_filter_pushdown = false";
    let sessions =
        [("DataFusion", false, ""), ("GPU session", true, ""), ("DataFusion", false, off), ("GPU session", true, off)];
    let mut contexts = vec![];
    for (_, gpu, setting) in sessions {
        let ctx = session_without_tables(gpu);
        for table in ["f", "d"] {
            let path = dir.path().join(format!("{table}.parquet"));
            let create = format!("create external table {table} stored as parquet location '{}'", path.display());
            ctx.sql(&create).await.expect("a table").collect().await.expect("registered");
        }
        for statement in statements(setting) {
            ctx.sql(statement).await.expect("a setting").collect().await.expect("set");
        }
        contexts.push(ctx);
    }
    let query = "select count(*), sum(f.v), sum(d.w) from f join d on f.k = d.k where d.band = 17";
    let mut expected = None;
    let mut times = vec![vec![]; sessions.len()];
    let mut scanned = vec![0; sessions.len()];
    let mut joins = vec![String::new(); sessions.len()];
    for run in 0..6 {
        for (i, ctx) in contexts.iter().enumerate() {
            let plan = ctx.sql(query).await.expect("planned").create_physical_plan().await.expect("a plan");
            let start = Instant::now();
            let batches = datafusion::physical_plan::collect(Arc::clone(&plan), ctx.task_ctx()).await.expect("ran");
            let elapsed = start.elapsed();
            match &expected {
                None => expected = Some(batches),
                Some(expected) => assert_eq!(expected, &batches, "pruned: {} differs", sessions[i].0),
            }
            if run > 0 {
                times[i].push(elapsed);
            }
            scanned[i] = rows_scanned_from(&plan, "f.parquet");
            joins[i] = join_and_mode(&plan);
        }
    }
    println!(
        "
the probe scan pruned by the build side's key span ({rows} fact rows, {band} build rows):"
    );
    println!("| session | dynamic filter pushdown | ms (plan executed) | rows from f's scan | join |");
    println!("|---|---|---|---|---|");
    for (i, (name, _, setting)) in sessions.iter().enumerate() {
        let times = std::mem::take(&mut times[i]);
        println!(
            "| {name} | {} | {:.1} | {} | {} |",
            if setting.is_empty() { "on" } else { "off" },
            median(times).as_secs_f64() * 1e3,
            scanned[i],
            joins[i]
        );
    }
}

/// The plan's join operator and its mode, as EXPLAIN names them.
fn join_and_mode(plan: &Arc<dyn ExecutionPlan>) -> String {
    let line = datafusion::physical_plan::displayable(plan.as_ref()).one_line().to_string();
    let name = line.split(':').next().unwrap_or_default();
    if name.ends_with("JoinExec") {
        let mode = line.split("mode=").nth(1).and_then(|m| m.split(',').next()).unwrap_or_default();
        return format!("{name} {mode}");
    }
    plan.children().into_iter().map(join_and_mode).find(|found| !found.is_empty()).unwrap_or_default()
}

/// The rows the plan's scans of `file` handed on.
fn rows_scanned_from(plan: &Arc<dyn ExecutionPlan>, file: &str) -> usize {
    let line = datafusion::physical_plan::displayable(plan.as_ref()).one_line().to_string();
    let own = match line.starts_with("DataSourceExec") && line.contains(file) {
        true => plan.metrics().and_then(|m| m.output_rows()).unwrap_or(0),
        false => 0,
    };
    own + plan.children().into_iter().map(|child| rows_scanned_from(child, file)).sum::<usize>()
}

/// The narrow join with a device budget of half the build side's bytes;
/// `settings` (`GPU_JOIN_BENCH_SETTINGS`) apply after the bench's own.
async fn build_twice_the_budget(build_keys: Vec<i32>, probe_keys: Vec<i32>, settings: &str) {
    let build_bytes = build_keys.len() * 2 * size_of::<i32>();
    let budget = build_bytes / 2;
    let (r, s) = (Arc::new(table("p", build_keys, 1).0), Arc::new(table("q", probe_keys, 1).0));
    let (cpu, gpu) = (session(false, &r, &s), session(true, &r, &s));
    // Smaller chunks and fewer jobs at once leave the probe side room
    // next to two resident passes.
    for setting in [
        format!("set gpu_join.memory_limit = '{budget}'"),
        "set gpu_join.probe_chunk_rows = 1048576".into(),
        "set gpu_join.concurrent_tasks = 4".into(),
    ]
    .into_iter()
    .chain(statements(settings).map(String::from))
    {
        gpu.sql(&setting).await.expect("a setting").collect().await.expect("set");
    }
    let query = "select count(*), sum(p1), sum(q1) from r join s on r.k = s.k";
    let (cpu_time, gpu_time) = checked_medians("build twice the budget", &cpu, &gpu, query, 3).await;
    let plan = gpu.sql(query).await.expect("planned").create_physical_plan().await.expect("a plan");
    let join = find_join(&plan).expect("the join runs on the GPU");
    let streams = execute_stream_partitioned(Arc::clone(&join), gpu.task_ctx()).expect("streams");
    let tasks: Vec<_> =
        streams.into_iter().map(|mut s| tokio::spawn(async move { while s.next().await.is_some() {} })).collect();
    for task in tasks {
        task.await.expect("a partition");
    }
    let metrics = join.metrics().expect("metrics");
    let passes = metrics.sum_by_name("build_passes").map_or(0, |v| v.as_usize());
    println!("passes: GPU join metrics: {}", metrics.aggregate_by_name().sorted_for_display());
    println!("\nbuild side twice the device budget (narrow; budget {budget} bytes, build side {build_bytes} bytes):");
    println!("| DataFusion | GPU session | build passes | result |");
    println!("|---|---|---|---|");
    println!(
        "| {:.0} ms | {:.0} ms | {passes} | equal to DataFusion's |",
        cpu_time.as_secs_f64() * 1e3,
        gpu_time.as_secs_f64() * 1e3
    );
}

criterion_group!(benches, operator);
criterion_main!(benches);
