//! Differential fuzz: `GpuJoinExec` against `HashJoinExec` on the same
//! random inputs, for every join type, with and without a filter.
//!
//! `GPU_JOIN_FUZZ_CASES` sets the number of cases (default 2000) and
//! `GPU_JOIN_FUZZ_SEED` the first seed (default: from the clock). A failing
//! case prints the seed that reproduces it alone.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanArray, Date32Array, Decimal128Array, DictionaryArray, Float64Array, Int16Array, Int32Array,
    Int64Array, ListArray, RecordBatch, StringArray, StringViewArray, UInt8Array,
};
use arrow::compute::{LexicographicalComparator, SortColumn, SortOptions};
use arrow::datatypes::{DataType, Field, Int32Type, Schema, SchemaRef};
use datafusion::common::{JoinSide, JoinType, NullEquality};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::DataFusionError;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, lit};
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::utils::{ColumnIndex, JoinFilter};
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode, SortMergeJoinExec};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, Partitioning, collect, collect_partitioned};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu_join::config::{AlgorithmChoice, MaterializationChoice};
use datafusion_gpu_join::exec::ReplacedOperator;
use datafusion_gpu_join::testing::JoinLimits;
use datafusion_gpu_join::{GpuJoinExec, GpuJoinRule};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

use crate::common::{sorted_rows, test_backend, test_devices, test_options};

const JOIN_TYPES: [JoinType; 10] = [
    JoinType::Inner,
    JoinType::Left,
    JoinType::Right,
    JoinType::Full,
    JoinType::LeftSemi,
    JoinType::RightSemi,
    JoinType::LeftAnti,
    JoinType::RightAnti,
    JoinType::LeftMark,
    JoinType::RightMark,
];

/// The key types exercised, each mapping a logical key to a column value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    /// Packed into 32-bit keys.
    Int32,
    UInt8,
    Date32,
    Boolean,
    Decimal128,
    /// Spread over more than 31 bits: packed into 64-bit keys.
    WideInt64,
    /// Spread over the whole i64 range: hashed and verified.
    HashedInt64,
    Utf8,
    Utf8View,
    Dictionary,
    Float64,
    /// Two packed columns.
    Int16AndInt32,
    /// A packed and a hashed column: hashed and verified.
    Int32AndUtf8,
}

const KEY_KINDS: [KeyKind; 13] = [
    KeyKind::Int32,
    KeyKind::UInt8,
    KeyKind::Date32,
    KeyKind::Boolean,
    KeyKind::Decimal128,
    KeyKind::WideInt64,
    KeyKind::HashedInt64,
    KeyKind::Utf8,
    KeyKind::Utf8View,
    KeyKind::Dictionary,
    KeyKind::Float64,
    KeyKind::Int16AndInt32,
    KeyKind::Int32AndUtf8,
];

