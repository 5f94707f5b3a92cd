//! The operator under load and under failure: concurrent queries on one
//! device, cancellation and allocation failures on one device and spread
//! over two, build sides joined in passes,
//! outputs beyond 2^31 rows, pinned memory from plenty to none, and build
//! sides held in the session's memory pool.

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::error::DataFusionError;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::physical_plan::{ExecutionPlan, execute_stream_partitioned};
use datafusion::prelude::{SessionConfig, SessionContext};
use futures::StreamExt;

use crate::common::{
    datafusion_context, devices_setting, gpu_context, join_metrics, run, sorted_rows, test_backend,
    test_backend_choice, test_options,
};
use datafusion_gpu_join::config::BackendChoice;
use datafusion_gpu_join::testing::InjectedAllocationFailures;
use datafusion_gpu_join::{GpuJoinExec, SessionStateBuilderExt};

const BUILD_ROWS: usize = 60_000;
const PROBE_ROWS: usize = 200_000;

/// Queries of different join types over duplicated, partly unmatched keys
/// with NULLs.
const QUERIES: [&str; 5] = [
    "select count(*), sum(p), sum(q) from r join s on r.k = s.k",
    "select count(*), sum(p), count(q) from r left join s on r.k = s.k",
    "select count(*), count(p), sum(q) from r right join s on r.k = s.k and p < q",
    "select count(*) from s where k in (select k from r)",
    "select count(*), sum(p) from r full join s on r.k = s.k",
];

fn config() -> SessionConfig {
    SessionConfig::new().with_target_partitions(4).with_batch_size(4096)
}

async fn create_tables(ctx: &SessionContext) {
    let r = format!(
        "create table r as select case when i % 97 = 0 then null else (i * 7) % 45000 end as k, i as p \
         from generate_series(1, {BUILD_ROWS}) t(i)"
    );
    let s = format!(
        "create table s as select case when i % 89 = 0 then null else (i * 13) % 60000 end as k, i % 1000 as q \
         from generate_series(1, {PROBE_ROWS}) t(i)"
    );
    run(ctx, &r).await;
    run(ctx, &s).await;
}

/// A GPU session with the tables, chunks small enough that every query
/// joins many of them.
async fn gpu_session(settings: &[&str]) -> SessionContext {
    gpu_session_failing(InjectedAllocationFailures::default(), settings).await
}

/// As [`gpu_session`], with device allocations that fail on purpose.
async fn gpu_session_failing(faults: InjectedAllocationFailures, settings: &[&str]) -> SessionContext {
    let ctx = gpu_context(config().with_extension(Arc::new(faults)));
    for setting in ["set gpu_join.probe_chunk_rows = 16384"].iter().chain(settings) {
        run(&ctx, setting).await;
    }
    create_tables(&ctx).await;
    ctx
}

/// The settings of a session on one device and of one spread over two.
fn device_settings() -> [String; 2] {
    ["set gpu_join.devices = 'one'".to_string(), format!("set gpu_join.devices = '{}'", devices_setting(2))]
}

async fn expected_results() -> Vec<Vec<String>> {
    let ctx = datafusion_context(config());
    create_tables(&ctx).await;
    let mut results = vec![];
    for query in QUERIES {
        results.push(sorted_rows(&run(&ctx, query).await));
    }
    results
}

