//! GPU joins on the workers of a `datafusion-distributed` cluster.
//!
//! The coordinator plans with DataFusion's own joins, so that the
//! distributed planner splits the plan into stages at the repartitions,
//! broadcasts and coalesces it knows: it recognises `HashJoinExec` only,
//! and a `CollectLeft` join it did not know would be split across tasks,
//! each seeing part of the build side. The `gpu_join.*` options travel with
//! each query to the workers, and each worker swaps every join of the stage
//! it runs for a `GpuJoinExec` one for one ([`replace_joins_as_planned`]):
//! same children, schema, partitioning and ordering, the dynamic filter the
//! hash join planted fed by the GPU join, on the worker's own device. The
//! coordinator does the same for the part of the plan it runs itself: the
//! head stage above the network boundaries, or the whole plan where it was
//! not distributed.
//!
//! ```no_run
//! use datafusion::execution::SessionStateBuilder;
//! use datafusion::prelude::SessionContext;
//! use datafusion_gpu_join::distributed::DistributedGpuJoinExt;
//!
//! // The coordinator: DataFusion's planner, then the distributed one.
//! let state = SessionStateBuilder::new().with_default_features().with_distributed_gpu_join().build();
//! let ctx = SessionContext::new_with_state(state);
//! ```
//!
//! A worker serves queries with [`GpuJoinWorker`] as its session builder
//! (`examples/worker.rs` starts one); see docs/distributed.md.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::internal_datafusion_err;
use datafusion::error::Result;
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};
use datafusion::prelude::SessionConfig;
use datafusion_distributed::{
    DistributedConfig, DistributedExec, DistributedExt, NetworkBoundaryExt, SessionStateBuilderExt,
    WorkerPlanRewriteEvent, WorkerPlanRewriteEventResponse, WorkerPlanRewriteHandler, WorkerQueryContext,
    WorkerSessionBuilder,
};

use crate::config::{DeviceList, GpuJoinConfig};
use crate::rule::{JoinDecision, Placement, replace_joins_as_planned};

/// Turns a session being built into the coordinator of a cluster whose
/// workers run GPU joins.
pub trait DistributedGpuJoinExt {
    /// Adds the `gpu_join.*` options (their defaults where none are set),
    /// forwards them to the workers with each query, plans with
    /// `datafusion-distributed`'s planner, and swaps the joins of the part
    /// of each plan the coordinator runs itself. Call it in place of
    /// `with_distributed_planner`, and not before it: a planner added
    /// around this one would see the GPU joins before distributing the plan.
    fn with_distributed_gpu_join(self) -> Self;
}

impl DistributedGpuJoinExt for SessionStateBuilder {
    fn with_distributed_gpu_join(mut self) -> Self {
        let config = self.config().get_or_insert_with(SessionConfig::new);
        let options = GpuJoinConfig::from_config(config.options());
        let mut builder = self.with_distributed_option_extension(options).with_distributed_planner();
        let distributed = builder.query_planner().take();
        builder.with_query_planner(Arc::new(CoordinatorGpuJoins { distributed }))
    }
}

/// The distributed planner, followed by the one-for-one swap of the joins
/// the coordinator runs itself.
#[derive(Debug)]
struct CoordinatorGpuJoins {
    distributed: Option<Arc<dyn QueryPlanner + Send + Sync>>,
}

#[async_trait]
impl QueryPlanner for CoordinatorGpuJoins {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let plan = match &self.distributed {
            Some(distributed) => distributed.create_physical_plan(logical_plan, session).await?,
            None => DefaultPhysicalPlanner::default().create_physical_plan(logical_plan, session).await?,
        };
        let config = session.config_options();
        // Distributed as it runs, the plan is not split into stages yet:
        // its joins are left to the stages' workers.
        let dynamic = config.extensions.get::<DistributedConfig>().is_some_and(|d| d.dynamic_task_count);
        if dynamic && plan.is::<DistributedExec>() {
            return Ok(plan);
        }
        let options = GpuJoinConfig::from_config(config);
        // Below a network boundary lie the stages the workers run, which
        // are sent to them as DataFusion planned them.
        let remote = |node: &Arc<dyn ExecutionPlan>| node.as_ref().is_network_boundary();
        Ok(replace_joins_as_planned(plan, &options, &remote)?.0)
    }
}