impl KeyKind {
    fn key_columns(&self, keys: &[Option<i64>]) -> Vec<(DataType, ArrayRef)> {
        match self {
            KeyKind::Int32 => {
                vec![(DataType::Int32, Arc::new(keys.iter().map(|k| k.map(|v| v as i32 - 50)).collect::<Int32Array>()))]
            }
            KeyKind::UInt8 => vec![(
                DataType::UInt8,
                Arc::new(keys.iter().map(|k| k.map(|v| (v % 256) as u8)).collect::<UInt8Array>()),
            )],
            KeyKind::Date32 => vec![(
                DataType::Date32,
                Arc::new(keys.iter().map(|k| k.map(|v| 19000 + v as i32)).collect::<Date32Array>()),
            )],
            KeyKind::Boolean => vec![(
                DataType::Boolean,
                Arc::new(keys.iter().map(|k| k.map(|v| v % 2 == 0)).collect::<BooleanArray>()),
            )],
            KeyKind::Decimal128 => {
                let array = keys.iter().map(|k| k.map(|v| i128::from(v) * 1_000_003)).collect::<Decimal128Array>();
                let array = array.with_precision_and_scale(20, 2).expect("valid decimal");
                vec![(DataType::Decimal128(20, 2), Arc::new(array))]
            }
            KeyKind::WideInt64 => {
                vec![(DataType::Int64, Arc::new(keys.iter().map(|k| k.map(|v| v << 34)).collect::<Int64Array>()))]
            }
            KeyKind::HashedInt64 => vec![(
                DataType::Int64,
                Arc::new(
                    keys.iter()
                        .map(|k| k.map(|v| (v as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) as i64))
                        .collect::<Int64Array>(),
                ),
            )],
            KeyKind::Utf8 => vec![(
                DataType::Utf8,
                Arc::new(keys.iter().map(|k| k.map(|v| format!("key-{v}"))).collect::<StringArray>()),
            )],
            KeyKind::Utf8View => vec![(
                DataType::Utf8View,
                Arc::new(
                    keys.iter()
                        .map(|k| k.map(|v| format!("a longer key that is not inlined {v}")))
                        .collect::<StringViewArray>(),
                ),
            )],
            KeyKind::Dictionary => {
                let strings: Vec<Option<String>> = keys.iter().map(|k| k.map(|v| format!("d{v}"))).collect();
                let array: DictionaryArray<Int32Type> = strings.iter().map(Option::as_deref).collect();
                vec![(DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)), Arc::new(array))]
            }
            KeyKind::Float64 => vec![(
                DataType::Float64,
                Arc::new(keys.iter().map(|k| k.map(|v| v as f64 * 0.5 - 3.0)).collect::<Float64Array>()),
            )],
            KeyKind::Int16AndInt32 => vec![
                (DataType::Int16, Arc::new(keys.iter().map(|k| k.map(|v| (v % 7) as i16)).collect::<Int16Array>())),
                (DataType::Int32, Arc::new(keys.iter().map(|k| k.map(|v| (v / 7) as i32)).collect::<Int32Array>())),
            ],
            KeyKind::Int32AndUtf8 => vec![
                (DataType::Int32, Arc::new(keys.iter().map(|k| k.map(|v| (v % 5) as i32)).collect::<Int32Array>())),
                (
                    DataType::Utf8,
                    Arc::new(keys.iter().map(|k| k.map(|v| format!("s{}", v / 5))).collect::<StringArray>()),
                ),
            ],
        }
    }
}

/// One random join and its inputs.
struct Case {
    seed: u64,
    join_type: JoinType,
    key_kind: KeyKind,
    null_equality: NullEquality,
    null_aware: bool,
    with_filter: bool,
    /// The filter compares columns (`l.x <> r.x AND r.x <= l.x`), which the
    /// backend does where `filter_on_backend` is set.
    compared_filter: bool,
    filter_on_backend: bool,
    collect_left: bool,
    partitions: usize,
    projection: Option<Vec<usize>>,
    algorithm: AlgorithmChoice,
    materialization: MaterializationChoice,
    batch_size: usize,
    probe_chunk_rows: usize,
    /// Chunks' columns uploaded always (0), once enough rows matched, or never.
    probe_device_gather_ratio: f64,
    /// Every build side to DataFusion's operator (`min_build_rows`), whose
    /// output the partition hands over.
    build_on_datafusion: bool,
    /// The GPU join's inputs kept in the backend's pinned memory
    /// (`gpu_join_pin_batches`), read there without a copy.
    pinned: bool,
    /// Smaller limits of pairs per match call and of values per output
    /// array, so that small inputs are joined in pieces and their output
    /// cut into several batches, as huge ones are.
    limits: Option<JoinLimits>,
    /// Devices the join spreads over (`gpu_join.devices`): instances of
    /// their own on the CPU backend, the one GPU listed again on CUDA.
    devices: usize,
    /// Most build rows per pass (`gpu_join.build_pass_rows`; 0: the budget
    /// decides): small, a build side is split by key hash into passes, over
    /// every device where the devices share it.
    build_pass_rows: usize,
    left: (SchemaRef, Vec<Vec<RecordBatch>>),
    right: (SchemaRef, Vec<Vec<RecordBatch>>),
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rows =
            |side: &(SchemaRef, Vec<Vec<RecordBatch>>)| side.1.iter().flatten().map(|b| b.num_rows()).sum::<usize>();
        write!(
            f,
            "seed {} (GPU_JOIN_FUZZ_SEED={} GPU_JOIN_FUZZ_CASES=1): {:?} join on {:?}, {:?}, null_aware={}, filter={} (compared {}, on backend {}), \
             {}, {} partitions, projection {:?}, {:?}/{:?}, batch_size {}, probe_chunk_rows {}, probe_device_gather_ratio {}, pinned={}, limits {:?}, {} devices, build_pass_rows {}, {} build rows, {} probe rows",
            self.seed,
            self.seed,
            self.join_type,
            self.key_kind,
            self.null_equality,
            self.null_aware,
            self.with_filter,
            self.compared_filter,
            self.filter_on_backend,
            if self.collect_left { "CollectLeft" } else { "Partitioned" },
            self.partitions,
            self.projection,
            self.algorithm,
            self.materialization,
            self.batch_size,
            self.probe_chunk_rows,
            self.probe_device_gather_ratio,
            self.pinned,
            self.limits,
            self.devices,
            self.build_pass_rows,
            rows(&self.left),
            rows(&self.right),
        )
    }
}

