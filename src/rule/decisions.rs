//! Where each join of a plan runs, and why.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion::common::JoinType;
use datafusion::common::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::joins::{HashJoinExec, SortMergeJoinExec};

use super::assess::{Assessment, RuleContext};
use super::walk;
use crate::config::GpuJoinConfig;
use crate::exec::GpuJoinExec;

/// Why a join stays on DataFusion's operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotOnGpu {
    /// `gpu_join.enabled` is false.
    Disabled,
    /// No usable CUDA device under `gpu_join.backend = auto`.
    NoDevice(String),
    /// The join's partition mode was not decided by the planner.
    PartitionModeUndecided,
    /// A null-aware anti join (NOT IN) with more than one key.
    NullAwareMultiKey,
    /// The two sides of a key have different types.
    KeyTypesDiffer { build: DataType, probe: DataType },
    /// A key type the GPU join does not handle.
    UnsupportedKeyType(DataType),
    /// The most rows the build side can have plus the probe side's
    /// estimated rows are below `gpu_join.min_rows`.
    BelowMinRows { rows: usize, min_rows: usize },
    /// The build side can have no more rows than this, below
    /// `gpu_join.min_build_rows`, and the GPU join would run the join in
    /// the shape DataFusion planned it: DataFusion's operator would join it
    /// as collected anyway.
    BelowMinBuildRows { rows: usize, min_build_rows: usize },
    /// An ancestor relies on the sort-merge join's sorted output, and a key
    /// of this type does not sort on the GPU.
    OrderingRelied(DataType),
    /// The plan was made without the GPU join rule.
    RuleNotRun,
}

impl fmt::Display for NotOnGpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotOnGpu::Disabled => write!(f, "gpu_join.enabled is false"),
            NotOnGpu::NoDevice(why) => write!(f, "no usable CUDA device ({why})"),
            NotOnGpu::PartitionModeUndecided => write!(f, "its partition mode is not decided"),
            NotOnGpu::NullAwareMultiKey => write!(f, "null-aware anti join with several keys"),
            NotOnGpu::KeyTypesDiffer { build, probe } => {
                write!(f, "key types differ: build {build}, probe {probe}")
            }
            NotOnGpu::UnsupportedKeyType(t) => write!(f, "unsupported key type {t}"),
            NotOnGpu::BelowMinRows { rows, min_rows } => {
                write!(f, "at most about {rows} rows, below gpu_join.min_rows = {min_rows}")
            }
            NotOnGpu::BelowMinBuildRows { rows, min_build_rows } => {
                write!(f, "at most {rows} build rows, below gpu_join.min_build_rows = {min_build_rows}")
            }
            NotOnGpu::OrderingRelied(t) => {
                write!(
                    f,
                    "the plan relies on the sort-merge join's output ordering, and {t} keys do not sort on the GPU"
                )
            }
            NotOnGpu::RuleNotRun => {
                write!(f, "the GPU join rule is not registered for this session")
            }
        }
    }
}

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
    let mut context = RuleContext::new(&options);
    let mut decisions = vec![];
    walk::rewrite(Arc::clone(plan), &mut |node, relied| {
        if let Some(join) = node.downcast_ref::<GpuJoinExec>() {
            decisions.push(JoinDecision::for_gpu_join(join));
            return Ok(None);
        }
        match context.assess(node, relied)? {
            Some(Assessment::Keep(reason)) => decisions.push(JoinDecision::for_cpu_join(node, reason)),
            Some(Assessment::Replace(_)) => decisions.push(JoinDecision::for_cpu_join(node, NotOnGpu::RuleNotRun)),
            None => {}
        }
        Ok(None)
    })?;
    Ok(decisions)
}
