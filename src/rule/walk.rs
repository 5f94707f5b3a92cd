//! A plan rewrite that knows, at each node, whether some ancestor relies on
//! that node's output ordering or on its output partitioning.

use std::sync::Arc;

use datafusion::common::internal_err;
use datafusion::error::Result;
use datafusion::physical_expr::{Distribution, Partitioning};
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

/// What the ancestors of a node rely on in its output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Relied {
    pub ordering: bool,
    pub partitioning: bool,
}

/// The two calls a rewrite makes at each node.
pub(super) trait Visitor {
    /// Before the node's children: whether its visit will replace it with a
    /// node that needs no distribution of its inputs (a join that will
    /// collect its build side), so that nothing relies on their
    /// partitioning on its behalf and they may be reshaped too.
    fn frees_inputs(&mut self, node: &Arc<dyn ExecutionPlan>, relied: Relied) -> Result<bool>;

    /// After its children: a replacement, if any. Where `frees_inputs` was
    /// true, there must be one, needing no distribution of its inputs: the
    /// children were rewritten as if the node needed none.
    fn visit(
        &mut self,
        node: &Arc<dyn ExecutionPlan>,
        relied: Relied,
        frees_inputs: bool,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>>;
}

/// Nodes the rewrite leaves as they are, with everything below them.
pub(super) type Leave<'a> = dyn Fn(&Arc<dyn ExecutionPlan>) -> bool + 'a;

/// Rewrites `plan` bottom-up, but for the subtrees `leave` picks, each node
/// told what its ancestors rely on, which is decided top-down. The root's
/// ordering counts as relied on when it has one: the query's ORDER BY may
/// have been satisfied by it and its sort removed before this rule runs.
/// Its partitioning does not: the partitions of the root are simply read
/// one after another.
pub(super) fn rewrite(
    plan: Arc<dyn ExecutionPlan>,
    leave: &Leave<'_>,
    visitor: &mut dyn Visitor,
) -> Result<Arc<dyn ExecutionPlan>> {
    let relied = Relied { ordering: plan.output_ordering().is_some(), partitioning: false };
    rewrite_node(plan, relied, leave, visitor)
}

fn rewrite_node(
    node: Arc<dyn ExecutionPlan>,
    relied: Relied,
    leave: &Leave<'_>,
    visitor: &mut dyn Visitor,
) -> Result<Arc<dyn ExecutionPlan>> {
    if leave(&node) {
        return Ok(node);
    }
    let frees_inputs = visitor.frees_inputs(&node, relied)?;
    let needs = child_needs(&node, relied, frees_inputs);
    let children: Vec<Arc<dyn ExecutionPlan>> = node.children().into_iter().cloned().collect();
    let mut changed = false;
    let mut new_children = Vec::with_capacity(children.len());
    for (child, needed) in children.iter().zip(needs) {
        let new_child = rewrite_node(Arc::clone(child), needed, leave, visitor)?;
        changed |= !Arc::ptr_eq(&new_child, child);
        new_children.push(new_child);
    }
    let node = match changed {
        true => node.replace_children(new_children, ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute))?,
        false => node,
    };
    match visitor.visit(&node, relied, frees_inputs)? {
        Some(replacement) => Ok(replacement),
        None if frees_inputs => internal_err!("GPU join rule: {} was to be replaced and was not", node.name()),
        None => Ok(node),
    }
}

/// What each child's output must keep.
///
/// Ordering: the node requires an ordering of the child, or passes the
/// child's on to an ancestor that relies on it. A sort counts as relying on
/// its input's ordering, since it may skip work because of it.
///
/// Partitioning: the node requires a distribution of the child, or its own
/// output is partitioned by keys and relied on, in which case it may be the
/// child's partitioning passed through; but not where the node is a
/// repartition, whose output is partitioned by the repartition alone, nor
/// where `frees_inputs`, the node's replacement needing none.
fn child_needs(node: &Arc<dyn ExecutionPlan>, relied: Relied, frees_inputs: bool) -> Vec<Relied> {
    let required_ordering = node.required_input_ordering();
    let maintained = node.maintains_input_order();
    let distributions = node.input_distribution_requirements();
    let is_sort = node.is::<SortExec>();
    let passes_partitioning = relied.partitioning
        && !node.is::<RepartitionExec>()
        && !matches!(
            node.output_partitioning(),
            Partitioning::RoundRobinBatch(_) | Partitioning::UnknownPartitioning(_)
        );
    (0..node.children().len())
        .map(|i| Relied {
            ordering: is_sort
                || required_ordering.get(i).is_some_and(Option::is_some)
                || (relied.ordering && maintained.get(i).copied().unwrap_or(false)),
            partitioning: !frees_inputs
                && (passes_partitioning
                    || !matches!(
                        distributions.child_distribution(i),
                        None | Some(Distribution::UnspecifiedDistribution)
                    )),
        })
        .collect()
}
