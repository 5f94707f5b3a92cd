//! Joins spread over several devices (`gpu_join.devices`): on the CPU
//! backend an instance of its own per device, on a GPU machine its one GPU
//! listed more than once. Every join gives DataFusion's rows, each
//! device's share shows in the join's metrics, and a list of devices that
//! cannot be used is refused with what to set.

use std::sync::Arc;

use arrow::array::{Int32Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::catalog::MemTable;
use datafusion::common::JoinType;
use datafusion::physical_plan::joins::PartitionMode;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu_join::config::{BackendChoice, DeviceList, GpuJoinConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::common::{
    datafusion_context, devices_setting, gpu_context_with, gpu_joins, physical_plan_text, sorted_rows,
    test_backend_choice, test_options,
};

const JOINS: [&str; 6] = [
    "SELECT l.k, l.v, r.w FROM l JOIN r ON l.k = r.k",
    "SELECT l.k, l.v, r.w FROM l LEFT JOIN r ON l.k = r.k",
    "SELECT l.k, l.v, r.w FROM l RIGHT JOIN r ON l.k = r.k",
    "SELECT l.k, l.v, r.w FROM l FULL JOIN r ON l.k = r.k",
    "SELECT l.k, l.v FROM l WHERE EXISTS (SELECT 1 FROM r WHERE r.k = l.k)",
    "SELECT r.k, r.w FROM r WHERE NOT EXISTS (SELECT 1 FROM l WHERE l.k = r.k)",
];

/// Tables `l` and `r` in three partitions each: keys repeating, a tenth of
/// them null, a third of `l` on one key.
fn tables(seed: u64) -> Vec<(&'static str, MemTable)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut table = |rows: usize, domain: i32, payload: &str| {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int32, true),
            match payload {
                "v" => Field::new("v", DataType::Utf8, false),
                _ => Field::new("w", DataType::Int32, false),
            },
        ]));
        let parts = (0..3)
            .map(|part| {
                let keys: Int32Array = (0..rows)
                    .map(|_| match rng.random_range(0..10) {
                        0 => None,
                        1..=3 if payload == "v" => Some(7),
                        _ => Some(rng.random_range(0..domain)),
                    })
                    .collect();
                let payload: Arc<dyn arrow::array::Array> = match payload {
                    "v" => Arc::new(StringArray::from_iter_values((0..rows).map(|i| format!("{part}-{i}")))),
                    _ => Arc::new(Int32Array::from_iter_values((0..rows as i32).map(|i| i * 3 + part))),
                };
                vec![RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(keys), payload]).expect("batch")]
            })
            .collect();
        MemTable::try_new(schema, parts).expect("table")
    };
    let l = table(1000 + rng_rows(seed), 500, "v");
    let r = table(1700, 600, "w");
    vec![("l", l), ("r", r)]
}

/// An odd number of rows, different per seed.
fn rng_rows(seed: u64) -> usize {
    (seed % 97) as usize * 2 + 1
}

/// The GPU session over `devices` and DataFusion's. DataFusion plans each
/// hash join `Partitioned` where `partitioned` says so, and otherwise, as
/// its build side is small, `CollectLeft`.
fn sessions(seed: u64, devices: &str, partitioned: bool) -> (SessionContext, SessionContext) {
    sessions_with(seed, devices, partitioned, GpuJoinConfig::default().build_pass_rows)
}

/// As [`sessions`], build sides split into passes of at most
/// `build_pass_rows` rows.
fn sessions_with(
    seed: u64,
    devices: &str,
    partitioned: bool,
    build_pass_rows: usize,
) -> (SessionContext, SessionContext) {
    let mut config = SessionConfig::new().with_target_partitions(4).with_batch_size(500);
    if partitioned {
        let optimizer = &mut config.options_mut().optimizer;
        optimizer.hash_join_single_partition_threshold = 0;
        optimizer.hash_join_single_partition_threshold_rows = 0;
    }
    let mut options = test_options();
    options.devices = devices.parse::<DeviceList>().expect("a list of devices");
    options.build_pass_rows = build_pass_rows;
    let gpu = gpu_context_with(config.clone(), options);
    let reference = datafusion_context(config);
    for ctx in [&gpu, &reference] {
        for (name, table) in tables(seed) {
            ctx.register_table(name, Arc::new(table)).expect("table registered");
        }
    }
    (gpu, reference)
}

