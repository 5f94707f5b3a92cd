//! The plan shape a GPU join runs best in.
//!
//! DataFusion plans large joins in `Partitioned` mode: both inputs are
//! hash-repartitioned on the CPU so that each of `target_partitions` cores
//! joins one key range. A GPU join needs none of that: one build side on the
//! device serves every probe partition. Where nothing above the join relies
//! on its hash partitioning, the join runs in `CollectLeft` mode instead and
//! its inputs' hash repartitions go: the build side's partitions are merged,
//! and the probe side keeps the partitions it had (spread round-robin when it
//! had fewer), so the probe side is staged and the output consumed on as many
//! cores as before. One input may be other than a hash repartition (another
//! join, whose output DataFusion partitioned by the same keys): that one is
//! merged or kept as it is.

use std::sync::Arc;

use datafusion::error::Result;
use datafusion::physical_expr::Partitioning;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

/// Whether `join` is a `Partitioned` join over at least one hash
/// repartition, which [`with_one_build_side`] would remove.
pub(super) fn may_collect_build_side(join: &HashJoinExec) -> bool {
    *join.partition_mode() == PartitionMode::Partitioned
        && (hash_repartition_input(join.left()).is_some() || hash_repartition_input(join.right()).is_some())
}

/// The join in `CollectLeft` mode without the hash repartitions below it,
/// or `None` where [`may_collect_build_side`] says no.
pub(super) fn with_one_build_side(join: &HashJoinExec) -> Result<Option<HashJoinExec>> {
    if !may_collect_build_side(join) {
        return Ok(None);
    }
    let build = hash_repartition_input(join.left()).unwrap_or_else(|| Arc::clone(join.left()));
    let probe = hash_repartition_input(join.right()).unwrap_or_else(|| Arc::clone(join.right()));
    let partitions = join.right().output_partitioning().partition_count();
    let build = match build.output_partitioning().partition_count() {
        1 => build,
        _ => Arc::new(CoalescePartitionsExec::new(build)) as Arc<dyn ExecutionPlan>,
    };
    let probe = match probe.output_partitioning().partition_count() {
        n if n >= partitions => probe,
        _ => Arc::new(RepartitionExec::try_new(probe, Partitioning::RoundRobinBatch(partitions))?),
    };
    let join = join
        .builder()
        .reset_state()
        .with_partition_mode(PartitionMode::CollectLeft)
        .with_new_children(vec![build, probe])?
        .recompute_properties()
        .build()?;
    Ok(Some(join))
}

/// The input of a hash repartition that keeps no order.
fn hash_repartition_input(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    let repartition = plan.downcast_ref::<RepartitionExec>()?;
    match repartition.partitioning() {
        Partitioning::Hash(..) if !repartition.preserve_order() => Some(Arc::clone(repartition.input())),
        _ => None,
    }
}
