//! TPC-H (or TPC-DS) through a DataFusion session with the GPU join.
//!
//! Generates the tables in memory, or as Parquet files, runs the 22 queries
//! and prints, per query, the time, the rows and where each join and aggregation ran.
//!
//! ```text
//! cargo run --release --example tpch -- [--sf 1] [--backend auto|cuda|cpu]
//!     [--queries 1,3,5] [--iterations 3] [--warmups 1] [--partitions 16] [--min-rows N] [--min-build-rows N]
//!     [--parquet DIR] [--tpcds QUERY_DIR] [--validate] [--compare] [--explain] [--plans]
//!     [--placements] [--pinned] [--workers N] [--duckdb SCRIPT] [--csv FILE] [--breakdown]
//!     [--set NAME=VALUE ...] [--variant NAME=VALUE ...]
//! ```
//!
//! A progress bar over the queries' runs shows on standard error where
//! that is a terminal; each query's line goes to standard output.
//!
//! `--tpcds QUERY_DIR` runs TPC-DS instead: its 24 tables generated (in
//! memory, or as Parquet files with `--parquet`), and the queries of the
//! `queryN.sql` files in `QUERY_DIR`, which TPC's query generator writes
//! (docs/benchmarks.md shows how). A query
//! that fails in the GPU session is a failed check, unless DataFusion alone
//! (with `--compare`) fails on it too: then it is reported and skipped.
//!
//! `--parquet DIR` writes the tables as Parquet files under `DIR` (one file
//! per partition, kept for the next run of the same workload, scale factor
//! and partitions) and reads them from there, as listing tables, instead of
//! holding them in memory. `--pinned` keeps the tables held in memory in
//! pinned memory (`gpu_join_pin_batches`), which the GPU join reads where
//! they lie; both sessions read the same pinned tables.
//!
//! Each session runs each query `--warmups` times (1 by default) before its
//! `--iterations` timed runs; `--warmups 0` times the first runs, for a
//! single pass over a workload too long to run twice.
//!
//! `--backend auto` (the default) uses CUDA when a device is usable and the
//! CPU reference backend otherwise. `--min-rows` is `gpu_join.min_rows` and
//! `--min-build-rows` is `gpu_join.min_build_rows`: the job's defaults, 0,
//! run every join the GPU join can take on it, so that the job checks them
//! all (a session's defaults, 10000000 and 262144, keep the joins of scale
//! factor 1 and the small build sides of larger ones on DataFusion). `--validate` checks every result
//! against the official answers (scale factor 1 only); `--compare` also
//! runs each query on DataFusion alone, the two sessions taking turns run
//! by run (each first every other time), checks that the rows are the same and
//! prints each session's median planning time (SQL to the physical plan); `--explain` prints each GPU join's line of EXPLAIN ANALYZE (its
//! strategy, the reason, and its metrics); `--plans` prints the whole
//! EXPLAIN ANALYZE of each query, DataFusion's too with `--compare`;
//! `--placements` only plans each query and prints where its joins and
//! aggregations go (the variant's too where they differ),
//! running none. `--set` sets another of the GPU
//! join's options (`gpu_join.NAME`, see docs/configuration.md), for
//! instance `--set probe_device_gather_ratio=0`, or, named in full, one of
//! DataFusion's in both sessions (`--set
//! datafusion.optimizer.enable_join_dynamic_filter_pushdown=false`). The
//! DataFusion session never runs the GPU join, whatever `--set enabled`
//! says; `--set enabled=false` makes both sessions DataFusion alone, so
//! that `--compare` measures how far two identical sessions differ.
//!
//! `--variant NAME=VALUE` (repeatable) runs a second GPU session beside the
//! first, with these `gpu_join` options on top of `--set`'s, taking turns
//! with the others run by run: its time and whether its rows are the GPU
//! session's on each line (`variant_ms` in the CSV file), so that one job
//! weighs an option against the defaults, and both against DataFusion.
//!
//! `--workers N` (with `--parquet`) makes both sessions coordinators of a
//! `datafusion-distributed` cluster of N workers on this host's loopback,
//! each session its own workers: the GPU session's join on this host's GPU
//! (docs/distributed.md), DataFusion's are plain workers. The single-node
//! GPU session runs beside them, and with `--compare` single-node
//! DataFusion too, each one's time and whether its rows are the GPU
//! cluster's on each line; each line also counts the joins the GPU
//! session's workers ran per run. `--set
//! distributed.NAME=VALUE` sets one of `datafusion-distributed`'s options
//! in both clusters (`--set distributed.file_scan_config_bytes_per_partition=1`
//! spreads even small scans over every worker).
//!
//! `--duckdb SCRIPT` (with `--parquet`) also runs each query on DuckDB, over
//! the same files on the same host: `SCRIPT` is `scripts/duckdb-queries.py`,
//! started once with the interpreter `PYTHON` names (`python3` without it),
//! which times the same statements, `--warmups` and then `--iterations` runs,
//! as the sessions are timed, query by query between theirs. DuckDB's rows
//! are counted, not compared. `--csv FILE` writes each query's figures to
//! `FILE` as well.
//!
//! `--breakdown` adds, for each session's last run of a query, the time
//! each kind of operator was at work, summed over its partitions (the scans'
//! decoding, the joins, the aggregates, …): where a query's time goes
//! besides its joins; and for the GPU joins, the bytes they moved to the
//! device and back and the time of each of their parts (collecting build
//! sides, staging probe chunks, materializing, …), and likewise for the GPU
//! aggregations (waiting for the device's admission, preparing keys and
//! arguments, grouping on the device, building the output); and the process's CPU
//! time over the run, every thread's, with the cores it kept busy on
//! average: a session that keeps fewer busy than the machine has waited
//! rather than computed.
//! On a cluster it counts every stage on every worker, as the workers
//! report their tasks' metrics (the scans of files spread over them are
//! `DistributedLeafExec`, the joins they ran on the GPU `GpuJoinExec`),
//! beside the coordinator's own part.