/// What the one GPU join of an executed plan did: its mode, its output
/// rows, the passes its build side was split into, and the output rows and
/// build rows it counted on each device of `ordinals`.
struct Executed {
    mode: PartitionMode,
    join_type: JoinType,
    output_rows: usize,
    build_rows: usize,
    build_passes: usize,
    device_rows: Vec<Option<usize>>,
    device_build_rows: Vec<usize>,
}

/// Runs `sql` in both sessions, checks the rows are the same, and returns
/// what the GPU session's join did.
async fn same_rows(
    gpu: &SessionContext,
    reference: &SessionContext,
    sql: &str,
    seed: u64,
    ordinals: &[usize],
) -> Executed {
    let expected = reference.sql(sql).await.expect("plan").collect().await.expect("DataFusion runs it");
    let frame = gpu.sql(sql).await.expect("plan");
    let task = Arc::new(frame.task_ctx());
    let plan = frame.create_physical_plan().await.expect("physical plan");
    let actual = collect(Arc::clone(&plan), task).await.unwrap_or_else(|e| panic!("seed {seed}, {sql}: {e}"));
    assert_eq!(sorted_rows(&actual), sorted_rows(&expected), "seed {seed}: {sql}");
    let joins = gpu_joins(&plan);
    assert_eq!(joins.len(), 1, "seed {seed}, {sql}: one GPU join expected");
    let metrics = joins[0].metrics().expect("the join's metrics").aggregate_by_name();
    let sum = |name: &str| metrics.sum_by_name(name).map(|value| value.as_usize());
    Executed {
        mode: joins[0].partition_mode(),
        join_type: joins[0].join_type(),
        output_rows: metrics.output_rows().unwrap_or(0),
        build_rows: sum("build_rows").unwrap_or(0),
        build_passes: sum("build_passes").unwrap_or(0),
        device_rows: ordinals.iter().map(|ordinal| sum(&format!("device{ordinal}_output_rows"))).collect(),
        device_build_rows: ordinals
            .iter()
            .map(|ordinal| sum(&format!("device{ordinal}_build_rows")).unwrap_or(0))
            .collect(),
    }
}

fn fresh_seed() -> u64 {
    let seed = rand::rng().random();
    println!("GPU join devices test seed {seed}");
    seed
}

/// Over several devices a `Partitioned` join keeps its partitions, which
/// the GPU join collects into one build side on one device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_joins_spread_their_partitions_over_the_devices() {
    let seed = fresh_seed();
    let setting = devices_setting(3);
    let listed = setting_ordinals(&setting);
    let mut ordinals = listed.clone();
    ordinals.dedup();
    let (gpu, reference) = sessions(seed, &setting, true);
    for sql in JOINS {
        let plan = physical_plan_text(&gpu, sql).await;
        assert!(plan.contains(&format!("devices={listed:?}")), "{plan}");
        let join = same_rows(&gpu, &reference, sql, seed, &ordinals).await;
        assert_eq!(join.mode, PartitionMode::Partitioned, "{sql}");
        let shares: Vec<usize> = join.device_rows.iter().map(|rows| rows.unwrap_or(0)).collect();
        assert_eq!(shares.iter().sum::<usize>(), join.output_rows, "seed {seed}, {sql}: {shares:?}");
        if sql.contains(" JOIN r ") && test_backend_choice() != BackendChoice::Cuda {
            // Four partitions over three devices: every device has rows.
            assert!(shares.iter().all(|&rows| rows > 0), "seed {seed}, {sql}: {shares:?}");
        }
    }
}

/// Over several devices a `CollectLeft` join spreads its probe partitions
/// too, its one build side collected once and placed on each device; one
/// that keeps flags of its matched build rows runs on the first device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_of_one_build_side_spreads_unless_it_keeps_flags_of_its_build_rows() {
    let seed = fresh_seed();
    let setting = devices_setting(2);
    let mut ordinals = setting_ordinals(&setting);
    ordinals.dedup();
    let (gpu, reference) = sessions(seed, &setting, false);
    let table_rows = [3 * (1000 + rng_rows(seed)), 3 * 1700];
    for sql in JOINS {
        let join = same_rows(&gpu, &reference, sql, seed, &ordinals).await;
        assert_eq!(join.mode, PartitionMode::CollectLeft, "{sql}");
        assert!(table_rows.contains(&join.build_rows), "seed {seed}, {sql}: {} build rows", join.build_rows);
        let shares: Vec<usize> = join.device_rows.iter().map(|rows| rows.unwrap_or(0)).collect();
        assert_eq!(shares.iter().sum::<usize>(), join.output_rows, "seed {seed}, {sql}: {shares:?}");
        let keeps_flags = matches!(
            join.join_type,
            JoinType::Left | JoinType::Full | JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark
        );
        if test_backend_choice() != BackendChoice::Cuda {
            // The probe partitions take turns over the two devices, each
            // holding the whole build side.
            let built = &join.device_build_rows;
            match keeps_flags {
                true => {
                    assert_eq!(shares[1], 0, "seed {seed}, {sql}: {shares:?}");
                    assert_eq!(built, &[join.build_rows, 0], "seed {seed}, {sql}: build rows per device");
                }
                false => {
                    assert!(shares.iter().all(|&rows| rows > 0), "seed {seed}, {sql}: {shares:?}");
                    assert_eq!(built, &[join.build_rows; 2], "seed {seed}, {sql}: build rows per device");
                }
            }
        }
    }
}

