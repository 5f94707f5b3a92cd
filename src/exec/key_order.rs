//! The order of a sort-merge join that a GPU join replaces.
//!
//! `SortMergeJoinExec` leaves rows in the order of its sorted inputs, and
//! the plan above may rely on it. A GPU join that replaces it sorts both
//! sides on the device instead, so the sorts below it go, and promises
//! exactly what the sort-merge join over sorted inputs would have: its
//! properties are those of that join, worked out again whenever the
//! children change.

use std::sync::Arc;

use arrow::compute::SortOptions;
use datafusion::common::{JoinType, internal_err};
use datafusion::error::Result;
use datafusion::physical_expr::{LexOrdering, PhysicalExprRef, PhysicalSortExpr};
use datafusion::physical_plan::joins::{HashJoinExec, SortMergeJoinExec};
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::{ExecutionPlan, PlanProperties};

use crate::algorithms::KeyOrder;

/// What a sort-merge join promised about its output order.
#[derive(Debug, Clone)]
pub(crate) struct SortMergeOrder {
    /// The sort-merge join's own join type.
    join_type: JoinType,
    sort_options: Vec<SortOptions>,
    /// The GPU join's build side is the sort-merge join's right input: a
    /// join that keeps the right side's order (Right, RightSemi, …) runs
    /// as its mirror image, since the order is that of the build side.
    swapped: bool,
    /// Per input of the sort-merge join (left, right): a sort by the keys
    /// below it was removed. An input whose sort stays, or that had none,
    /// fed the merge in an order of its own, which pairs keep.
    sorts_removed: (bool, bool),
}

/// A sort-merge order and the properties it gives a GPU join's output.
#[derive(Debug, Clone)]
pub(crate) struct OrderedOutput {
    pub order: SortMergeOrder,
    pub properties: Arc<PlanProperties>,
    pub key_order: KeyOrder,
}

impl SortMergeOrder {
    pub fn new(join: &SortMergeJoinExec, swapped: bool, sorts_removed: (bool, bool)) -> Self {
        Self { join_type: join.join_type(), sort_options: join.sort_options().to_vec(), swapped, sorts_removed }
    }

    /// The ordering of `keys` in `join`'s sort options.
    pub fn key_ordering(join: &SortMergeJoinExec, keys: &[PhysicalExprRef]) -> Option<LexOrdering> {
        ordering_of(keys, join.sort_options())
    }

    /// Whether a sort-merge join of this type keeps the right input's order,
    /// so that its GPU join must swap sides.
    pub fn keeps_right_order(join_type: JoinType) -> bool {
        matches!(join_type, JoinType::Right | JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark)
    }

    /// The output that `twin` (the GPU join's equivalent hash join, sides
    /// swapped if so) gives when it leaves in this order.
    pub fn output(self, twin: &HashJoinExec) -> Result<OrderedOutput> {
        let (mut left, mut right) = (Arc::clone(twin.left()), Arc::clone(twin.right()));
        let mut on: Vec<(PhysicalExprRef, PhysicalExprRef)> = twin.on().to_vec();
        let mut filter = twin.filter().cloned();
        if self.swapped {
            std::mem::swap(&mut left, &mut right);
            on = on.into_iter().map(|(l, r)| (r, l)).collect();
            filter = filter.map(|f| f.swap());
        }
        let (left_keys, right_keys): (Vec<_>, Vec<_>) = on.iter().cloned().unzip();
        let (left_removed, right_removed) = self.sorts_removed;
        let (left, right) =
            (self.sorted(left, &left_keys, left_removed)?, self.sorted(right, &right_keys, right_removed)?);
        let join = SortMergeJoinExec::try_new(
            left,
            right,
            on,
            filter,
            self.join_type,
            self.sort_options.clone(),
            twin.null_equality(),
        )?;
        let properties = Arc::clone(join.properties());
        let Some(output_ordering) = properties.output_ordering().cloned() else {
            return internal_err!("a {} sort-merge join has no output order to keep", self.join_type);
        };
        let probe_ordered = !if self.swapped { left_removed } else { right_removed };
        let key_order = KeyOrder { sort_options: self.sort_options.clone(), output_ordering, probe_ordered };
        Ok(OrderedOutput { order: self, properties, key_order })
    }

    /// `plan` as the sort-merge join read it: sorted by its keys where that
    /// sort was removed.
    fn sorted(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        keys: &[PhysicalExprRef],
        removed: bool,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match (removed, ordering_of(keys, &self.sort_options)) {
            (true, Some(ordering)) => Ok(Arc::new(SortExec::new(ordering, plan).with_preserve_partitioning(true))),
            _ => Ok(plan),
        }
    }
}

/// `keys` in the sort options `options`, one per key.
fn ordering_of(keys: &[PhysicalExprRef], options: &[SortOptions]) -> Option<LexOrdering> {
    LexOrdering::new(keys.iter().zip(options).map(|(k, o)| PhysicalSortExpr::new(Arc::clone(k), *o)))
}
