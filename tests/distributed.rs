//! A `datafusion-distributed` cluster of three workers on this host, each
//! swapping the joins of its stages for the GPU join: TPC-H from Parquet
//! gives single-node DataFusion's rows, the `gpu_join.*` options travel from
//! the coordinator to the workers, and the GPU join rule, registered too,
//! leaves the plan to the distributed planner. (The project's .slt files run
//! through such a cluster in `sqllogic.rs`.)

use datafusion::execution::SessionStateBuilder;
use datafusion::physical_plan::{ExecutionPlan, displayable};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_distributed::test_utils::localhost::{LocalHostWorkerResolver, spawn_worker_service};
use datafusion_distributed::{DistributedExec, DistributedExt};
use datafusion_gpu_join::SessionStateBuilderExt;
use datafusion_gpu_join::config::{DeviceList, GpuJoinConfig};
use datafusion_gpu_join::distributed::{DistributedGpuJoinExt, GpuJoinWorker};
use gpu_join_workloads::tpch;
use std::sync::Arc;
use tokio::net::TcpListener;

use crate::common::{datafusion_context, sorted_rows, test_options};

const SCALE_FACTOR: f64 = 0.1;
const WORKERS: usize = 3;

/// Workers serving on this host's loopback, sharing one `GpuJoinWorker`
/// (and so its counts of joins); their ports.
pub(crate) async fn start_workers(session: &GpuJoinWorker) -> Vec<u16> {
    let mut ports = vec![];
    for _ in 0..WORKERS {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
        ports.push(listener.local_addr().expect("its address").port());
        tokio::spawn(spawn_worker_service(session.clone(), listener));
    }
    ports
}

/// A coordinator of the workers on `ports`, with `config`, the suites'
/// options and test backend, every scan fanned out over the workers (one
/// byte per partition, since the test tables are tiny). `with_rule` also
/// registers the single-node GPU join rule; `broadcast`
/// (`datafusion-distributed`'s default) sends the build side of each
/// `CollectLeft` join to every task of its probe side.
pub(crate) fn coordinator(config: SessionConfig, ports: Vec<u16>, with_rule: bool, broadcast: bool) -> SessionContext {
    let config = config.with_option_extension(test_options());
    let mut builder = SessionStateBuilder::new().with_default_features().with_config(config);
    if with_rule {
        builder = builder.with_gpu_join();
    }
    let state = builder
        .with_distributed_gpu_join()
        .with_distributed_worker_resolver(LocalHostWorkerResolver::new(ports))
        .with_distributed_file_scan_config_bytes_per_partition(1)
        .and_then(|builder| builder.with_distributed_broadcast_joins(broadcast))
        .expect("valid options")
        .build();
    SessionContext::new_with_state(state)
}

/// A cluster over TPC-H's tables as Parquet files, and DataFusion alone
/// over the same files.
struct Cluster {
    _files: tempfile::TempDir,
    worker: GpuJoinWorker,
    coordinator: SessionContext,
    reference: SessionContext,
}

/// `partitioned` plans every join `Partitioned` (both sides shuffled by
/// key, nothing broadcast), where otherwise small build sides are
/// collected and broadcast.
async fn cluster(with_rule: bool, partitioned: bool) -> Cluster {
    let files = tempfile::tempdir().unwrap();
    let folder = tpch::write_parquet(files.path(), SCALE_FACTOR, WORKERS).expect("Parquet files");
    let worker = GpuJoinWorker::new();
    let mut config = SessionConfig::new().with_target_partitions(WORKERS);
    if partitioned {
        config = config
            .set_usize("datafusion.optimizer.hash_join_single_partition_threshold", 0)
            .set_usize("datafusion.optimizer.hash_join_single_partition_threshold_rows", 0);
    }
    let coordinator = coordinator(config, start_workers(&worker).await, with_rule, !partitioned);
    let reference = datafusion_context(SessionConfig::new().with_target_partitions(WORKERS));
    tpch::register_parquet(&coordinator, &folder).await.expect("tables");
    tpch::register_parquet(&reference, &folder).await.expect("tables");
    Cluster { _files: files, worker, coordinator, reference }
}

impl Cluster {
    /// Runs `query` on the cluster and on DataFusion alone, compares their
    /// rows and returns the cluster's plan of its `SELECT` (none for Q15,
    /// whose view is dropped by then).
    async fn query_matches(&self, query: usize) -> Option<Arc<dyn ExecutionPlan>> {
        let expected = tpch::run_query(&self.reference, query, SCALE_FACTOR).await.expect("DataFusion runs the query");
        let actual =
            tpch::run_query(&self.coordinator, query, SCALE_FACTOR).await.unwrap_or_else(|e| panic!("Q{query}: {e}"));
        assert_eq!(sorted_rows(&actual), sorted_rows(&expected), "Q{query} on the cluster differs from DataFusion");
        let select =
            tpch::statements(query, SCALE_FACTOR).unwrap().into_iter().find(|s| s.starts_with("select")).unwrap();
        let df = self.coordinator.sql(&select).await.ok()?;
        Some(df.create_physical_plan().await.expect("plan"))
    }
}

