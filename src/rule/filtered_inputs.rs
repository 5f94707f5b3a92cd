//! Where the dynamic filters of GPU joins are applied to rows below an
//! aggregation (`gpu_join.filters_from_above`): a
//! [`FilteredFromAboveExec`] under each aggregation of raw rows with
//! grouping columns in the probe side of a GPU join. DataFusion's filter
//! pushdown, which runs next, passes a join's filter through an
//! aggregation only where it reads grouping columns, so only such filters
//! reach the node; one that none reaches passes its input's batches on as
//! they come.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};

use crate::exec::{FilteredFromAboveExec, GpuJoinExec};

/// `plan` with a [`FilteredFromAboveExec`] under each aggregation that
/// reads raw rows into groups in the probe side of a GPU join.
pub fn filter_under_aggregations(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    let rewritten = plan.transform_up(|node| {
        let Some(join) = node.downcast_ref::<GpuJoinExec>() else {
            return Ok(Transformed::no(node));
        };
        let [build, probe] = [join.left(), join.right()].map(Arc::clone);
        let filtered = probe.transform_down(|below| match under_aggregation(&below)? {
            Some(aggregation) => Ok(Transformed::yes(aggregation)),
            None => Ok(Transformed::no(below)),
        })?;
        match filtered.transformed {
            true => Ok(Transformed::yes(Arc::clone(&node).replace_children(vec![build, filtered.data], recompute())?)),
            false => Ok(Transformed::no(node)),
        }
    })?;
    Ok(rewritten.data)
}

/// `node`, an aggregation that reads raw rows into groups, over a
/// [`FilteredFromAboveExec`] of its input; `None` for any other node, and
/// for one that already reads through one.
fn under_aggregation(node: &Arc<dyn ExecutionPlan>) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some(aggregation) = node.downcast_ref::<AggregateExec>() else {
        return Ok(None);
    };
    let reads_rows =
        matches!(aggregation.mode(), AggregateMode::Partial | AggregateMode::Single | AggregateMode::SinglePartitioned);
    let groups = aggregation.group_expr();
    let input = aggregation.input();
    if !reads_rows || groups.expr().is_empty() || input.downcast_ref::<FilteredFromAboveExec>().is_some() {
        return Ok(None);
    }
    let filtered = Arc::new(FilteredFromAboveExec::new(Arc::clone(input))) as Arc<dyn ExecutionPlan>;
    Ok(Some(Arc::clone(node).replace_children(vec![filtered], recompute())?))
}

/// Children replaced, properties computed again.
fn recompute() -> ReplaceChildrenOptions {
    ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute)
}