// Both sessions run on mimalloc, the allocator DataFusion's own command-line
// tool and benchmark runner are built with, so DataFusion is timed as its own
// benchmarks time it. The library itself sets no allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use datafusion::arrow::array::RecordBatch;
use datafusion::config::ExtensionOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_distributed::test_utils::localhost::{LocalHostWorkerResolver, spawn_worker_service};
use datafusion_distributed::{
    DefaultSessionBuilder, DistributedExt, SessionStateBuilderExt as _, WorkerSessionBuilder,
};
use datafusion_gpu_join::config::{BackendChoice, GpuJoinConfig};
use datafusion_gpu_join::distributed::{DistributedGpuJoinExt, GpuJoinWorker};
use datafusion_gpu_join::{AggregatePlacement, GpuJoinContextExt, Placement, SessionStateBuilderExt, backend};
use gpu_join_workloads::{self as workloads, is_query, tpcds, tpch};
use tokio::net::TcpListener;

mod duckdb;
mod report;

use duckdb::DuckDb;
use report::{QueryFigures, Report};

struct Args {
    scale_factor: f64,
    backend: BackendChoice,
    queries: Vec<usize>,
    iterations: usize,
    /// Untimed runs of each query before the timed ones.
    warmups: usize,
    partitions: usize,
    min_rows: usize,
    min_build_rows: usize,
    validate: bool,
    compare: bool,
    explain: bool,
    plans: bool,
    placements: bool,
    /// The in-memory tables kept in pinned memory.
    pinned: bool,
    /// Where the Parquet files go; the tables are held in memory without it.
    parquet: Option<PathBuf>,
    /// Where TPC-DS's query files are; TPC-H runs without it.
    tpcds: Option<PathBuf>,
    /// Other `gpu_join` options, by name without the prefix.
    settings: Vec<(String, String)>,
    /// The options of a second GPU session, on top of `settings`.
    variant: Vec<(String, String)>,
    /// Workers of each session's cluster; none: single-node sessions.
    workers: usize,
    /// `scripts/duckdb-queries.py`, to run each query on DuckDB too.
    duckdb: Option<PathBuf>,
    /// Where each query's figures are written as CSV.
    csv: Option<PathBuf>,
    /// Each session's time by operator, per query.
    breakdown: bool,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        scale_factor: 1.0,
        backend: BackendChoice::Auto,
        queries: vec![],
        iterations: 1,
        warmups: 1,
        partitions: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        min_rows: 0,
        min_build_rows: 0,
        validate: false,
        compare: false,
        explain: false,
        plans: false,
        placements: false,
        pinned: false,
        parquet: None,
        tpcds: None,
        settings: vec![],
        variant: vec![],
        workers: 0,
        duckdb: None,
        csv: None,
        breakdown: false,
    };
    let mut it = std::env::args().skip(1);
    let bad = |what: &str| {
        DataFusionError::Configuration(format!(
            "bad value for {what}; see the usage at the top of examples/tpch/main.rs"
        ))
    };
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| bad(&arg));
        match arg.as_str() {
            "--sf" => args.scale_factor = value()?.parse().map_err(|_| bad("--sf"))?,
            "--backend" => args.backend = value()?.parse()?,
            "--queries" => {
                args.queries = value()?
                    .split(',')
                    .map(|q| q.trim().parse().map_err(|_| bad("--queries")))
                    .collect::<Result<_>>()?
            }
            "--iterations" => args.iterations = value()?.parse().map_err(|_| bad("--iterations"))?,
            "--warmups" => args.warmups = value()?.parse().map_err(|_| bad("--warmups"))?,
            "--partitions" => args.partitions = value()?.parse().map_err(|_| bad("--partitions"))?,
            "--min-rows" => args.min_rows = value()?.parse().map_err(|_| bad("--min-rows"))?,
            "--min-build-rows" => args.min_build_rows = value()?.parse().map_err(|_| bad("--min-build-rows"))?,
            "--validate" => args.validate = true,
            "--compare" => args.compare = true,
            "--explain" => args.explain = true,
            "--plans" => args.plans = true,
            "--placements" => args.placements = true,
            "--pinned" => args.pinned = true,
            "--parquet" => args.parquet = Some(PathBuf::from(value()?)),
            "--tpcds" => args.tpcds = Some(PathBuf::from(value()?)),
            "--workers" => args.workers = value()?.parse().map_err(|_| bad("--workers"))?,
            "--duckdb" => args.duckdb = Some(PathBuf::from(value()?)),
            "--csv" => args.csv = Some(PathBuf::from(value()?)),
            "--breakdown" => args.breakdown = true,
            "--set" => {
                let setting = value()?;
                let (name, value) = setting.split_once('=').ok_or_else(|| bad("--set"))?;
                args.settings.push((name.trim().to_string(), value.trim().to_string()));
            }
            "--variant" => {
                let setting = value()?;
                let (name, value) = setting.split_once('=').ok_or_else(|| bad("--variant"))?;
                if prefix(name.trim()).is_some() {
                    return Err(DataFusionError::Configuration(format!(
                        "--variant {setting}: a variant sets gpu_join options, named without their prefix"
                    )));
                }
                args.variant.push((name.trim().to_string(), value.trim().to_string()));
            }
            other => return Err(bad(other)),
        }
    }
    if args.iterations == 0 {
        return Err(DataFusionError::Configuration(
            "--iterations must be at least 1: it is the number of timed runs".to_string(),
        ));
    }
    if args.pinned && args.parquet.is_some() {
        return Err(DataFusionError::Configuration(
            "--pinned keeps the tables held in memory in pinned memory; with --parquet none are".to_string(),
        ));
    }
    if args.workers > 0 && !args.variant.is_empty() {
        return Err(DataFusionError::Configuration(
            "--variant runs beside single-node sessions; leave out --workers".to_string(),
        ));
    }
    if args.workers > 0 && args.parquet.is_none() {
        return Err(DataFusionError::Configuration(
            "--workers needs --parquet: the workers read the tables from files".to_string(),
        ));
    }
    if args.duckdb.is_some() && args.parquet.is_none() {
        return Err(DataFusionError::Configuration(
            "--duckdb needs --parquet: DuckDB reads the tables from the files the sessions read".to_string(),
        ));
    }
    if args.queries.is_empty() {
        args.queries = match &args.tpcds {
            Some(dir) => tpcds::query_numbers(dir)?,
            None => (1..=22).collect(),
        };
    }
    Ok(args)
}