/// Logical keys: a small domain so that keys repeat (a domain of one: every
/// key equal), sometimes one heavy hitter (skew), and nulls at a random
/// rate.
fn logical_keys(rng: &mut StdRng, rows: usize, domain: i64, skewed: bool, null_rate: f64) -> Vec<Option<i64>> {
    (0..rows)
        .map(|_| {
            if rng.random_bool(null_rate) {
                None
            } else if skewed && rng.random_bool(0.6) {
                Some(3)
            } else {
                Some(rng.random_range(0..domain))
            }
        })
        .collect()
}

/// A side: key columns, then an Int32 payload, a Utf8 payload and, on the
/// build side, a List payload; split into random batches over partitions.
fn side(
    rng: &mut StdRng,
    kind: KeyKind,
    prefix: &str,
    rows: usize,
    domain: i64,
    partitions: usize,
    with_list: bool,
) -> (SchemaRef, Vec<Vec<RecordBatch>>) {
    let skewed = rng.random_bool(0.3);
    let null_rate = *[0.0, 0.05, 0.3].choose(rng).expect("non-empty");
    let keys = logical_keys(rng, rows, domain, skewed, null_rate);
    let mut fields = vec![];
    let mut columns: Vec<ArrayRef> = vec![];
    for (i, (data_type, array)) in kind.key_columns(&keys).into_iter().enumerate() {
        fields.push(Field::new(format!("{prefix}k{i}"), data_type, true));
        columns.push(array);
    }
    let payload: Int32Array = (0..rows).map(|_| rng.random_bool(0.9).then(|| rng.random_range(-20..20))).collect();
    fields.push(Field::new(format!("{prefix}x"), DataType::Int32, true));
    columns.push(Arc::new(payload));
    let text: StringArray = (0..rows).map(|i| rng.random_bool(0.9).then(|| format!("{prefix}{i}"))).collect();
    fields.push(Field::new(format!("{prefix}s"), DataType::Utf8, true));
    columns.push(Arc::new(text));
    if with_list {
        let lists = ListArray::from_iter_primitive::<Int32Type, _, _>(
            (0..rows).map(|i| rng.random_bool(0.8).then(|| vec![Some(i as i32), None])),
        );
        fields.push(Field::new(format!("{prefix}l"), arrow::array::Array::data_type(&lists).clone(), true));
        columns.push(Arc::new(lists));
    }
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns).expect("valid batch");
    let mut parts: Vec<Vec<RecordBatch>> = vec![vec![]; partitions];
    let mut offset = 0;
    while offset < rows {
        let len = rng.random_range(1..=rows - offset).min(rng.random_range(1..64));
        parts[rng.random_range(0..partitions)].push(batch.slice(offset, len));
        offset += len;
    }
    (schema, parts)
}

