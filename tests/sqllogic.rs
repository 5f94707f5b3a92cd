//! sqllogictest suites through a session with the GPU join rule on.
//!
//! * The project's own files (`sqllogictests/*.slt`) run three times: with
//!   the rule on, every record must pass, EXPLAIN plans included; with
//!   `gpu_join.enabled = false`, every record but EXPLAIN must pass, which
//!   proves the expected results are DataFusion's own answers; and through
//!   the coordinator of a `datafusion-distributed` cluster of three GPU join
//!   workers on the loopback, every record but EXPLAIN must pass.
//! * DataFusion's join suites, from the `datafusion-sqllogictest` crate, run
//!   with the rule on. **Rule for EXPLAIN records:** their plan text is not
//!   compared, since `GpuJoinExec` legitimately replaces `HashJoinExec`;
//!   each one is still executed and must succeed (or fail, where an error is
//!   expected), and the harness reports how many there were and how many
//!   plans show `GpuJoinExec`. Every other record must pass.
//! * Records that read `window_2.csv`, a data file of DataFusion's repository
//!   that no published crate ships, run when `DATAFUSION_CORE_TEST_DATA`
//!   names a directory holding it, and are otherwise skipped and listed.
//!
//! `GPU_JOIN_SLT_COMPLETE=1` rewrites the project's files with the results
//! of the GPU session (then review the diff; the second run checks them).
//! The suites run in a fresh temporary directory, so plans that print file
//! paths mark the directory part with `<slt:ignore>`.

use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::ListingOptions;
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu_join::SessionStateBuilderExt;
use datafusion_sqllogictest::{DataFusion, TestContext, df_value_validator, setup_scratch_dir, value_normalizer};
use sqllogictest::{QueryExpect, Record, Runner, parse_file, strict_column_validator};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common::{gpu_context, test_options};
use crate::distributed;
use datafusion_distributed::DistributedExec;
use datafusion_gpu_join::distributed::GpuJoinWorker;

/// DataFusion's join suites named by the foundation issue.
const DATAFUSION_SUITES: [&str; 8] = [
    "joins.slt",
    "join_only.slt",
    "join_disable_repartition_joins.slt",
    "join_is_not_distinct_from.slt",
    "null_aware_anti_join.slt",
    "join_limit_pushdown.slt",
    "lateral_join.slt",
    "sort_merge_join.slt",
];

/// Files the suites include.
const INCLUDED_FILES: [&str; 1] = ["join.slt.part"];

/// A data file some suites read.
const OPTIONAL_DATA_FILE: &str = "window_2.csv";

type DFRecord = Record<datafusion_sqllogictest::DFColumnType>;

#[derive(Default)]
struct Outcome {
    records: usize,
    explains: usize,
    explains_on_gpu: usize,
    skipped: Vec<String>,
    failures: Vec<String>,
    /// Queries a distributed session split into stages.
    distributed: usize,
}

fn is_explain(sql: &str) -> bool {
    sql.lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with("--"))
        .is_some_and(|line| line.to_ascii_lowercase().starts_with("explain"))
}

/// The table a `CREATE [EXTERNAL] TABLE [IF NOT EXISTS] name` statement creates.
fn created_table(sql: &str) -> Option<String> {
    let words: Vec<&str> = sql.split_whitespace().collect();
    let create = words.first().is_some_and(|w| w.eq_ignore_ascii_case("create"));
    let table = words.iter().position(|w| w.eq_ignore_ascii_case("table"))?;
    let mut name = table + 1;
    if words.get(name).is_some_and(|w| w.eq_ignore_ascii_case("if")) {
        name += 3;
    }
    create.then(|| words.get(name).map(|w| w.trim_end_matches('(').to_string())).flatten()
}

fn record_sql(record: &DFRecord) -> Option<&str> {
    match record {
        Record::Statement { sql, .. } | Record::Query { sql, .. } => Some(sql),
        _ => None,
    }
}

fn record_location(record: &DFRecord) -> String {
    match record {
        Record::Statement { loc, .. } | Record::Query { loc, .. } => loc.to_string(),
        _ => String::new(),
    }
}

