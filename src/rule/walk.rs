//! A plan rewrite that knows, at each node, whether some ancestor relies on
//! that node's output ordering or on its output partitioning.

use std::sync::Arc;

use datafusion::error::Result;
use datafusion::physical_expr::{Distribution, Partitioning};
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

/// What the ancestors of a node rely on in its output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Relied {
    pub ordering: bool,
    pub partitioning: bool,
}

/// Called on each node after its children; returns a replacement, if any.
pub(super) type Visit<'a> = dyn FnMut(&Arc<dyn ExecutionPlan>, Relied) -> Result<Option<Arc<dyn ExecutionPlan>>> + 'a;

/// Nodes the rewrite leaves as they are, with everything below them.
pub(super) type Leave<'a> = dyn Fn(&Arc<dyn ExecutionPlan>) -> bool + 'a;

/// Rewrites `plan` bottom-up, but for the subtrees `leave` picks. The
/// root's ordering counts as relied on when it has one: the query's ORDER
/// BY may have been satisfied by it and its sort removed before this rule
/// runs. Its partitioning does not: the partitions of the root are simply
/// read one after another.
pub(super) fn rewrite(
    plan: Arc<dyn ExecutionPlan>,
    leave: &Leave<'_>,
    visit: &mut Visit<'_>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let relied = Relied { ordering: plan.output_ordering().is_some(), partitioning: false };
    rewrite_node(plan, relied, leave, visit)
}

fn rewrite_node(
    node: Arc<dyn ExecutionPlan>,
    relied: Relied,
    leave: &Leave<'_>,
    visit: &mut Visit<'_>,
) -> Result<Arc<dyn ExecutionPlan>> {
    if leave(&node) {
        return Ok(node);
    }
    let needs = child_needs(&node, relied);
    let children: Vec<Arc<dyn ExecutionPlan>> = node.children().into_iter().cloned().collect();
    let mut changed = false;
    let mut new_children = Vec::with_capacity(children.len());
    for (child, needed) in children.iter().zip(needs) {
        let new_child = rewrite_node(Arc::clone(child), needed, leave, visit)?;
        changed |= !Arc::ptr_eq(&new_child, child);
        new_children.push(new_child);
    }
    let node = match changed {
        true => node.replace_children(new_children, ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute))?,
        false => node,
    };
    Ok(visit(&node, relied)?.unwrap_or(node))
}

/// What each child's output must keep.
///
/// Ordering: the node requires an ordering of the child, or passes the
/// child's on to an ancestor that relies on it. A sort counts as relying on
/// its input's ordering, since it may skip work because of it.
///
/// Partitioning: the node requires a distribution of the child, or its own
/// output is partitioned by keys and relied on, in which case it may be the
/// child's partitioning passed through.
fn child_needs(node: &Arc<dyn ExecutionPlan>, relied: Relied) -> Vec<Relied> {
    let required_ordering = node.required_input_ordering();
    let maintained = node.maintains_input_order();
    let distributions = node.input_distribution_requirements();
    let is_sort = node.is::<SortExec>();
    let passes_partitioning = relied.partitioning
        && !matches!(
            node.output_partitioning(),
            Partitioning::RoundRobinBatch(_) | Partitioning::UnknownPartitioning(_)
        );
    (0..node.children().len())
        .map(|i| Relied {
            ordering: is_sort
                || required_ordering.get(i).is_some_and(Option::is_some)
                || (relied.ordering && maintained.get(i).copied().unwrap_or(false)),
            partitioning: passes_partitioning
                || !matches!(distributions.child_distribution(i), None | Some(Distribution::UnspecifiedDistribution)),
        })
        .collect()
}
