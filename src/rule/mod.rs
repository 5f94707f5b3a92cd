//! The physical optimizer rule that moves joins to the GPU.
//!
//! It runs immediately before `FilterPushdown(Post)`: by then DataFusion has
//! fixed join order, partition modes, repartitioning and embedded
//! projections, and no hash join has planted a dynamic filter yet.

mod aggregations;
mod assess;
mod decisions;
mod filtered_inputs;
mod not_on_gpu;
mod shape;
mod walk;

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;

pub use aggregations::{AggregateDecision, AggregatePlacement, plan_aggregate_decisions};
pub use decisions::{JoinDecision, Placement, plan_decisions};
pub use not_on_gpu::NotOnGpu;

use crate::config::{ExplainChoice, GpuJoinConfig};
use assess::{Assessment, RuleContext, Shape};

/// The prefix of `datafusion-distributed`'s options in a session's config.
const DISTRIBUTED_PREFIX: &str = "distributed";

/// `plan` with each `HashJoinExec` the GPU can run swapped for a
/// `GpuJoinExec` over the same children, with the same schema,
/// partitioning and ordering, feeding the dynamic filter the hash join
/// planted; sort-merge joins, and joins the GPU cannot help, stay as they
/// are, and so do the subtrees `leave` picks. The plan keeps its topology,
/// as a stage of a distributed plan must where it is swapped on a worker.
/// Returns where each join runs.
pub fn replace_joins_as_planned(
    plan: Arc<dyn ExecutionPlan>,
    options: &GpuJoinConfig,
    leave: &dyn Fn(&Arc<dyn ExecutionPlan>) -> bool,
) -> Result<(Arc<dyn ExecutionPlan>, Vec<JoinDecision>)> {
    replace_joins(plan, options, Shape::AsPlanned, leave)
}

/// The rule's walk: every join assessed, replaced where the GPU can run
/// it, and where each one runs logged as `gpu_join.explain` says.
fn replace_joins(
    plan: Arc<dyn ExecutionPlan>,
    options: &GpuJoinConfig,
    shape: Shape,
    leave: &walk::Leave<'_>,
) -> Result<(Arc<dyn ExecutionPlan>, Vec<JoinDecision>)> {
    let mut replacer = JoinReplacer { context: RuleContext::new(options, shape), decisions: vec![] };
    let plan = walk::rewrite(plan, leave, &mut replacer)?;
    for decision in &replacer.decisions {
        match (options.explain, &decision.placement) {
            (ExplainChoice::All, _) | (ExplainChoice::NotOnGpu, Placement::NotOnGpu(_)) => {
                log::info!("gpu_join: {decision}")
            }
            _ => {}
        }
    }
    Ok((plan, replacer.decisions))
}

/// The rule's visitor: each join assessed, replaced where the GPU can run
/// it, and where it runs noted.
struct JoinReplacer<'a> {
    context: RuleContext<'a>,
    decisions: Vec<JoinDecision>,
}

impl walk::Visitor for JoinReplacer<'_> {
    fn frees_inputs(&mut self, node: &Arc<dyn ExecutionPlan>, relied: walk::Relied) -> Result<bool> {
        self.context.collects_build_side(node, relied)
    }

    fn visit(
        &mut self,
        node: &Arc<dyn ExecutionPlan>,
        relied: walk::Relied,
        frees_inputs: bool,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(assessment) = self.context.assess(node, relied, frees_inputs)? else {
            return Ok(None);
        };
        Ok(match assessment {
            Assessment::Replace(gpu_join) => {
                self.decisions.push(JoinDecision::for_gpu_join(&gpu_join));
                Some(gpu_join as Arc<dyn ExecutionPlan>)
            }
            Assessment::Keep(reason) => {
                self.decisions.push(JoinDecision::for_cpu_join(node, reason));
                None
            }
        })
    }
}

/// Replaces `HashJoinExec` and `SortMergeJoinExec` with `GpuJoinExec` where
/// the GPU can run them; every other join keeps DataFusion's operator, and
/// the reason is logged (see `gpu_join.explain`) and listed by
/// [`plan_decisions`].
#[derive(Debug, Default)]
pub struct GpuJoinRule;

impl GpuJoinRule {
    /// The name this rule has in `EXPLAIN VERBOSE`.
    pub const NAME: &'static str = "GpuJoin";
}

impl PhysicalOptimizerRule for GpuJoinRule {
    /// In a session that distributes its plans (`datafusion-distributed`'s
    /// planner, whose options live under the `distributed` prefix), the
    /// rule leaves the plan to the distributed planner, which recognises
    /// DataFusion's joins only: a `CollectLeft` join it did not know would
    /// be split across tasks, each seeing part of the build side. The joins
    /// of each stage are swapped one for one where the stage runs
    /// ([`replace_joins_as_planned`]).
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        if config.extensions.iter().any(|(prefix, _)| prefix == DISTRIBUTED_PREFIX) {
            log::debug!("gpu_join: a distributed plan; its stages swap their joins where they run");
            return Ok(plan);
        }
        let options = GpuJoinConfig::from_config(config);
        let plan = replace_joins(plan, &options, Shape::Best, &|_| false)?.0;
        let plan = match options.filters_from_above {
            true => filtered_inputs::filter_under_aggregations(plan)?,
            false => plan,
        };
        aggregations::group_on_backend(plan, &options)
    }

    fn name(&self) -> &str {
        Self::NAME
    }

    fn schema_check(&self) -> bool {
        true
    }
}