fn runner(
    ctx: &SessionContext,
    relative_path: &Path,
) -> Runner<DataFusion, impl sqllogictest::MakeConnection<Conn = DataFusion>> {
    let (ctx, relative_path) = (ctx.clone(), relative_path.to_path_buf());
    let mut runner = Runner::new(move || {
        let (ctx, relative_path) = (ctx.clone(), relative_path.clone());
        async move { Ok(DataFusion::new(ctx, relative_path, indicatif::ProgressBar::hidden())) }
    });
    runner.add_label("Datafusion");
    runner.with_column_validator(strict_column_validator);
    runner.with_normalizer(value_normalizer);
    runner.with_validator(df_value_validator);
    runner
}

/// How EXPLAIN records of a run are treated.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Explains {
    /// Compared like any other record.
    Compare,
    /// Executed and counted; their expected plans are not compared.
    ExecuteOnly,
    /// Not run: the reference run of the project's files, whose plans show
    /// `GpuJoinExec`.
    Skip,
}

/// Where the tables a file creates live.
#[derive(Clone, Copy)]
enum Tables<'a> {
    /// In memory, as created.
    AsCreated,
    /// Each written, once created, as Parquet files under this folder and
    /// read from there: the scans a distributed plan spreads over workers.
    InFiles(&'a Path),
}

/// Whether `sql` plans, in a distributed session, as stages on workers.
async fn is_distributed(ctx: &SessionContext, sql: &str) -> bool {
    match ctx.sql(sql).await {
        Ok(df) => df.create_physical_plan().await.is_ok_and(|plan| plan.is::<DistributedExec>()),
        Err(_) => false,
    }
}

/// Replaces the in-memory table `table` with one reading its rows from
/// Parquet files under `folder`.
async fn move_to_files(ctx: &SessionContext, folder: &Path, table: &str) -> datafusion::error::Result<()> {
    let location = folder.join(table);
    std::fs::create_dir_all(&location)?;
    let schema = ctx.table(table).await?.schema().inner().clone();
    let url = format!("{}/", location.display());
    for sql in [format!("COPY {table} TO '{url}' STORED AS PARQUET"), format!("DROP TABLE {table}")] {
        ctx.sql(&sql).await?.collect().await?;
    }
    // The schema given, since a table without rows leaves no file to read
    // it from.
    let options = ListingOptions::new(Arc::new(ParquetFormat::default())).with_file_extension(".parquet");
    ctx.register_listing_table(table, url, options, Some(schema), None).await
}

async fn run_file(
    ctx: &SessionContext,
    path: &Path,
    relative_path: &Path,
    explains: Explains,
    missing_data: bool,
    tables: Tables<'_>,
) -> Outcome {
    let mut outcome = Outcome::default();
    let records: Vec<DFRecord> = match parse_file(path) {
        Ok(records) => records,
        Err(e) => {
            outcome.failures.push(format!("{}: cannot parse: {e}", path.display()));
            return outcome;
        }
    };
    let mut runner = runner(ctx, relative_path);
    // Tables loaded from the missing data file; records reading them are skipped too.
    let mut missing_tables = vec![OPTIONAL_DATA_FILE.to_string()];
    for record in records {
        if let Record::Halt { .. } = record {
            break;
        }
        let Some(sql) = record_sql(&record).map(str::to_string) else {
            // Conditions, comments, hash thresholds and the like.
            let _ = runner.run_async(record).await;
            continue;
        };
        if missing_data && missing_tables.iter().any(|t| sql.contains(t.as_str())) {
            missing_tables.extend(created_table(&sql));
            outcome.skipped.push(format!("{}: reads {}", record_location(&record), OPTIONAL_DATA_FILE));
            continue;
        }
        outcome.records += 1;
        let expects_error = matches!(&record, Record::Query { expected: QueryExpect::Error(_), .. });
        if is_explain(&sql) && !expects_error && explains != Explains::Compare {
            outcome.explains += 1;
            if explains == Explains::Skip {
                continue;
            }
            match ctx.sql(&sql).await {
                Ok(df) => match df.collect().await {
                    Ok(batches) => {
                        let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)
                            .map(|t| t.to_string())
                            .unwrap_or_default();
                        if text.contains("GpuJoinExec") {
                            outcome.explains_on_gpu += 1;
                        }
                    }
                    Err(e) => outcome.failures.push(format!("{}: EXPLAIN failed: {e}", record_location(&record))),
                },
                Err(e) => outcome.failures.push(format!("{}: EXPLAIN failed: {e}", record_location(&record))),
            }
            continue;
        }
        let location = record_location(&record);
        if matches!(tables, Tables::InFiles(_))
            && matches!(record, Record::Query { .. })
            && is_distributed(ctx, &sql).await
        {
            outcome.distributed += 1;
        }
        if let Err(e) = runner.run_async(record).await {
            outcome.failures.push(e.to_string());
            continue;
        }
        let in_memory = !sql.to_ascii_lowercase().contains("external");
        if let (Tables::InFiles(folder), Some(table), true) = (tables, created_table(&sql), in_memory)
            && let Err(e) = move_to_files(ctx, folder, &table).await
        {
            outcome.failures.push(format!("{location}: writing {table} to files: {e}"));
        }
    }
    outcome
}