/// Waits until the GPU join holds no more device memory than `level` and
/// the session's memory pool is empty; false after ten seconds.
async fn memory_returns_to(ctx: &SessionContext, level: u64) -> bool {
    let backend = test_backend();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if backend.device_memory_in_use() <= level && ctx.runtime_env().memory_pool.reserved() == 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_queries_share_the_device() {
    // GPU_JOIN_STRESS_SECONDS keeps the queries coming for that long.
    let seconds: u64 = std::env::var("GPU_JOIN_STRESS_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let expected = expected_results().await;
    let ctx = gpu_session(&["set gpu_join.concurrent_tasks = 2"]).await;
    let start_level = test_backend().device_memory_in_use();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut rounds = 0;
    loop {
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let (ctx, query) = (ctx.clone(), QUERIES[i % QUERIES.len()]);
                tokio::spawn(async move { sorted_rows(&run(&ctx, query).await) })
            })
            .collect();
        for (i, task) in tasks.into_iter().enumerate() {
            let rows = task.await.expect("a query task");
            assert_eq!(rows, expected[i % QUERIES.len()], "{} (round {rounds})", QUERIES[i % QUERIES.len()]);
        }
        rounds += 1;
        if Instant::now() >= deadline {
            break;
        }
    }
    println!("concurrent queries: {rounds} rounds of 16 on the {} backend", test_backend().name());
    assert!(memory_returns_to(&ctx, start_level).await, "device or host memory stayed held after the queries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancelled_join_frees_its_memory() {
    for devices in device_settings() {
        let ctx = gpu_session(&[&devices]).await;
        let start_level = test_backend().device_memory_in_use();
        for query in ["select p, q from r join s on r.k = s.k", "select p, q from r full join s on r.k = s.k"] {
            let mut stream = ctx.sql(query).await.expect("planned").execute_stream().await.expect("a stream");
            let first = stream.next().await.expect("a first batch").expect("no error");
            assert!(first.num_rows() > 0);
            drop(stream);
            assert!(memory_returns_to(&ctx, start_level).await, "{devices}, {query}: memory stayed held");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_join_cancelled_while_its_build_side_is_placed_frees_its_memory() {
    let ctx = gpu_session(&[]).await;
    let start_level = test_backend().device_memory_in_use();
    // Dropped at once and a little later: while the build side is being
    // collected, placed by its task, or already joined.
    for delay in [0, 1, 5, 20] {
        let query = "select p, q from r join s on r.k = s.k";
        let stream = ctx.sql(query).await.expect("planned").execute_stream().await.expect("a stream");
        tokio::time::sleep(Duration::from_millis(delay)).await;
        drop(stream);
        assert!(memory_returns_to(&ctx, start_level).await, "memory stayed held after cancelling at {delay} ms");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn allocation_failures_are_retried_or_fall_back() {
    let expected = expected_results().await;
    for devices in device_settings() {
        allocation_failures_on(&devices, &expected).await;
    }
}

async fn allocation_failures_on(devices: &str, expected: &[Vec<String>]) {
    // One failure per partition: the chunk is joined again, alone.
    let ctx = gpu_session_failing(InjectedAllocationFailures { probe: 1, ..Default::default() }, &[devices]).await;
    for (query, expected) in QUERIES.iter().zip(expected) {
        assert_eq!(&sorted_rows(&run(&ctx, query).await), expected, "{devices}, {query} after one failure");
        let [retries] = join_metrics(&ctx, query, ["out_of_memory_retries"]).await;
        assert!(retries.is_some_and(|r| r > 0), "{devices}, {query}: {retries:?} retries counted after a failure");
    }
    // Every probe allocation fails: chunks are split to the smallest size,
    // then handed to DataFusion's hash join where the join type allows it.
    let faults = InjectedAllocationFailures { probe: 1_000_000, ..Default::default() };
    let ctx = gpu_session_failing(faults, &[devices]).await;
    for (query, expected) in QUERIES.iter().zip(expected) {
        let result = ctx.sql(query).await.expect("planned").collect().await;
        let emits_build_rows = query.contains("left join") || query.contains("full join");
        match result {
            Ok(batches) => {
                assert!(!emits_build_rows, "{devices}, {query}: succeeded although every allocation fails");
                assert_eq!(&sorted_rows(&batches), expected, "{devices}, {query} on DataFusion's operator");
                // Dozens of pieces of at most 4,096 probe rows each, and one
                // hash table over each build side a device holds (a shared
                // one on each device, or one per partition of four) for all
                // of them.
                let [tables, retries] =
                    join_metrics(&ctx, query, ["host_fallback_tables", "out_of_memory_retries"]).await;
                let (tables, retries) = (tables.unwrap_or(0), retries.unwrap_or(0));
                assert!(
                    (1..=4).contains(&tables),
                    "{devices}, {query}: {tables} hash tables for DataFusion's operator"
                );
                assert!(retries > 8 * tables, "{devices}, {query}: {retries} retries over {tables} hash tables");
            }
            Err(e) => {
                let message = e.to_string();
                assert!(emits_build_rows || query.contains(" in "), "{devices}, {query}: {message}");
                assert!(message.contains("gpu_join.probe_chunk_rows"), "{devices}, {query}: no advice in {message}");
            }
        }
    }
}

fn find_join(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    match plan.is::<GpuJoinExec>() {
        true => Some(Arc::clone(plan)),
        false => plan.children().into_iter().find_map(find_join),
    }
}

/// Runs every query with `setting`, in both partition modes, and checks
/// DataFusion's rows: joins that can be split in at least `fewest_passes`
/// passes, the others (build rows emitted at the end) joined whole by
/// DataFusion's operator.
async fn assert_split_or_left_to_datafusion(
    faults: InjectedAllocationFailures,
    settings: &[&str],
    fewest_passes: usize,
) {
    let expected = expected_results().await;
    for collect in ["true", "false"] {
        let collect_setting = format!("set gpu_join.collect_build_side = {collect}");
        let session_settings = [
            &collect_setting,
            "set datafusion.optimizer.hash_join_single_partition_threshold = 0",
            "set datafusion.optimizer.hash_join_single_partition_threshold_rows = 0",
        ];
        let ctx = gpu_session_failing(faults, &[settings, &session_settings[..]].concat()).await;
        for (query, expected) in QUERIES.iter().zip(&expected) {
            let label = format!("{query} ({faults:?}, {settings:?}, collect_build_side = {collect})");
            assert_eq!(&sorted_rows(&run(&ctx, query).await), expected, "{label}");
            let [passes, loads] = join_metrics(&ctx, query, ["build_passes", "build_pass_loads"]).await;
            if query.contains("left join") || query.contains("full join") {
                assert!(passes.is_none_or(|p| p == 0), "{label}: split into {passes:?} passes");
            } else if query.contains(" join ") {
                assert!(passes.is_some_and(|p| p >= fewest_passes), "{label}: split into {passes:?} passes");
                // Every pass with probe rows is prepared at least once.
                assert!(loads.is_some_and(|l| l >= 1), "{label}: {loads:?} passes prepared");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn build_sides_split_into_passes_match_datafusion() {
    // 60,000 build rows in passes of at most 7,000: 16 passes in one build
    // side, 2 to 4 in each of 4 partitioned ones.
    let no_faults = InjectedAllocationFailures::default();
    assert_split_or_left_to_datafusion(no_faults, &["set gpu_join.build_pass_rows = 7000"], 2).await;
    // A `CollectLeft` join spread over two devices: the one build side is
    // split once, its passes held by the two devices in turn.
    let expected = expected_results().await;
    let devices = device_settings()[1].clone();
    let ctx = gpu_session(&["set gpu_join.build_pass_rows = 7000", &devices]).await;
    for (query, expected) in QUERIES.iter().zip(&expected) {
        assert_eq!(&sorted_rows(&run(&ctx, query).await), expected, "{devices}, {query}");
        let [passes] = join_metrics(&ctx, query, ["build_passes"]).await;
        if !query.contains("left join") && !query.contains("full join") {
            assert_eq!(passes, Some(16), "{devices}, {query}: 60,000 rows in passes of at most 7,000");
        }
    }
    // Partitions drained one after another still finish: none waits for
    // another to make progress, on one device or spread over two, where the
    // later devices take the build side the first partition collected.
    let reference = datafusion_context(config());
    create_tables(&reference).await;
    let expected = run(&reference, "select count(*) from r join s on r.k = s.k").await;
    let expected = expected[0].column(0).as_any().downcast_ref::<arrow::array::Int64Array>().expect("a count");
    for devices in device_settings() {
        let ctx = gpu_session(&["set gpu_join.build_pass_rows = 7000", &devices]).await;
        let plan = ctx.sql(QUERIES[0]).await.expect("planned").create_physical_plan().await.expect("a plan");
        let join = find_join(&plan).expect("the join runs on the GPU");
        let mut batches = vec![];
        for mut stream in execute_stream_partitioned(Arc::clone(&join), ctx.task_ctx()).expect("streams") {
            while let Some(batch) = stream.next().await {
                batches.push(batch.expect("a batch"));
            }
        }
        let count: usize = batches.iter().map(|b| b.num_rows()).sum();
        assert_eq!(count as i64, expected.value(0), "{devices}: rows of the join drained partition by partition");
        let build_rows = join.metrics().and_then(|m| m.sum_by_name("build_rows")).map(|rows| rows.as_usize());
        assert_eq!(build_rows, Some(BUILD_ROWS), "{devices}: the build side collected once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn build_sides_that_do_not_fit_after_all_are_split_or_left_to_datafusion() {
    // Estimated to fit, so probe chunks are staged while the build side is
    // prepared; its preparation then runs out of memory, shared and alone.
    let failing = InjectedAllocationFailures { build: 2, ..Default::default() };
    assert_split_or_left_to_datafusion(failing, &[], 4).await;
    // The same once the first preparation's probe plan is out (on the
    // reference backend): chunks loaded by it are dropped and joined in
    // passes with the rest.
    let after_plan = InjectedAllocationFailures { build: 2, build_spared: 1, ..Default::default() };
    assert_split_or_left_to_datafusion(after_plan, &[], 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn build_sides_prepared_again_alone_give_the_same_rows() {
    // The first preparation runs out of memory (on the reference backend,
    // after announcing its probe plan, by which probe chunks may already be
    // loading); the second, alone on the device, fits, and chunks loaded by
    // the first plan are loaded again by its own.
    let expected = expected_results().await;
    for collect in ["true", "false"] {
        let setting = format!("set gpu_join.collect_build_side = {collect}");
        let failing = InjectedAllocationFailures { build: 1, build_spared: 1, ..Default::default() };
        let ctx = gpu_session_failing(failing, &[setting.as_str()]).await;
        for (query, expected) in QUERIES.iter().zip(&expected) {
            let label = format!("{query} (collect_build_side = {collect})");
            assert_eq!(&sorted_rows(&run(&ctx, query).await), expected, "{label}");
        }
        let [retries, passes] = join_metrics(&ctx, QUERIES[0], ["out_of_memory_retries", "build_passes"]).await;
        assert!(retries.is_some_and(|r| r >= 1), "{setting}: {retries:?} retries");
        assert!(passes.is_none_or(|p| p == 0), "{setting}: split into {passes:?} passes");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outputs_beyond_two_to_the_31_rows() {
    if test_backend_choice() != BackendChoice::Cuda {
        println!("skipped: 2^31 output rows are joined on the CUDA backend only (GPU_JOIN_TEST_BACKEND=cuda)");
        return;
    }
    let ctx = gpu_context(config());
    run(&ctx, "create table b as select 1 as k from generate_series(1, 65536)").await;
    run(&ctx, "create table p as select 1 as k from generate_series(1, 32769)").await;
    let batches = run(&ctx, "select count(*) from b join p on b.k = p.k").await;
    let count = batches[0].column(0).as_any().downcast_ref::<arrow::array::Int64Array>().expect("a count").value(0);
    assert_eq!(count, 65536 * 32769);
    assert!(count > 1 << 31);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_many_to_many_chunk_is_joined_in_pieces() {
    // Each probe row meets 257 build rows: the one chunk of 65,536 probe
    // rows makes more pairs than one match call makes (2^24), and is joined
    // in pieces, each piece's output sent before the next is joined.
    let tables = [
        "create table b as select i % 4 as k, i as p from generate_series(1, 1028) t(i)",
        "create table pr as select i % 4 as k, i % 7 as q from generate_series(1, 65536) t(i)",
    ];
    let query = "select count(*), sum(p), sum(q) from b join pr on b.k = pr.k";
    let config = SessionConfig::new().with_target_partitions(1).with_batch_size(8192);
    let reference = datafusion_context(config.clone());
    let ctx = gpu_context(config);
    run(&ctx, "set gpu_join.probe_chunk_rows = 65536").await;
    for table in tables {
        run(&reference, table).await;
        run(&ctx, table).await;
    }
    let expected = sorted_rows(&run(&reference, query).await);
    assert!(expected[0].starts_with(&format!("{}|", 65536 * 257)), "{expected:?}");
    assert_eq!(sorted_rows(&run(&ctx, query).await), expected);
    let [retries] = join_metrics(&ctx, query, ["out_of_memory_retries"]).await;
    assert!(retries.is_some_and(|r| r >= 1), "{retries:?} retries");
}

#[test]
fn threads_waiting_for_the_device_sleep() {
    use cudarc::driver::sys::{CUctx_flags, cuDevicePrimaryCtxGetState};
    if test_backend_choice() != BackendChoice::Cuda {
        println!("skipped: the wait policy is the CUDA backend's (GPU_JOIN_TEST_BACKEND=cuda)");
        return;
    }
    // Opens the device, as the first join of a process does.
    test_backend();
    let ordinal = test_options().device as i32;
    let device = cudarc::driver::result::device::get(ordinal).expect("the test device");
    let (mut flags, mut active) = (0u32, 0i32);
    // SAFETY: the device comes from cuDeviceGet; both outputs are live locals.
    unsafe { cuDevicePrimaryCtxGetState(device, &mut flags, &mut active) }
        .result()
        .expect("the primary context's state");
    assert_eq!(active, 1, "the device's primary context is not active");
    assert_eq!(
        flags & CUctx_flags::CU_CTX_SCHED_MASK as u32,
        CUctx_flags::CU_CTX_SCHED_BLOCKING_SYNC as u32,
        "threads waiting for the device would spin (context flags {flags:#x})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pinned_memory_of_any_size_gives_the_same_rows() {
    // Columns of several MiB: probe chunks, the build side and outputs are
    // assembled in and downloaded into pinned blocks while the pool has
    // room, and through staging buffers once it is spent or off.
    let tables = [
        "create table r as select case when i % 101 = 0 then null else (i * 7) % 500000 end as k, i as p \
         from generate_series(1, 600000) t(i)",
        "create table s as select (i * 13) % 700000 as k, i % 1000 as q from generate_series(1, 2000000) t(i)",
    ];
    let queries = [
        "select count(*), sum(p), sum(q), sum(p * q) from r join s on r.k = s.k",
        "select count(*), sum(p), count(q) from r full join s on r.k = s.k",
        "select count(*), sum(q) from r right join s on r.k = s.k and p % 3 = q % 3",
    ];
    let reference = datafusion_context(config());
    for table in tables {
        run(&reference, table).await;
    }
    // Room for everything, for a few blocks, and none.
    for pool in [8usize << 30, 16 << 20, 0] {
        let ctx = gpu_context(config());
        run(&ctx, "set gpu_join.probe_chunk_rows = 524288").await;
        run(&ctx, &format!("set gpu_join.pinned_pool_bytes = {pool}")).await;
        for table in tables {
            run(&ctx, table).await;
        }
        for query in queries {
            let expected = sorted_rows(&run(&reference, query).await);
            assert_eq!(sorted_rows(&run(&ctx, query).await), expected, "{query} with a {pool}-byte pinned pool");
        }
    }
}

/// A session whose memory pool holds `bytes`, with the GPU join or
/// without it.
fn session_with_memory(bytes: usize, gpu_join: bool) -> SessionContext {
    let runtime = RuntimeEnvBuilder::new().with_memory_limit(bytes, 1.0).build_arc().expect("a runtime");
    let builder = SessionStateBuilder::new()
        .with_default_features()
        .with_config(config().with_option_extension(test_options()))
        .with_runtime_env(runtime);
    let state = match gpu_join {
        true => builder.with_gpu_join().build(),
        false => builder.build(),
    };
    SessionContext::new_with_state(state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn build_sides_are_held_in_the_sessions_memory_pool() {
    // The build side, read by a task per partition of r, is counted in the
    // session's pool as it is read: a pool too small for it stops the join
    // for want of memory, as it stops DataFusion's, and one large enough
    // is empty again once the rows are out.
    let query = "select r.k, p, q from r join s on r.k = s.k";
    for gpu_join in [false, true] {
        let ctx = session_with_memory(256 << 10, gpu_join);
        create_tables(&ctx).await;
        let error = ctx.sql(query).await.expect("planned").collect().await.expect_err("a join over the pool's limit");
        assert!(matches!(error.find_root(), DataFusionError::ResourcesExhausted(_)), "{error}");
        if gpu_join {
            // The pool names the consumer that asked for more.
            assert!(error.to_string().contains("for GpuJoinBuild["), "not the build side's reservation: {error}");
        }
    }
    let (ctx, reference) = (session_with_memory(256 << 20, true), session_with_memory(256 << 20, false));
    create_tables(&ctx).await;
    create_tables(&reference).await;
    let plan = ctx.sql(query).await.expect("planned").create_physical_plan().await.expect("a plan");
    assert!(find_join(&plan).is_some(), "the join runs on the GPU join");
    assert_eq!(sorted_rows(&run(&ctx, query).await), sorted_rows(&run(&reference, query).await));
    assert_eq!(ctx.runtime_env().memory_pool.reserved(), 0);
}