/// A `CollectLeft` build side too large for one device is split once, by
/// a hash of its keys, over the devices: each holds its passes, the probe
/// rows of a pass go to the device that holds it, and every build row is
/// prepared on one device only. One that keeps flags of its build rows is
/// not split; DataFusion's operator joins it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_side_too_large_for_one_device_is_split_over_the_devices() {
    let seed = fresh_seed();
    for devices in [2, 3] {
        let setting = devices_setting(devices);
        let mut ordinals = setting_ordinals(&setting);
        ordinals.dedup();
        // At most two passes per device: none is evicted, so each is
        // prepared once.
        let (gpu, reference) = sessions_with(seed, &setting, false, 2000);
        for sql in JOINS {
            let join = same_rows(&gpu, &reference, sql, seed, &ordinals).await;
            assert_eq!(join.mode, PartitionMode::CollectLeft, "{sql}");
            let label = format!("seed {seed}, {devices} devices, {sql}");
            let built = &join.device_build_rows;
            if matches!(join.join_type, JoinType::Inner | JoinType::Right | JoinType::RightSemi | JoinType::RightAnti) {
                assert!(
                    join.build_passes >= devices && join.build_passes % devices == 0,
                    "{label}: {} passes, split once, as many per device",
                    join.build_passes
                );
                assert_eq!(built.iter().sum::<usize>(), join.build_rows, "{label}: {built:?}");
                if test_backend_choice() != BackendChoice::Cuda {
                    let (shares, held) = (&join.device_rows, |rows: usize| rows > 0 && rows < join.build_rows);
                    assert!(built.iter().all(|&rows| held(rows)), "{label}: each device holds a part: {built:?}");
                    assert!(shares.iter().all(|rows| rows.is_some_and(|r| r > 0)), "{label}: {shares:?}");
                }
            } else {
                assert_eq!(join.build_passes, 0, "{label}");
                assert_eq!(built.iter().sum::<usize>(), 0, "{label}: left to DataFusion's operator");
            }
        }
    }
}

/// One device keeps the join as it was: a `Partitioned` join collected
/// into one build side, no share metrics, no `devices=`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_device_shows_no_shares() {
    let seed = fresh_seed();
    let (gpu, reference) = sessions(seed, "one", true);
    let sql = JOINS[0];
    assert!(!physical_plan_text(&gpu, sql).await.contains("devices="));
    let join = same_rows(&gpu, &reference, sql, seed, &[0]).await;
    assert_eq!(join.mode, PartitionMode::CollectLeft);
    assert_eq!(join.device_rows, vec![None]);
    assert!(join.output_rows > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_that_cannot_be_used_are_refused() {
    let (gpu, _) = sessions(1, "one", true);
    let err = gpu.sql("SET gpu_join.devices = 'gpu0'").await.expect_err("not a list of devices").to_string();
    assert!(err.contains("gpu_join.devices") && err.contains("'0,1'"), "{err}");
    gpu.sql("SET gpu_join.devices = ' 1, 0 '").await.expect("a list of devices");
    let options = GpuJoinConfig::from_config(gpu.state().config().options());
    assert_eq!(options.devices, DeviceList::Ordinals(vec![1, 0]));
    if test_backend_choice() == BackendChoice::Cuda {
        // No machine has that many devices: planning a join says what to set.
        gpu.sql("SET gpu_join.devices = '0,4095'").await.expect("a list of devices");
        let err = gpu.sql(JOINS[0]).await.expect("logical plan").create_physical_plan().await.expect_err("no device");
        let err = err.to_string();
        assert!(err.contains("no CUDA device is usable") && err.contains("gpu_join.devices"), "{err}");
    }
}

/// The ordinals of a setting, as EXPLAIN lists them.
fn setting_ordinals(setting: &str) -> Vec<usize> {
    setting.split(',').map(|o| o.parse().expect("ordinal")).collect()
}