impl Args {
    /// The statements of query `query` of the workload.
    fn statements(&self, query: usize) -> Result<Vec<String>> {
        match &self.tpcds {
            Some(dir) => tpcds::statements(dir, query),
            None => tpch::statements(query, self.scale_factor),
        }
    }

    async fn run(&self, ctx: &SessionContext, query: usize) -> Result<Vec<RecordBatch>> {
        workloads::run_statements(ctx, &self.statements(query)?).await
    }

    /// The query's rows, the part of its time spent planning, and the CPU
    /// time of each kind of operator.
    async fn run_timed(&self, ctx: &SessionContext, query: usize) -> Result<workloads::Run> {
        workloads::run_statements_timed(ctx, &self.statements(query)?).await
    }
}

/// The options of the GPU session (`gpu`) or DataFusion's, with `extra`
/// `gpu_join` options on top of `--set`'s.
fn session_config(args: &Args, gpu: bool, extra: &[(String, String)]) -> Result<SessionConfig> {
    let mut options = GpuJoinConfig::default();
    options.backend = args.backend;
    options.min_rows = args.min_rows;
    options.min_build_rows = args.min_build_rows;
    let mut config = SessionConfig::new().with_target_partitions(args.partitions);
    for (name, value) in args.settings.iter().chain(extra) {
        match prefix(name) {
            Some("datafusion") => config.options_mut().set(name, value)?,
            // The clusters' own, set once their planner is in place.
            Some("distributed") => {}
            _ => options.set(name, value)?,
        }
    }
    // The settings are the GPU session's: DataFusion's own stays without
    // the GPU join even where they turn it on.
    options.enabled &= gpu;
    Ok(config.with_option_extension(options))
}

