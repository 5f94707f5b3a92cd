//! A plan rewrite that knows, at each node, whether some ancestor relies on
//! that node's output ordering.

use std::sync::Arc;

use datafusion::error::Result;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

/// Called on each node after its children; returns a replacement, if any.
pub(super) type Visit<'a> = dyn FnMut(&Arc<dyn ExecutionPlan>, bool) -> Result<Option<Arc<dyn ExecutionPlan>>> + 'a;

/// Rewrites `plan` bottom-up. The root's ordering counts as needed when it
/// has one: the query's ORDER BY may have been satisfied by it and its sort
/// removed before this rule runs.
pub(super) fn rewrite(plan: Arc<dyn ExecutionPlan>, visit: &mut Visit<'_>) -> Result<Arc<dyn ExecutionPlan>> {
    let needed = plan.output_ordering().is_some();
    rewrite_node(plan, needed, visit)
}

fn rewrite_node(
    node: Arc<dyn ExecutionPlan>,
    ordering_needed: bool,
    visit: &mut Visit<'_>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let needs = child_ordering_needs(&node, ordering_needed);
    let children: Vec<Arc<dyn ExecutionPlan>> = node.children().into_iter().cloned().collect();
    let mut changed = false;
    let mut new_children = Vec::with_capacity(children.len());
    for (child, needed) in children.iter().zip(needs) {
        let new_child = rewrite_node(Arc::clone(child), needed, visit)?;
        changed |= !Arc::ptr_eq(&new_child, child);
        new_children.push(new_child);
    }
    let node = match changed {
        true => node.replace_children(new_children, ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute))?,
        false => node,
    };
    Ok(visit(&node, ordering_needed)?.unwrap_or(node))
}

/// Whether each child's output ordering is relied on: the node requires an
/// ordering of it, or passes it on to an ancestor that does. A sort counts as
/// relying on its input's ordering, since it may skip work because of it.
fn child_ordering_needs(node: &Arc<dyn ExecutionPlan>, ordering_needed: bool) -> Vec<bool> {
    let required = node.required_input_ordering();
    let maintained = node.maintains_input_order();
    let is_sort = node.is::<SortExec>();
    (0..node.children().len())
        .map(|i| {
            is_sort
                || required.get(i).is_some_and(Option::is_some)
                || (ordering_needed && maintained.get(i).copied().unwrap_or(false))
        })
        .collect()
}