/// The directory of the project's .slt files, as an absolute path.
fn project_slt_dir() -> PathBuf {
    let local = PathBuf::from("sqllogictests");
    let dir = if local.is_dir() { local } else { Path::new(env!("CARGO_MANIFEST_DIR")).join("sqllogictests") };
    dir.canonicalize().unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// `test_files/` of the `datafusion-sqllogictest` crate this project builds
/// with: `DATAFUSION_SQLLOGICTEST_FILES`, or found with `cargo metadata`.
fn datafusion_test_files() -> PathBuf {
    if let Ok(dir) = std::env::var("DATAFUSION_SQLLOGICTEST_FILES") {
        return PathBuf::from(dir);
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let output = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--manifest-path"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .output()
        .expect("cargo metadata runs; or set DATAFUSION_SQLLOGICTEST_FILES");
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
    let manifest = metadata["packages"]
        .as_array()
        .and_then(|packages| packages.iter().find(|p| p["name"] == "datafusion-sqllogictest"))
        .and_then(|p| p["manifest_path"].as_str())
        .expect("datafusion-sqllogictest is a dev-dependency");
    Path::new(manifest).parent().expect("manifest has a directory").join("test_files")
}

fn session_config() -> SessionConfig {
    SessionConfig::new().with_target_partitions(4)
}

async fn run_project_files(dir: &Path, report: &mut Vec<String>, failures: &mut Vec<String>) {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "slt"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .slt files in {}", dir.display());
    let complete = std::env::var("GPU_JOIN_SLT_COMPLETE").is_ok_and(|v| v == "1");
    let worker = GpuJoinWorker::new();
    let workers = distributed::start_workers(&worker).await;
    let (mut queries_on_cluster, mut distributed) = (0, 0);
    for path in files {
        let name = PathBuf::from(path.file_name().expect("file name"));
        setup_scratch_dir(&name).expect("scratch directory");
        if complete {
            let ctx = gpu_context(session_config());
            runner(&ctx, &name)
                .update_test_file(&path, " ", df_value_validator, value_normalizer, strict_column_validator)
                .await
                .unwrap_or_else(|e| panic!("completing {}: {e}", path.display()));
        }
        let on_gpu =
            run_file(&gpu_context(session_config()), &path, &name, Explains::Compare, false, Tables::AsCreated).await;
        let reference_ctx = gpu_context(session_config());
        reference_ctx.sql("SET gpu_join.enabled = false").await.expect("gpu_join.enabled is an option");
        let on_datafusion = run_file(&reference_ctx, &path, &name, Explains::Skip, false, Tables::AsCreated).await;
        let cluster = distributed::coordinator(session_config(), workers.clone(), false, true);
        let files = tempfile::tempdir().expect("a folder for the cluster's tables");
        let on_cluster =
            run_file(&cluster, &path, &name, Explains::ExecuteOnly, false, Tables::InFiles(files.path())).await;
        report.push(format!(
            "{}: {} records passed with the GPU join; {} of them, all but EXPLAIN, also on DataFusion alone and {} on a \
             cluster ({} queries there split into stages)",
            name.display(),
            on_gpu.records - on_gpu.failures.len(),
            on_datafusion.records - on_datafusion.explains - on_datafusion.failures.len(),
            on_cluster.records - on_cluster.explains - on_cluster.failures.len(),
            on_cluster.distributed,
        ));
        queries_on_cluster += on_cluster.records - on_cluster.explains;
        distributed += on_cluster.distributed;
        failures.extend(on_gpu.failures.into_iter().map(|f| format!("[GPU join] {f}")));
        failures.extend(on_datafusion.failures.into_iter().map(|f| format!("[DataFusion alone] {f}")));
        failures.extend(on_cluster.failures.into_iter().map(|f| format!("[cluster] {f}")));
    }
    // Tiny tables written as one file each: the planner spreads the scans
    // of some queries over the workers and keeps others on the coordinator.
    if distributed * 4 < queries_on_cluster || worker.joins().on_gpu() == 0 {
        failures.push(format!(
            "[cluster] {distributed} of {queries_on_cluster} records planned as stages; the workers ran {} GPU joins",
            worker.joins().on_gpu()
        ));
    }
}

/// Copies the suites into a scratch tree laid out like DataFusion's
/// repository, since their SQL names paths relative to it.
fn scratch_tree(test_files: &Path, core_data: Option<&Path>) -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("temporary directory");
    let files = root.path().join("sqllogictest").join("test_files");
    std::fs::create_dir_all(&files).expect("test_files directory");
    for name in DATAFUSION_SUITES.iter().chain(INCLUDED_FILES.iter()) {
        std::fs::copy(test_files.join(name), files.join(name)).unwrap_or_else(|e| panic!("copying {name}: {e}"));
    }
    if let Some(core_data) = core_data {
        let data = root.path().join("core").join("tests").join("data");
        std::fs::create_dir_all(&data).expect("data directory");
        std::fs::copy(core_data.join(OPTIONAL_DATA_FILE), data.join(OPTIONAL_DATA_FILE)).expect("copying test data");
    }
    root
}

async fn run_datafusion_suites(missing_data: bool, report: &mut Vec<String>, failures: &mut Vec<String>) {
    for name in DATAFUSION_SUITES {
        let relative = PathBuf::from(name);
        setup_scratch_dir(&relative).expect("scratch directory");
        let test_ctx = TestContext::try_new_for_test_file(&relative).await.expect("DataFusion test context");
        // The suite's own session (its tables, its settings) plus the GPU join.
        let mut builder = SessionStateBuilder::new_from_existing(test_ctx.session_ctx().state());
        if let Some(config) = builder.config() {
            config.options_mut().extensions.insert(test_options());
        }
        let state = builder.with_gpu_join().build();
        let ctx = SessionContext::new_with_state(state);
        let path = Path::new("test_files").join(name);
        let outcome = run_file(&ctx, &path, &relative, Explains::ExecuteOnly, missing_data, Tables::AsCreated).await;
        report.push(format!(
            "{name}: {} records passed; {} EXPLAIN records executed without comparing plans ({} show GpuJoinExec); {} skipped",
            outcome.records - outcome.failures.len() - outcome.explains,
            outcome.explains,
            outcome.explains_on_gpu,
            outcome.skipped.len(),
        ));
        for skipped in &outcome.skipped {
            report.push(format!("    skipped {skipped}"));
        }
        failures.extend(outcome.failures.into_iter().map(|f| format!("[{name}] {f}")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqllogictests_pass_with_the_gpu_join() {
    let (mut report, mut failures) = (vec![], vec![]);
    let project_files = project_slt_dir();
    let core_data = std::env::var("DATAFUSION_CORE_TEST_DATA")
        .ok()
        .map(PathBuf::from)
        .filter(|dir| dir.join(OPTIONAL_DATA_FILE).is_file());
    let tree = scratch_tree(&datafusion_test_files(), core_data.as_deref());
    // Suites read and write paths relative to this directory.
    let working_dir = tree.path().join("sqllogictest");
    std::env::set_current_dir(&working_dir).expect("enter the scratch tree");
    run_project_files(&project_files, &mut report, &mut failures).await;
    run_datafusion_suites(core_data.is_none(), &mut report, &mut failures).await;
    std::env::set_current_dir(env!("CARGO_MANIFEST_DIR")).ok();
    drop(tree);
    println!("{}", report.join("\n"));
    assert!(failures.is_empty(), "{} failing records:\n{}", failures.len(), failures.join("\n\n"));
}