/// Whose option `name` of `--set` is: `datafusion`, `distributed`, or
/// none for the GPU join's, named without their prefix.
fn prefix(name: &str) -> Option<&str> {
    name.split_once('.').map(|(prefix, _)| prefix)
}

fn session(args: &Args, gpu: bool, extra: &[(String, String)]) -> Result<SessionContext> {
    let config = session_config(args, gpu, extra)?;
    let state = SessionStateBuilder::new().with_default_features().with_config(config).with_gpu_join().build();
    Ok(SessionContext::new_with_state(state))
}

/// `count` workers serving on this host's loopback; their ports.
async fn start_workers<B>(count: usize, builder: B) -> Result<Vec<u16>>
where
    B: WorkerSessionBuilder + Clone + Send + Sync + 'static,
{
    let mut ports = vec![];
    for _ in 0..count {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        ports.push(listener.local_addr()?.port());
        tokio::spawn(spawn_worker_service(builder.clone(), listener));
    }
    Ok(ports)
}

/// The coordinator of a cluster of `args.workers` workers: the GPU
/// session's, whose workers join on the GPU (returned, for their counts of
/// joins), or DataFusion's.
async fn cluster_session(args: &Args, gpu: bool) -> Result<(SessionContext, Option<GpuJoinWorker>)> {
    let builder = SessionStateBuilder::new().with_default_features().with_config(session_config(args, gpu, &[])?);
    let (builder, worker, ports) = match gpu {
        true => {
            let worker = GpuJoinWorker::new();
            let ports = start_workers(args.workers, worker.clone()).await?;
            (builder.with_distributed_gpu_join(), Some(worker), ports)
        }
        false => (builder.with_distributed_planner(), None, start_workers(args.workers, DefaultSessionBuilder).await?),
    };
    let mut state = builder.with_distributed_worker_resolver(LocalHostWorkerResolver::new(ports)).build();
    for (name, value) in args.settings.iter().filter(|(name, _)| prefix(name) == Some("distributed")) {
        state.config_mut().options_mut().set(name, value)?;
    }
    Ok((SessionContext::new_with_state(state), worker))
}

/// A session's median time of its timed runs, the median of their
/// planning, and its last run's result and time by operator.
struct Timing {
    time: Duration,
    planning: Duration,
    rows: Vec<RecordBatch>,
    operators: Vec<(String, Duration)>,
    gpu_joins: workloads::GpuWork,
    gpu_aggregates: workloads::GpuWork,
    /// The process's CPU time over the last run, and that run's time.
    busy: Option<(Duration, Duration)>,
}