fn random_case(seed: u64) -> Case {
    let mut rng = StdRng::seed_from_u64(seed);
    let join_type = *JOIN_TYPES.choose(&mut rng).expect("non-empty");
    let key_kind = *KEY_KINDS.choose(&mut rng).expect("non-empty");
    let size = |rng: &mut StdRng| *[0, 1, 7, 33, 100, 257].choose(rng).expect("non-empty") + rng.random_range(0..3);
    let (build_rows, probe_rows) = (size(&mut rng), size(&mut rng));
    let domain = *[1, 2, 10, 60, 1000].choose(&mut rng).expect("non-empty");
    let collect_left = rng.random_bool(0.6);
    let partitions = rng.random_range(1..=4);
    let single_key = !matches!(key_kind, KeyKind::Int16AndInt32 | KeyKind::Int32AndUtf8);
    let null_aware = join_type == JoinType::LeftAnti && single_key && collect_left && rng.random_bool(0.5);
    let with_filter = !null_aware && rng.random_bool(0.5);
    let null_equality = if !null_aware && rng.random_bool(0.25) {
        NullEquality::NullEqualsNull
    } else {
        NullEquality::NullEqualsNothing
    };
    let with_list = rng.random_bool(0.3);
    let left = side(&mut rng, key_kind, "l", build_rows, domain, if collect_left { 1 } else { partitions }, with_list);
    let right = side(&mut rng, key_kind, "r", probe_rows, domain, partitions, false);
    let joined_columns = match join_type {
        JoinType::LeftSemi | JoinType::LeftAnti => left.0.fields().len(),
        JoinType::RightSemi | JoinType::RightAnti => right.0.fields().len(),
        JoinType::LeftMark => left.0.fields().len() + 1,
        JoinType::RightMark => right.0.fields().len() + 1,
        _ => left.0.fields().len() + right.0.fields().len(),
    };
    let projection = rng.random_bool(0.3).then(|| (0..joined_columns).filter(|_| rng.random_bool(0.4)).collect());
    Case {
        seed,
        join_type,
        key_kind,
        null_equality,
        null_aware,
        with_filter,
        compared_filter: rng.random_bool(0.5),
        filter_on_backend: rng.random_bool(0.8),
        collect_left,
        partitions,
        projection,
        algorithm: *[AlgorithmChoice::Hash, AlgorithmChoice::SortMerge, AlgorithmChoice::Direct, AlgorithmChoice::Auto]
            .choose(&mut rng)
            .expect("non-empty"),
        materialization: *[
            MaterializationChoice::Auto,
            MaterializationChoice::Transformed,
            MaterializationChoice::Untransformed,
        ]
        .choose(&mut rng)
        .expect("non-empty"),
        batch_size: *[1, 3, 50, 8192].choose(&mut rng).expect("non-empty"),
        probe_chunk_rows: *[1, 10, 64, 1 << 20].choose(&mut rng).expect("non-empty"),
        probe_device_gather_ratio: *[0.0, 0.25, f64::INFINITY].choose(&mut rng).expect("non-empty"),
        build_on_datafusion: rng.random_bool(0.25),
        pinned: rng.random_bool(0.3),
        limits: rng.random_bool(0.3).then(|| JoinLimits {
            pairs: *[1, 40, 1000].choose(&mut rng).expect("non-empty"),
            array_values: *[1, 30, 1 << 20].choose(&mut rng).expect("non-empty"),
        }),
        devices: *[1, 1, 2, 3].choose(&mut rng).expect("non-empty"),
        build_pass_rows: *[0, 0, 0, 7, 100].choose(&mut rng).expect("non-empty"),
        left,
        right,
    }
}

fn memory_input(side: &(SchemaRef, Vec<Vec<RecordBatch>>)) -> Arc<dyn ExecutionPlan> {
    MemorySourceConfig::try_new_exec(&side.1, Arc::clone(&side.0), None).expect("memory source")
}

fn key_exprs(schema: &SchemaRef, prefix: &str) -> Vec<PhysicalExprRef> {
    schema
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| f.name().starts_with(&format!("{prefix}k")))
        .map(|(i, f)| Arc::new(Column::new(f.name(), i)) as PhysicalExprRef)
        .collect()
}

/// `l.x < r.x + 5`, evaluated on the host, or `l.x <> r.x AND r.x <= l.x`,
/// compared on the backend where the case lets it.
fn filter(case: &Case) -> JoinFilter {
    let (left, right) = (&case.left.0, &case.right.0);
    let lx = left.index_of("lx").expect("lx");
    let rx = right.index_of("rx").expect("rx");
    let schema =
        Arc::new(Schema::new(vec![Field::new("lx", DataType::Int32, true), Field::new("rx", DataType::Int32, true)]));
    let (lx_column, rx_column) = (Arc::new(Column::new("lx", 0)), Arc::new(Column::new("rx", 1)));
    let expression: PhysicalExprRef = match case.compared_filter {
        true => Arc::new(BinaryExpr::new(
            Arc::new(BinaryExpr::new(lx_column.clone(), Operator::NotEq, rx_column.clone())),
            Operator::And,
            Arc::new(BinaryExpr::new(rx_column, Operator::LtEq, lx_column)),
        )),
        false => Arc::new(BinaryExpr::new(
            lx_column,
            Operator::Lt,
            Arc::new(BinaryExpr::new(rx_column, Operator::Plus, lit(5i32))),
        )),
    };
    JoinFilter::new(
        expression,
        vec![ColumnIndex { index: lx, side: JoinSide::Left }, ColumnIndex { index: rx, side: JoinSide::Right }],
        schema,
    )
}

