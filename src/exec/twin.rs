//! What the GPU join reads off its twin, the `HashJoinExec` it keeps over
//! the same children.

use std::sync::Arc;

use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

use crate::algorithms::KeyOrder;

/// The probe side's key expressions.
pub(super) fn probe_keys(twin: &HashJoinExec) -> Vec<Arc<dyn PhysicalExpr>> {
    twin.on().iter().map(|(_, r)| Arc::clone(r)).collect()
}

/// Build sides the join collects: one per partition in `Partitioned` mode.
pub(super) fn build_sides(twin: &HashJoinExec) -> usize {
    match twin.mode {
        PartitionMode::Partitioned => twin.left().output_partitioning().partition_count(),
        PartitionMode::CollectLeft | PartitionMode::Auto => 1,
    }
}

/// Whether matches must leave in probe row order: the hash join's promise
/// for an ordered probe input, unless the output leaves in key order.
pub(super) fn probe_order_required(twin: &HashJoinExec, key_order: Option<&KeyOrder>) -> bool {
    key_order.is_none() && ExecutionPlan::maintains_input_order(twin)[1] && twin.right().output_ordering().is_some()
}