/// Each session's timing of `iterations` runs after `warmups` untimed
/// ones. The sessions take turns run by run, each going first every other
/// time, so that neither gains from running after the other (warmer caches,
/// files, allocator).
async fn timed(sessions: &[&SessionContext], query: usize, args: &Args, report: &Report) -> Result<Vec<Timing>> {
    for _ in 0..args.warmups {
        for ctx in sessions {
            args.run_timed(ctx, query).await?;
            report.ran();
        }
    }
    let mut runs: Vec<Vec<workloads::Run>> = sessions.iter().map(|_| vec![]).collect();
    for iteration in 0..args.iterations {
        let mut turns: Vec<_> = sessions.iter().zip(&mut runs).collect();
        if iteration % 2 == 1 {
            turns.reverse();
        }
        for (ctx, runs) in turns {
            runs.push(args.run_timed(ctx, query).await?);
            report.ran();
        }
    }
    runs.into_iter()
        .map(|runs| {
            let times = runs.iter().map(|run| run.elapsed).collect();
            let plannings = runs.iter().map(|run| run.planning).collect();
            let last = runs.into_iter().last().ok_or_else(|| DataFusionError::Internal("no timed run".into()))?;
            Ok(Timing {
                time: median(times),
                planning: median(plannings),
                busy: last.process_cpu.map(|cpu| (cpu, last.elapsed)),
                rows: last.rows,
                operators: last.operators,
                gpu_joins: last.gpu_joins,
                gpu_aggregates: last.gpu_aggregates,
            })
        })
        .collect()
}

/// Whether `other` gave the rows `rows`; `differ` among the failures where
/// it did not.
fn same_rows(rows: &[RecordBatch], other: &Timing, differ: String, failures: &mut Vec<String>) -> Result<bool> {
    let same = workloads::comparable_rows(rows)? == workloads::comparable_rows(&other.rows)?;
    if !same {
        failures.push(differ);
    }
    Ok(same)
}

/// The operators that took at least 1% of a run's time at work, the largest
/// first, and the total.
fn by_operator(operators: &[(String, Duration)]) -> String {
    let total: Duration = operators.iter().map(|(_, time)| *time).sum();
    let mut parts: Vec<String> = operators
        .iter()
        .filter(|(_, time)| time.as_secs_f64() >= total.as_secs_f64() / 100.0)
        .map(|(name, time)| format!("{name} {:.2} s", time.as_secs_f64()))
        .collect();
    parts.push(format!("in all {:.2} s", total.as_secs_f64()));
    parts.join(", ")
}

/// The process's CPU time over a run, and the cores it kept busy on
/// average: well under the machine's cores, the session waited (for the
/// device, for a build side, for its slowest partition) rather than
/// computed.
fn cores_busy((cpu, elapsed): (Duration, Duration)) -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let busy = cpu.as_secs_f64() / elapsed.as_secs_f64().max(1e-9);
    format!("{:.2} s of CPU in {:.2} s, {busy:.1} of {cores} cores busy", cpu.as_secs_f64(), elapsed.as_secs_f64())
}

/// The bytes the GPU joins (or aggregations) moved each way, and their
/// timed parts that took at least 10 ms, the largest first. Some parts hold
/// others (a build side's preparation holds its transform), so they are not
/// added up.
fn gpu_work(work: &workloads::GpuWork) -> String {
    let mut parts: Vec<_> = work.parts.iter().collect();
    parts.sort_by(|a, b| b.1.cmp(a.1));
    let parts: Vec<String> = parts
        .into_iter()
        .filter(|(_, time)| time.as_secs_f64() >= 0.01)
        .map(|(name, time)| format!("{} {:.2} s", name.trim_end_matches("_time"), time.as_secs_f64()))
        .collect();
    format!(
        "{:.2} GB to the device, {:.2} GB back; time by part: {}",
        work.bytes_to_device as f64 / 1e9,
        work.bytes_from_device as f64 / 1e9,
        parts.join(", ")
    )
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times.get(times.len() / 2).copied().unwrap_or_default()
}

/// Where a query's joins and aggregations go, as a GPU session plans them.
#[derive(Default, PartialEq)]
struct Placements {
    on_gpu: Vec<String>,
    /// Each with the reason it stays.
    on_datafusion: Vec<String>,
    aggregates_on_gpu: Vec<String>,
    /// Each with the reason it stays.
    aggregates_on_datafusion: Vec<String>,
}

impl std::fmt::Display for Placements {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} joins on GPU join [{}], {} on DataFusion [{}]; {} aggregations on GPU [{}], {} on DataFusion [{}]",
            self.on_gpu.len(),
            self.on_gpu.join("; "),
            self.on_datafusion.len(),
            self.on_datafusion.join("; "),
            self.aggregates_on_gpu.len(),
            self.aggregates_on_gpu.join("; "),
            self.aggregates_on_datafusion.len(),
            self.aggregates_on_datafusion.join("; ")
        )
    }
}