fn hash_join(case: &Case) -> HashJoinExec {
    hash_join_of(case, &case.left, &case.right)
}

/// The case's join over `left` and `right`: its own sides, or copies of them.
fn hash_join_of(
    case: &Case,
    left: &(SchemaRef, Vec<Vec<RecordBatch>>),
    right: &(SchemaRef, Vec<Vec<RecordBatch>>),
) -> HashJoinExec {
    let (mut left, mut right) = (memory_input(left), memory_input(right));
    let left_keys = key_exprs(&case.left.0, "l");
    let right_keys = key_exprs(&case.right.0, "r");
    if !case.collect_left {
        left = Arc::new(
            RepartitionExec::try_new(left, Partitioning::Hash(left_keys.clone(), case.partitions))
                .expect("repartition"),
        );
        right = Arc::new(
            RepartitionExec::try_new(right, Partitioning::Hash(right_keys.clone(), case.partitions))
                .expect("repartition"),
        );
    }
    HashJoinExec::try_new(
        left,
        right,
        left_keys.into_iter().zip(right_keys).collect(),
        case.with_filter.then(|| filter(case)),
        &case.join_type,
        case.projection.clone(),
        if case.collect_left { PartitionMode::CollectLeft } else { PartitionMode::Partitioned },
        case.null_equality,
        case.null_aware,
    )
    .expect("valid hash join")
}

async fn run_case(case: &Case) -> Result<(), String> {
    // Two plans: stateful inputs such as RepartitionExec run only once.
    let reference = hash_join(case);
    let mut options = test_options();
    options.algorithm = case.algorithm;
    options.materialization = case.materialization;
    options.probe_chunk_rows = case.probe_chunk_rows;
    options.probe_device_gather_ratio = case.probe_device_gather_ratio;
    options.filter_on_backend = case.filter_on_backend;
    options.build_pass_rows = case.build_pass_rows;
    if case.build_on_datafusion {
        options.min_build_rows = usize::MAX;
    }
    let backend = test_backend();
    let join = match case.pinned {
        true => {
            let pinned = |side: &(SchemaRef, Vec<Vec<RecordBatch>>)| {
                backend.pin_partitions(side.1.clone()).map(|parts| (Arc::clone(&side.0), parts))
            };
            let (left, right) = (pinned(&case.left), pinned(&case.right));
            hash_join_of(case, &left.map_err(|e| e.to_string())?, &right.map_err(|e| e.to_string())?)
        }
        false => hash_join(case),
    };
    let gpu = GpuJoinExec::try_new(&join, test_devices(case.devices), &options, ReplacedOperator::HashJoin)
        .map_err(|e| e.to_string())?;
    let mut config = SessionConfig::new().with_batch_size(case.batch_size).with_option_extension(options);
    if let Some(limits) = case.limits {
        config = config.with_extension(Arc::new(limits));
    }
    let task = SessionContext::new_with_config(config).task_ctx();
    let expected =
        collect(Arc::new(reference), Arc::clone(&task)).await.map_err(|e| format!("HashJoinExec failed: {e}"))?;
    let actual = collect(Arc::new(gpu), task).await.map_err(|e| format!("GpuJoinExec failed: {e}"))?;
    if let Some(batch) = actual.iter().find(|b| b.num_rows() > case.batch_size) {
        return Err(format!("a {}-row batch exceeds batch_size {}", batch.num_rows(), case.batch_size));
    }
    let (expected, actual) = (sorted_rows(&expected), sorted_rows(&actual));
    if expected != actual {
        let missing: Vec<_> = expected.iter().filter(|r| !actual.contains(r)).take(5).collect();
        let extra: Vec<_> = actual.iter().filter(|r| !expected.contains(r)).take(5).collect();
        return Err(format!(
            "{} rows expected, {} returned; missing e.g. {missing:?}, extra e.g. {extra:?}",
            expected.len(),
            actual.len()
        ));
    }
    Ok(())
}