fn count_in(plan: &Arc<dyn ExecutionPlan>, operator: &str) -> usize {
    displayable(plan.as_ref()).indent(false).to_string().matches(operator).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_on_gpu_workers_matches_datafusion() {
    let cluster = cluster(false, false).await;
    let (mut distributed, mut broadcasts) = (0, 0);
    for query in 1..=22 {
        let Some(plan) = cluster.query_matches(query).await else {
            continue;
        };
        distributed += usize::from(plan.is::<DistributedExec>());
        broadcasts += count_in(&plan, "NetworkBroadcastExec");
    }
    assert!(distributed >= 15, "only {distributed} of the 22 plans were distributed");
    assert!(broadcasts > 0, "no build side was broadcast");
    let joins = cluster.worker.joins();
    assert!(
        joins.on_gpu() >= 20,
        "the workers ran {} joins on the GPU join, {} on DataFusion",
        joins.on_gpu(),
        joins.on_datafusion()
    );

    // A run's time by operator is its stages' on the workers: their scans
    // and their GPU joins, although the coordinator's copy of each stage
    // plans DataFusion's joins.
    let statements = tpch::statements(5, SCALE_FACTOR).expect("Q5");
    let run = gpu_join_workloads::run_statements_timed(&cluster.coordinator, &statements).await.expect("Q5 runs");
    let time_of = |operator: &str| run.operators.iter().find(|(name, _)| name == operator).map(|(_, time)| *time);
    assert!(time_of("GpuJoinExec").is_some_and(|time| !time.is_zero()), "no GPU join's time in {:?}", run.operators);
    // The scans of files spread over the workers are `DistributedLeafExec`s.
    let scans = [time_of("DataSourceExec"), time_of("DistributedLeafExec")];
    assert!(scans.iter().flatten().any(|time| !time.is_zero()), "no scan's time in {:?}", run.operators);
    assert!(time_of("HashJoinExec").is_none(), "a join counted as DataFusion's: {:?}", run.operators);

    // The coordinator's options reach the workers with each query.
    cluster.coordinator.sql("SET gpu_join.enabled = false").await.expect("gpu_join.enabled is an option");
    let before = (joins.on_gpu(), joins.on_datafusion());
    cluster.query_matches(5).await;
    assert_eq!(joins.on_gpu(), before.0, "a worker ran a GPU join with gpu_join.enabled = false");
    assert!(joins.on_datafusion() > before.1, "no worker saw Q5's joins");
}

/// With the single-node rule registered too, and `Partitioned` joins: the
/// stages the workers run shuffle both sides of each join by key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_join_rule_leaves_distributed_plans_to_the_planner() {
    let cluster = cluster(true, true).await;
    for query in [3, 5, 9, 18] {
        let plan = cluster.query_matches(query).await.expect("a plan");
        assert!(
            plan.is::<DistributedExec>(),
            "Q{query} was not distributed:\n{}",
            displayable(plan.as_ref()).indent(true)
        );
        // The stages sent to the workers hold DataFusion's joins, which
        // they swap where they run.
        assert!(count_in(&plan, "NetworkShuffleExec") > 0, "Q{query} shuffles nothing");
        assert!(count_in(&plan, "HashJoinExec: mode=Partitioned") > 0, "Q{query}'s stages lost their joins");
        assert_eq!(count_in(&plan, "BroadcastExec"), 0, "Q{query} broadcast a build side");
    }
    assert!(cluster.worker.joins().on_gpu() > 0, "no worker ran a GPU join");
}

/// The options a worker's session takes from the headers of the query it
/// serves; a worker given its own device joins on it alone, whatever
/// devices the coordinator's options name: ordinals are a host's own.
#[test]
fn a_worker_on_its_own_device_leaves_the_coordinators_devices() {
    let mut headers = http::HeaderMap::new();
    for (name, value) in [("device", "1"), ("devices", "0,1"), ("min_rows", "7")] {
        let name = format!("x-datafusion-distributed-config-gpu_join.{name}");
        headers.insert(http::HeaderName::try_from(name).expect("a header name"), value.parse().expect("a value"));
    }
    let options_of = |worker: GpuJoinWorker| {
        let state = worker.session(SessionStateBuilder::new(), &headers).expect("a worker's session");
        GpuJoinConfig::from_config(state.config().options())
    };
    let forwarded = options_of(GpuJoinWorker::new());
    assert_eq!((forwarded.device, forwarded.devices, forwarded.min_rows), (1, DeviceList::Ordinals(vec![0, 1]), 7));
    let own = options_of(GpuJoinWorker::on_device(3));
    assert_eq!((own.device, own.devices, own.min_rows), (3, DeviceList::One, 7));
}
