//! Where each join of a plan runs, and why.

use std::fmt;
use std::sync::Arc;

use datafusion::common::JoinType;
use datafusion::common::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::joins::{HashJoinExec, SortMergeJoinExec};

use super::assess::{Assessment, RuleContext, Shape};
use super::not_on_gpu::NotOnGpu;
use super::walk;
use crate::config::GpuJoinConfig;
use crate::exec::GpuJoinExec;

/// Where a join runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// On a GPU join backend, with the planned algorithm (e.g. `PHJ-OM`).
    Gpu { backend: &'static str, algorithm: String },
    /// On DataFusion's operator.
    NotOnGpu(NotOnGpu),
}

/// One join of a plan and where it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinDecision {
    /// The DataFusion operator the join was planned as.
    pub operator: String,
    pub join_type: JoinType,
    /// The join keys, as `(build, probe)` pairs.
    pub on: String,
    pub placement: Placement,
}

fn keys_text<'a>(
    on: impl Iterator<
        Item = &'a (Arc<dyn datafusion::physical_expr::PhysicalExpr>, Arc<dyn datafusion::physical_expr::PhysicalExpr>),
    >,
) -> String {
    on.map(|(l, r)| format!("({l}, {r})")).collect::<Vec<_>>().join(", ")
}

impl JoinDecision {
    pub(super) fn for_gpu_join(join: &GpuJoinExec) -> Self {
        Self {
            operator: join.replaces().name().to_string(),
            join_type: join.join_type(),
            on: keys_text(join.on().iter()),
            placement: Placement::Gpu { backend: join.backend().name(), algorithm: join.strategy_text().0 },
        }
    }

    pub(super) fn for_cpu_join(node: &Arc<dyn ExecutionPlan>, reason: NotOnGpu) -> Self {
        let (join_type, on) = if let Some(join) = node.downcast_ref::<HashJoinExec>() {
            (*join.join_type(), keys_text(join.on().iter()))
        } else if let Some(join) = node.downcast_ref::<SortMergeJoinExec>() {
            (join.join_type(), keys_text(join.on().iter()))
        } else {
            (JoinType::Inner, String::new())
        };
        Self { operator: node.name().to_string(), join_type, on, placement: Placement::NotOnGpu(reason) }
    }
}

impl fmt::Display for JoinDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?} on [{}]: ", self.operator, self.join_type, self.on)?;
        match &self.placement {
            Placement::Gpu { backend, algorithm } => {
                write!(f, "GpuJoinExec, backend {backend}, {algorithm}")
            }
            Placement::NotOnGpu(reason) => write!(f, "stays on DataFusion: {reason}"),
        }
    }
}

/// Where each join of a physical plan runs, in plan order (bottom-up): joins
/// the rule replaced, and for the others, why they stay on DataFusion.
pub fn plan_decisions(plan: &Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Vec<JoinDecision>> {
    let options = GpuJoinConfig::from_config(config);
    let mut lister = DecisionLister { context: RuleContext::new(&options, Shape::Best), decisions: vec![] };
    walk::rewrite(Arc::clone(plan), &|_| false, &mut lister)?;
    Ok(lister.decisions)
}

/// Lists where each join of a planned physical plan runs, changing nothing.
struct DecisionLister<'a> {
    context: RuleContext<'a>,
    decisions: Vec<JoinDecision>,
}

impl walk::Visitor for DecisionLister<'_> {
    /// A join the rule reshaped is a `GpuJoinExec` by now, whose inputs
    /// need no partitioning of their own: the walk sees that without a guess.
    fn frees_inputs(&mut self, _: &Arc<dyn ExecutionPlan>, _: walk::Relied) -> Result<bool> {
        Ok(false)
    }

    fn visit(
        &mut self,
        node: &Arc<dyn ExecutionPlan>,
        relied: walk::Relied,
        _: bool,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        if let Some(join) = node.downcast_ref::<GpuJoinExec>() {
            self.decisions.push(JoinDecision::for_gpu_join(join));
            return Ok(None);
        }
        match self.context.assess(node, relied, false)? {
            Some(Assessment::Keep(reason)) => self.decisions.push(JoinDecision::for_cpu_join(node, reason)),
            Some(Assessment::Replace(_)) => self.decisions.push(JoinDecision::for_cpu_join(node, NotOnGpu::RuleNotRun)),
            None => {}
        }
        Ok(None)
    }
}