/// The seeds of a fuzz run: `GPU_JOIN_FUZZ_CASES` of them (else
/// `default_cases`) from `GPU_JOIN_FUZZ_SEED` (else the clock).
fn fuzz_seeds(name: &str, default_cases: u64) -> std::ops::Range<u64> {
    let cases: u64 = std::env::var("GPU_JOIN_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default_cases);
    let first_seed: u64 = std::env::var("GPU_JOIN_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
    });
    println!("{name}: {cases} cases from seed {first_seed}");
    first_seed..first_seed + cases
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_join_matches_hash_join_on_random_inputs() {
    let seeds = fuzz_seeds("fuzz", 2000);
    let cases = seeds.end - seeds.start;
    let mut covered = std::collections::HashSet::new();
    for seed in seeds {
        let case = random_case(seed);
        if let Err(failure) = run_case(&case).await {
            panic!("fuzz case failed: {case:?}\n{failure}");
        }
        covered.insert((format!("{:?}", case.join_type), case.with_filter));
    }
    if cases >= 500 {
        assert_eq!(covered.len(), 20, "every join type with and without a filter: {covered:?}");
    }
}

/// The key kinds whose values pack, so that a sort-merge join on them can be
/// replaced where its order is relied on (`HashedInt64` spans too wide a
/// range at run time, so DataFusion's operator joins it, sorted).
fn sorts_on_device(kind: KeyKind) -> bool {
    !matches!(kind, KeyKind::Utf8 | KeyKind::Utf8View | KeyKind::Dictionary | KeyKind::Float64 | KeyKind::Int32AndUtf8)
}

/// The case as DataFusion plans a sort-merge join: both sides hash
/// partitioned and sorted by their keys in `options`.
fn sort_merge_join(case: &Case, options: &[SortOptions]) -> datafusion::error::Result<SortMergeJoinExec> {
    let sorted = |side: &(SchemaRef, Vec<Vec<RecordBatch>>), prefix: &str| -> Arc<dyn ExecutionPlan> {
        let keys = key_exprs(&side.0, prefix);
        let input = RepartitionExec::try_new(memory_input(side), Partitioning::Hash(keys.clone(), case.partitions))
            .expect("repartition");
        let ordering = keys.iter().zip(options).map(|(k, o)| PhysicalSortExpr::new(Arc::clone(k), *o));
        let ordering = LexOrdering::new(ordering).expect("at least one key");
        Arc::new(SortExec::new(ordering, Arc::new(input)).with_preserve_partitioning(true))
    };
    let (left_keys, right_keys) = (key_exprs(&case.left.0, "l"), key_exprs(&case.right.0, "r"));
    SortMergeJoinExec::try_new(
        sorted(&case.left, "l"),
        sorted(&case.right, "r"),
        left_keys.into_iter().zip(right_keys).collect(),
        case.with_filter.then(|| filter(case)),
        case.join_type,
        options.to_vec(),
        case.null_equality,
    )
}

/// Whether every partition's rows are in `ordering`.
fn partitions_in_order(partitions: &[Vec<RecordBatch>], ordering: &LexOrdering) -> Result<(), String> {
    for (p, batches) in partitions.iter().enumerate() {
        let Some(first) = batches.first() else { continue };
        let batch = arrow::compute::concat_batches(&first.schema(), batches).map_err(|e| e.to_string())?;
        let columns = ordering
            .iter()
            .map(|sort| {
                let values = sort.expr.evaluate(&batch)?.into_array(batch.num_rows())?;
                Ok(SortColumn { values, options: Some(sort.options) })
            })
            .collect::<datafusion::error::Result<Vec<_>>>()
            .map_err(|e| e.to_string())?;
        let comparator = LexicographicalComparator::try_new(&columns).map_err(|e| e.to_string())?;
        if let Some(row) = (1..batch.num_rows()).find(|&i| comparator.compare(i - 1, i).is_gt()) {
            return Err(format!("partition {p}: row {row} comes before row {} in [{ordering}]", row - 1));
        }
    }
    Ok(())
}

/// Runs a case as a sort-merge join whose order the plan relies on; returns
/// whether the GPU join replaced it.
async fn run_ordered_case(case: &Case, rng: &mut StdRng) -> Result<bool, String> {
    let options: Vec<SortOptions> = (0..key_exprs(&case.left.0, "l").len())
        .map(|_| SortOptions { descending: rng.random_bool(0.3), nulls_first: rng.random_bool(0.7) })
        .collect();
    // Two plans: stateful inputs such as RepartitionExec run only once.
    let reference = match sort_merge_join(case, &options) {
        Ok(join) => join,
        // Join types DataFusion's sort-merge join does not take.
        Err(_) => return Ok(false),
    };
    let mut gpu_options = test_options();
    gpu_options.materialization = case.materialization;
    gpu_options.probe_device_gather_ratio = case.probe_device_gather_ratio;
    let mut config = SessionConfig::new().with_batch_size(case.batch_size).with_option_extension(gpu_options);
    if let Some(limits) = case.limits {
        config = config.with_extension(Arc::new(limits));
    }
    let smj = Arc::new(sort_merge_join(case, &options).map_err(|e| e.to_string())?);
    let promised = smj.properties().output_ordering().cloned();
    let plan = GpuJoinRule.optimize(smj, config.options()).map_err(|e| format!("the rule failed: {e}"))?;
    let replaced = plan.downcast_ref::<GpuJoinExec>().is_some();
    if replaced && plan.children().iter().any(|c| c.is::<SortExec>()) {
        return Err("the sorts below the replaced sort-merge join are still there".into());
    }
    if plan.output_ordering() != promised.as_ref() {
        return Err(format!("output ordering {:?}, the sort-merge join's {promised:?}", plan.output_ordering()));
    }
    let task = SessionContext::new_with_config(config).task_ctx();
    let expected = match collect_partitioned(Arc::new(reference), Arc::clone(&task)).await {
        Ok(expected) => expected,
        // Key types DataFusion's sort-merge join does not compare.
        Err(e) if !replaced && matches!(e.find_root(), DataFusionError::NotImplemented(_)) => return Ok(false),
        Err(e) => return Err(format!("SortMergeJoinExec failed: {e}")),
    };
    let actual = collect_partitioned(plan, task).await.map_err(|e| format!("GpuJoinExec failed: {e}"))?;
    // Where a filter leaves some rows of equal keys unmatched, their NULL
    // padding sorts wherever the rows of equal keys fall: DataFusion's own
    // output then keeps only the order of the keys, not the padded side's
    // order it promises after them.
    let padded_by_filter = case.with_filter && matches!(case.join_type, JoinType::Left | JoinType::Right);
    if let (Some(ordering), true) = (&promised, replaced) {
        let keys = options.len();
        let ordering = match padded_by_filter {
            true => LexOrdering::new(ordering.iter().take(keys).cloned()).ok_or("an empty ordering")?,
            false => ordering.clone(),
        };
        partitions_in_order(&actual, &ordering).map_err(|e| format!("sort options {options:?}: {e}"))?;
    }
    let (expected, actual) = (sorted_rows(&expected.concat()), sorted_rows(&actual.concat()));
    if expected != actual {
        return Err(format!("sort options {options:?}: {} rows expected, {} returned", expected.len(), actual.len()));
    }
    Ok(replaced)
}

/// Sort-merge joins whose order the plan relies on: the GPU join leaves
/// every partition in the same order as DataFusion's, with the same rows,
/// for ascending and descending keys, NULLs first and last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_gpu_join_matches_sort_merge_join_on_random_inputs() {
    let seeds = fuzz_seeds("ordered fuzz", 500);
    let cases = seeds.end - seeds.start;
    let mut covered = std::collections::HashSet::new();
    for seed in seeds {
        let case = random_case(seed);
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
        match run_ordered_case(&case, &mut rng).await {
            Err(failure) => panic!("ordered fuzz case failed: {case:?}\n{failure}"),
            Ok(replaced) => {
                if sorts_on_device(case.key_kind) && case.key_kind != KeyKind::HashedInt64 {
                    assert!(replaced || case.join_type == JoinType::Full, "{case:?}: not replaced");
                }
                if replaced {
                    covered.insert(format!("{:?}", case.join_type));
                }
            }
        }
    }
    if cases >= 300 {
        assert!(covered.len() >= 8, "join types replaced in order: {covered:?}");
    }
}