async fn placements(ctx: &SessionContext, query: usize, args: &Args) -> Result<Placements> {
    let mut placed = Placements::default();
    for statement in args.statements(query)? {
        if !is_query(&statement) {
            // Q15's view must exist while its query is planned.
            ctx.sql(&statement).await?.collect().await?;
            continue;
        }
        for decision in ctx.gpu_join_decisions(&statement).await? {
            match decision.placement {
                Placement::Gpu { backend, algorithm } => {
                    placed.on_gpu.push(format!("{:?} {backend} {algorithm}", decision.join_type))
                }
                Placement::NotOnGpu(reason) => placed.on_datafusion.push(format!("{:?}: {reason}", decision.join_type)),
            }
        }
        for decision in ctx.gpu_aggregate_decisions(&statement).await? {
            match decision.placement {
                AggregatePlacement::Gpu { .. } => placed.aggregates_on_gpu.push(decision.to_string()),
                AggregatePlacement::NotOnGpu(_) => placed.aggregates_on_datafusion.push(decision.to_string()),
            }
        }
    }
    Ok(placed)
}

/// The variant's placements on a line of their own, where they differ from
/// the GPU session's `placed`.
async fn variant_placements(
    variant: &Option<SessionContext>,
    placed: &Placements,
    query: usize,
    args: &Args,
) -> Result<String> {
    let Some(variant) = variant else {
        return Ok(String::new());
    };
    let variant_placed = placements(variant, query, args).await?;
    Ok(if variant_placed == *placed { String::new() } else { format!("\n      variant: {variant_placed}") })
}