/// Joins a worker has swapped for the GPU join, and kept on DataFusion's
/// operator, over every query it served.
#[derive(Debug, Default)]
pub struct WorkerJoins {
    on_gpu: AtomicUsize,
    on_datafusion: AtomicUsize,
}

impl WorkerJoins {
    /// Joins swapped for a `GpuJoinExec`.
    pub fn on_gpu(&self) -> usize {
        self.on_gpu.load(Ordering::Relaxed)
    }

    /// Joins kept on DataFusion's operator (see the worker's log for why).
    pub fn on_datafusion(&self) -> usize {
        self.on_datafusion.load(Ordering::Relaxed)
    }

    fn record(&self, decisions: &[JoinDecision]) {
        for decision in decisions {
            match decision.placement {
                Placement::Gpu { .. } => self.on_gpu.fetch_add(1, Ordering::Relaxed),
                Placement::NotOnGpu(_) => self.on_datafusion.fetch_add(1, Ordering::Relaxed),
            };
        }
    }
}

/// The session of a worker, for each query it serves: DataFusion's, with
/// the `gpu_join.*` options the coordinator forwarded (the worker's own
/// device where it was given one), and the one-for-one swap of the joins
/// of each stage it runs.
#[derive(Debug, Clone, Default)]
pub struct GpuJoinWorker {
    device: Option<usize>,
    joins: Arc<WorkerJoins>,
}

impl GpuJoinWorker {
    /// A worker that joins on the device the coordinator's
    /// `gpu_join.device` names.
    pub fn new() -> Self {
        Self::default()
    }

    /// A worker that joins on its own CUDA device `ordinal` alone, whatever
    /// the coordinator's `gpu_join.device` and `gpu_join.devices`: device
    /// ordinals are a host's own.
    pub fn on_device(ordinal: usize) -> Self {
        Self { device: Some(ordinal), ..Self::default() }
    }

    /// The joins this worker has placed so far.
    pub fn joins(&self) -> &Arc<WorkerJoins> {
        &self.joins
    }

    /// `builder` made this worker's session, `headers` being those of the
    /// query it serves.
    pub fn session(&self, builder: SessionStateBuilder, headers: &http::HeaderMap) -> Result<SessionState> {
        let mut builder = builder.with_distributed_option_extension_from_headers::<GpuJoinConfig>(headers)?;
        if let Some(device) = self.device {
            let config = builder.config().get_or_insert_with(SessionConfig::new);
            let options = config.options_mut().extensions.get_mut::<GpuJoinConfig>();
            let options =
                options.ok_or_else(|| internal_datafusion_err!("GPU join: the worker's options are missing"))?;
            options.device = device;
            options.devices = DeviceList::One;
        }
        let swap = SwapJoins { joins: Arc::clone(&self.joins) };
        Ok(builder.with_distributed_worker_plan_rewrite_handler(swap).build())
    }
}

#[async_trait]
impl WorkerSessionBuilder for GpuJoinWorker {
    async fn build_session_state(&self, ctx: WorkerQueryContext) -> Result<SessionState> {
        self.session(ctx.builder, &ctx.headers)
    }
}

/// Swaps the joins of each stage a worker decodes, one for one.
struct SwapJoins {
    joins: Arc<WorkerJoins>,
}

impl WorkerPlanRewriteHandler for SwapJoins {
    fn rewrite_worker_plan(&self, event: WorkerPlanRewriteEvent) -> Result<WorkerPlanRewriteEventResponse> {
        let options = GpuJoinConfig::from_config(event.session_config.options());
        let (plan, decisions) = replace_joins_as_planned(event.plan, &options, &|_| false)?;
        self.joins.record(&decisions);
        Ok(WorkerPlanRewriteEventResponse::new(plan))
    }
}
