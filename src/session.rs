//! Turning the GPU join on for a DataFusion session.

use std::sync::{Arc, Once};

use arrow::record_batch::RecordBatch;
use datafusion::error::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::physical_optimizer::optimizer::PhysicalOptimizer;
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::backend::cuda_backend;
use crate::config::{BackendChoice, GpuJoinConfig};
use crate::rule::{AggregateDecision, GpuJoinRule, JoinDecision, plan_aggregate_decisions, plan_decisions};

/// The rule goes right before this one, which plants hash joins' dynamic
/// filters: joins must be replaced first so that no filter is left unfed.
const INSERT_BEFORE: &str = "FilterPushdown(Post)";

/// Adds the GPU join to a session being built: the optimizer rule, placed
/// before `FilterPushdown(Post)`, and the `gpu_join.*` options. Registering
/// twice changes nothing.
///
/// ```
/// use datafusion::execution::SessionStateBuilder;
/// use datafusion::prelude::SessionContext;
///
/// let state = datafusion_gpu_join::register(SessionStateBuilder::new().with_default_features()).build();
/// let ctx = SessionContext::new_with_state(state);
/// ```
pub fn register(mut builder: SessionStateBuilder) -> SessionStateBuilder {
    let config = builder.config().get_or_insert_with(SessionConfig::new);
    if config.options().extensions.get::<GpuJoinConfig>().is_none() {
        config.options_mut().extensions.insert(GpuJoinConfig::default());
    }
    let options = GpuJoinConfig::from_config(config.options());
    if options.enabled && options.backend != BackendChoice::Cpu {
        warm_up(options);
    }
    let optimizer = builder.physical_optimizers().get_or_insert_with(PhysicalOptimizer::new);
    if !optimizer.rules.iter().any(|rule| rule.name() == GpuJoinRule::NAME) {
        let position = optimizer
            .rules
            .iter()
            .rposition(|rule| rule.name() == INSERT_BEFORE)
            .or_else(|| optimizer.rules.iter().rposition(|rule| rule.name() == "SanityCheckPlan"))
            .unwrap_or(optimizer.rules.len());
        optimizer.rules.insert(position, Arc::new(GpuJoinRule));
    }
    builder
}

/// Opens the CUDA device in the background, once per process: the kernels
/// are compiled (or read from the cache) before the first query needs them.
fn warm_up(options: GpuJoinConfig) {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        let spawned = std::thread::Builder::new().name("gpu-join-warm-up".into()).spawn(move || {
            if let Err(why) = cuda_backend(&options) {
                log::debug!("gpu_join: no CUDA device to warm up: {why}");
            }
        });
        if let Err(e) = spawned {
            log::debug!("gpu_join: warm-up thread not started: {e}");
        }
    });
}

/// `builder.with_gpu_join()`, the same as [`register`].
pub trait SessionStateBuilderExt {
    fn with_gpu_join(self) -> Self;
}

impl SessionStateBuilderExt for SessionStateBuilder {
    fn with_gpu_join(self) -> Self {
        register(self)
    }
}

/// Where the joins and aggregations of a query run, without running it.
pub trait GpuJoinContextExt {
    /// Plans `sql` and lists each join: replaced by `GpuJoinExec`, or kept on
    /// DataFusion's operator with the reason.
    fn gpu_join_decisions(&self, sql: &str) -> impl Future<Output = Result<Vec<JoinDecision>>> + Send;

    /// Plans `sql` and lists each aggregation: grouped on the backend by a
    /// `GpuAggregateExec` (`gpu_join.aggregate`), or kept on DataFusion's
    /// operator with the reason.
    fn gpu_aggregate_decisions(&self, sql: &str) -> impl Future<Output = Result<Vec<AggregateDecision>>> + Send;

    /// `partitions` (a table's batches, as `MemTable` takes them) with the
    /// values of their fixed-width columns copied into pinned memory, each
    /// column of a partition end to end in one block, for a table that is
    /// joined again and again: a GPU join reads such batches where they lie,
    /// instead of copying every byte it sends into pinned memory first.
    /// The pinned memory is held until the last batch over it is dropped,
    /// outside `gpu_join.pinned_pool_bytes`. Where the GPU join would not
    /// run on a CUDA device (`gpu_join.enabled = false`, `backend = 'cpu'`,
    /// or no usable device), the batches come back as they are.
    fn gpu_join_pin_batches(&self, partitions: Vec<Vec<RecordBatch>>) -> Result<Vec<Vec<RecordBatch>>>;
}

impl GpuJoinContextExt for SessionContext {
    async fn gpu_join_decisions(&self, sql: &str) -> Result<Vec<JoinDecision>> {
        let plan = self.sql(sql).await?.create_physical_plan().await?;
        plan_decisions(&plan, self.state().config().options())
    }

    async fn gpu_aggregate_decisions(&self, sql: &str) -> Result<Vec<AggregateDecision>> {
        let plan = self.sql(sql).await?.create_physical_plan().await?;
        plan_aggregate_decisions(&plan, self.state().config().options())
    }

    fn gpu_join_pin_batches(&self, partitions: Vec<Vec<RecordBatch>>) -> Result<Vec<Vec<RecordBatch>>> {
        let options = GpuJoinConfig::from_config(self.state().config().options());
        if !options.enabled || options.backend == BackendChoice::Cpu {
            return Ok(partitions);
        }
        match cuda_backend(&options) {
            Ok(backend) => backend.pin_partitions(partitions),
            Err(why) => {
                log::info!("gpu_join: batches not pinned, no CUDA device: {why}");
                Ok(partitions)
            }
        }
    }
}