/// A partition in key order that makes more pairs than one match call is
/// joined by DataFusion's operator and sorted. In batches of three rows its
/// output reached the sort as thousands of runs, and the sort's merge,
/// interleaving over all of them for every batch it emitted, never ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_partition_joined_on_datafusion_in_tiny_batches_ends() {
    let seed = 1_796_427_937_948_325_623;
    let case = random_case(seed);
    let shape = (case.join_type, case.collect_left, case.batch_size, case.limits.map(|limits| limits.pairs));
    assert_eq!(shape, (JoinType::Left, true, 3, Some(40)), "the generator changed this seed's case: {case:?}");
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let run = tokio::time::timeout(std::time::Duration::from_secs(120), run_ordered_case(&case, &mut rng));
    match run.await {
        Err(_) => panic!("not joined within 120 s: {case:?}"),
        Ok(Err(failure)) => panic!("ordered case failed: {case:?}\n{failure}"),
        Ok(Ok(replaced)) => assert!(replaced, "{case:?}: not replaced"),
    }
}

/// A table's partitions: an Int32 key in `keys` (values repeat), a
/// nullable Int64 payload and a Utf8 payload, in batches of random sizes.
fn pinnable_table(rng: &mut StdRng, prefix: &str, rows: usize, keys: std::ops::Range<i32>) -> Vec<Vec<RecordBatch>> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int32, false),
        Field::new(format!("{prefix}1"), DataType::Int64, true),
        Field::new(format!("{prefix}s"), DataType::Utf8, true),
    ]));
    (0..4)
        .map(|_| {
            let mut batches = vec![];
            let mut left = rows / 4;
            while left > 0 {
                let n = rng.random_range(1..=3_000).min(left);
                let columns: Vec<ArrayRef> = vec![
                    Arc::new((0..n).map(|_| rng.random_range(keys.clone())).collect::<Int32Array>()),
                    Arc::new(
                        (0..n).map(|i| (i % 7 != 0).then(|| rng.random_range(-1_000..1_000))).collect::<Int64Array>(),
                    ),
                    Arc::new((0..n).map(|i| (i % 5 != 0).then(|| format!("{prefix}{i}"))).collect::<StringArray>()),
                ];
                batches.push(RecordBatch::try_new(Arc::clone(&schema), columns).expect("a batch"));
                left -= n;
            }
            batches
        })
        .collect()
}