/// The lines of EXPLAIN ANALYZE for the query's statements.
async fn explain_analyze(ctx: &SessionContext, query: usize, args: &Args) -> Result<Vec<String>> {
    let mut lines = vec![];
    for statement in args.statements(query)? {
        if !is_query(&statement) {
            ctx.sql(&statement).await?.collect().await?;
            continue;
        }
        let batches = ctx.sql(&format!("EXPLAIN ANALYZE {statement}")).await?.collect().await?;
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)?.to_string();
        lines.extend(text.lines().map(|l| l.trim_matches(|c| c == '|' || c == ' ').to_string()));
    }
    Ok(lines)
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = parse_args()?;
    if args.backend == BackendChoice::Auto
        && let Err(why) = backend::cuda_backend(&GpuJoinConfig::default())
    {
        println!("no usable CUDA device ({why}); running on the CPU reference backend");
        args.backend = BackendChoice::Cpu;
    }
    if args.validate && (args.scale_factor != 1.0 || args.tpcds.is_some()) {
        return Err(DataFusionError::Configuration(
            "--validate needs TPC-H at --sf 1: the official answers are for scale factor 1".into(),
        ));
    }
    let start = Instant::now();
    let (gpu, cpu, single_node, workers) = match args.workers {
        0 => (session(&args, true, &[])?, session(&args, false, &[])?, vec![], None),
        _ => {
            let (gpu, workers) = cluster_session(&args, true).await?;
            // Each single-node session, and whether it is the GPU session.
            let mut single_node = vec![(true, session(&args, true, &[])?)];
            if args.compare {
                single_node.push((false, session(&args, false, &[])?));
            }
            (gpu, cluster_session(&args, false).await?.0, single_node, workers)
        }
    };
    let variant = match args.variant.is_empty() {
        true => None,
        false => Some(session(&args, true, &args.variant)?),
    };
    let mut files = None;
    let source = match &args.parquet {
        Some(dir) => {
            let folder = match &args.tpcds {
                Some(_) => tpcds::write_parquet(dir, args.scale_factor, args.partitions)?,
                None => tpch::write_parquet(dir, args.scale_factor, args.partitions)?,
            };
            for ctx in [&gpu, &cpu].into_iter().chain(single_node.iter().map(|(_, ctx)| ctx)).chain(&variant) {
                match &args.tpcds {
                    Some(_) => tpcds::register_parquet(ctx, &folder).await?,
                    None => tpch::register_parquet(ctx, &folder).await?,
                }
            }
            let source = format!("as Parquet files in {}", folder.display());
            files = Some(folder);
            source
        }
        None => {
            match &args.tpcds {
                Some(_) => tpcds::register_tables(&gpu, args.scale_factor, args.partitions)?,
                None => tpch::register_tables(&gpu, args.scale_factor, args.partitions)?,
            }
            if args.pinned {
                workloads::pin_tables(&gpu).await?;
            }
            workloads::share_tables(&gpu, &cpu).await?;
            if let Some(variant) = &variant {
                workloads::share_tables(&gpu, variant).await?;
            }
            match args.pinned {
                true => "in memory, pinned where a CUDA device joins them".to_string(),
                false => "in memory".to_string(),
            }
        }
    };
    println!(
        "{} SF {} {source}, made in {:.1} s; backend {}, {} partitions, median of {} runs after {} warm-up runs{}",
        if args.tpcds.is_some() { "TPC-DS" } else { "TPC-H" },
        args.scale_factor,
        start.elapsed().as_secs_f64(),
        args.backend,
        args.partitions,
        args.iterations,
        args.warmups,
        match args.workers {
            0 => String::new(),
            n => format!("; each session a cluster of {n} workers on this host"),
        }
    );
    let mut duckdb = match (&args.duckdb, &files) {
        (Some(script), Some(folder)) => Some(DuckDb::start(script, folder)?),
        _ => None,
    };
    if let Some(duckdb) = &duckdb {
        println!("DuckDB {} on the same files, between the sessions' turns", duckdb.version);
    }
    if variant.is_some() {
        let options: Vec<String> =
            args.variant.iter().map(|(name, value)| format!("gpu_join.{name} = {value}")).collect();
        println!("variant: a second GPU session with {}", options.join(", "));
    }
    let sessions_per_query = 1 + usize::from(variant.is_some()) + usize::from(args.compare) + single_node.len();
    let runs = match args.placements {
        true => 0,
        false => args.queries.len() * sessions_per_query * (args.warmups + args.iterations),
    };
    let mut report = Report::new(runs, args.csv.as_deref())?;
    let mut failures = vec![];
    for &query in &args.queries {
        report.start(query);
        if args.placements {
            let placed = placements(&gpu, query, &args).await?;
            report.line(&format!("Q{query:02} {placed}{}", variant_placements(&variant, &placed, query, &args).await?));
            continue;
        }
        let mut sessions = vec![&gpu];
        sessions.extend(&variant);
        if args.compare {
            sessions.push(&cpu);
        }
        sessions.extend(single_node.iter().map(|(_, ctx)| ctx));
        let joins_before = workers.as_ref().map(|w| (w.joins().on_gpu(), w.joins().on_datafusion()));
        let mut timings = match timed(&sessions, query, &args, &report).await {
            Ok(timings) => timings.into_iter(),
            Err(e) => {
                match args.compare && args.run(&cpu, query).await.is_err() {
                    true => report.line(&format!("Q{query:02} skipped: DataFusion alone fails on it too ({e})")),
                    false => {
                        report.line(&format!("Q{query:02} FAILED: {e}"));
                        failures.push(format!("Q{query}: {e}"));
                    }
                }
                continue;
            }
        };
        let Timing { time, planning, rows: batches, operators, gpu_joins, gpu_aggregates, busy } =
            timings.next().ok_or_else(|| DataFusionError::Internal("no timing".into()))?;
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        let mut figures = QueryFigures { query, gpu: time, rows, same_rows: true, ..Default::default() };
        let mut breakdowns = match args.breakdown {
            true => vec![("GPU session", operators, gpu_joins, gpu_aggregates, busy)],
            false => vec![],
        };
        let mut line = format!("Q{query:02} {:>9.1} ms {rows:>6} rows", time.as_secs_f64() * 1e3);
        if variant.is_some()
            && let Some(other) = timings.next()
        {
            let same = same_rows(&batches, &other, format!("Q{query}: rows differ from the variant's"), &mut failures)?;
            line.push_str(&format!(" | variant {:>9.1} ms, same rows: {same}", other.time.as_secs_f64() * 1e3));
            figures.variant = Some(other.time);
            figures.same_rows &= same;
            if args.breakdown {
                breakdowns.push(("variant", other.operators, other.gpu_joins, other.gpu_aggregates, other.busy));
            }
        }
        if args.compare
            && let Some(cpu) = timings.next()
        {
            let same = same_rows(&batches, &cpu, format!("Q{query}: rows differ from DataFusion's"), &mut failures)?;
            line.push_str(&format!(" | DataFusion {:>9.1} ms, same rows: {same}", cpu.time.as_secs_f64() * 1e3));
            line.push_str(&format!(
                " | planning {:.1} ms against {:.1}",
                planning.as_secs_f64() * 1e3,
                cpu.planning.as_secs_f64() * 1e3
            ));
            figures.datafusion = Some(cpu.time);
            figures.same_rows &= same;
            if args.breakdown {
                breakdowns.push(("DataFusion", cpu.operators, cpu.gpu_joins, cpu.gpu_aggregates, cpu.busy));
            }
        }
        for (&(on_gpu, _), single) in single_node.iter().zip(timings.by_ref()) {
            let name = if on_gpu { "GPU" } else { "DataFusion" };
            let differ = format!("Q{query}: rows differ from the single-node {name} session's");
            let same = same_rows(&batches, &single, differ, &mut failures)?;
            line.push_str(&format!(
                " | single-node {name} {:>9.1} ms, same rows: {same}",
                single.time.as_secs_f64() * 1e3
            ));
            match on_gpu {
                true => figures.single_node_gpu = Some(single.time),
                false => figures.single_node_datafusion = Some(single.time),
            }
            figures.same_rows &= same;
        }
        if let Some(duckdb) = &mut duckdb {
            let run = duckdb.run(&args.statements(query)?, args.warmups, args.iterations)?;
            match &run {
                Ok((time, rows)) => {
                    line.push_str(&format!(" | DuckDB {:>9.1} ms {rows:>6} rows", time.as_secs_f64() * 1e3))
                }
                Err(error) => line.push_str(&format!(" | DuckDB failed: {error}")),
            }
            figures.duckdb = Some(run);
        }
        if let (Some(workers), Some((gpu_before, datafusion_before))) = (&workers, joins_before) {
            let runs = args.warmups + args.iterations;
            figures.joins_on_gpu = (workers.joins().on_gpu() - gpu_before) / runs;
            figures.joins_on_datafusion = (workers.joins().on_datafusion() - datafusion_before) / runs;
            line.push_str(&format!(
                " | joins per run on the workers: {} GPU, {} DataFusion",
                figures.joins_on_gpu, figures.joins_on_datafusion
            ));
        }
        if args.validate {
            match tpch::check_official_answer(query, &batches)? {
                Ok(()) => line.push_str(" | official answer: ok"),
                Err(why) => {
                    line.push_str(" | official answer: MISMATCH");
                    failures.push(why);
                }
            }
        }
        if args.workers == 0 {
            let placed = placements(&gpu, query, &args).await?;
            (figures.joins_on_gpu, figures.joins_on_datafusion) = (placed.on_gpu.len(), placed.on_datafusion.len());
            line.push_str(&format!("\n      {placed}{}", variant_placements(&variant, &placed, query, &args).await?));
        }
        for (session, operators, gpu_joins, gpu_aggregates, busy) in &breakdowns {
            line.push_str(&format!("\n      {session}, time by operator: {}", by_operator(operators)));
            if let Some(busy) = busy {
                line.push_str(&format!("\n      {session}, the process: {}", cores_busy(*busy)));
            }
            if !gpu_joins.parts.is_empty() {
                line.push_str(&format!("\n      {session}, GPU joins: {}", gpu_work(gpu_joins)));
            }
            if !gpu_aggregates.parts.is_empty() {
                line.push_str(&format!("\n      {session}, GPU aggregations: {}", gpu_work(gpu_aggregates)));
            }
        }
        if args.explain {
            for explained in explain_analyze(&gpu, query, &args).await? {
                if explained.contains("GpuJoinExec") {
                    line.push_str(&format!("\n      {explained}"));
                }
            }
        }
        if args.plans {
            let mut sessions = vec![("GPU session", &gpu)];
            if args.compare {
                sessions.push(("DataFusion", &cpu));
            }
            for (name, ctx) in sessions {
                line.push_str(&format!("\n      {name}'s plan:"));
                for explained in explain_analyze(ctx, query, &args).await? {
                    line.push_str(&format!("\n        {explained}"));
                }
            }
        }
        report.line(&line);
        report.figures(&figures)?;
    }
    report.finish();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(DataFusionError::Execution(format!("{} checks failed:\n{}", failures.len(), failures.join("\n"))))
    }
}
