//! The physical optimizer rule that moves joins to the GPU.
//!
//! It runs immediately before `FilterPushdown(Post)`: by then DataFusion has
//! fixed join order, partition modes, repartitioning and embedded
//! projections, and no hash join has planted a dynamic filter yet.

mod assess;
mod decisions;
mod not_on_gpu;
mod shape;
mod walk;

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;

pub use decisions::{JoinDecision, Placement, plan_decisions};
pub use not_on_gpu::NotOnGpu;

use crate::config::{ExplainChoice, GpuJoinConfig};
use assess::{Assessment, RuleContext};

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
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        let options = GpuJoinConfig::from_config(config);
        let mut context = RuleContext::new(&options);
        let mut decisions = vec![];
        let plan = walk::rewrite(plan, &mut |node, relied| {
            let Some(assessment) = context.assess(node, relied)? else {
                return Ok(None);
            };
            Ok(match assessment {
                Assessment::Replace(gpu_join) => {
                    decisions.push(JoinDecision::for_gpu_join(&gpu_join));
                    Some(gpu_join as Arc<dyn ExecutionPlan>)
                }
                Assessment::Keep(reason) => {
                    decisions.push(JoinDecision::for_cpu_join(node, reason));
                    None
                }
            })
        })?;
        for decision in &decisions {
            match (options.explain, &decision.placement) {
                (ExplainChoice::All, _) | (ExplainChoice::NotOnGpu, Placement::NotOnGpu(_)) => {
                    log::info!("gpu_join: {decision}")
                }
                _ => {}
            }
        }
        Ok(plan)
    }

    fn name(&self) -> &str {
        Self::NAME
    }

    fn schema_check(&self) -> bool {
        true
    }
}