/// Tables kept in pinned memory through a session, at sizes where the
/// build side spans several blocks and probe chunks cut batches, probe keys
/// on both sides of the build side's span: the rows DataFusion gives over
/// the tables as they were. On a CUDA device, each fixed-width column of a
/// partition lies end to end, the batches slices of one block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_tables_join_as_datafusion_does() {
    use datafusion::datasource::MemTable;
    use datafusion_gpu_join::GpuJoinContextExt;
    use datafusion_gpu_join::config::BackendChoice;

    use crate::common::{datafusion_context, gpu_context, run, test_backend_choice};

    let mut rng = StdRng::seed_from_u64(0x7069_6e6e_6564);
    let r = pinnable_table(&mut rng, "r", 40_000, -5_000..15_000);
    let s = pinnable_table(&mut rng, "s", 100_000, -8_000..20_000);
    let config = SessionConfig::new().with_target_partitions(4);
    let (gpu, datafusion) = (gpu_context(config.clone()), datafusion_context(config));
    run(&gpu, "set gpu_join.probe_chunk_rows = 7000").await;
    for (name, partitions) in [("r", r), ("s", s)] {
        let pinned = gpu.gpu_join_pin_batches(partitions.clone()).expect("pinned batches");
        assert_eq!(pinned, partitions, "{name}: pinned batches hold the same rows");
        if test_backend_choice() == BackendChoice::Cuda {
            for batches in &pinned {
                let starts: Vec<(usize, usize)> = batches
                    .iter()
                    .map(|b| {
                        let data = b.column(1).to_data();
                        (data.buffers()[0].as_ptr() as usize + data.offset() * 8, data.len() * 8)
                    })
                    .collect();
                assert!(starts.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0), "{name}: a partition's column in pieces");
            }
        }
        let schema = partitions[0][0].schema();
        gpu.register_table(name, Arc::new(MemTable::try_new(Arc::clone(&schema), pinned).expect("a table")))
            .expect("registered");
        datafusion
            .register_table(name, Arc::new(MemTable::try_new(schema, partitions).expect("a table")))
            .expect("registered");
    }
    let plan = crate::common::physical_plan_text(&gpu, "select r1, s1 from r join s on r.k = s.k").await;
    assert!(plan.contains("GpuJoinExec"), "{plan}");
    for sql in [
        "select r.k, r1, rs, s1, ss from r join s on r.k = s.k",
        "select r.k, r1, s1 from r left join s on r.k = s.k",
        "select s.k, s1, r1 from r right join s on r.k = s.k",
        "select k, s1 from s where k in (select k from r)",
        "select count(*), sum(s1) from s where not exists (select 1 from r where r.k = s.k)",
    ] {
        let (expected, actual) = (run(&datafusion, sql).await, run(&gpu, sql).await);
        assert_eq!(sorted_rows(&actual), sorted_rows(&expected), "{sql}");
        assert!(!expected.is_empty(), "{sql}");
    }
}
