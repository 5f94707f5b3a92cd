//! The plan shape a GPU join runs best in.
//!
//! DataFusion plans large joins in `Partitioned` mode: both inputs are
//! hash-repartitioned on the CPU so that each of `target_partitions` cores
//! joins one key range. A GPU join needs none of that: one build side on the
//! device serves every probe partition. Where nothing above the join relies
//! on its hash partitioning, the join runs in `CollectLeft` mode instead and
//! the two hash repartitions go: the build side's partitions are merged, and
//! the probe side keeps the partitions it had (spread round-robin when it had
//! fewer), so the probe side is staged and the output consumed on as many
//! cores as before.

use std::sync::Arc;

use datafusion::error::Result;
use datafusion::physical_expr::Partitioning;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

/// The join in `CollectLeft` mode without the hash repartitions below it,
/// or `None` when it is not a `Partitioned` join over two plain hash
/// repartitions.
pub(super) fn with_one_build_side(join: &HashJoinExec) -> Result<Option<HashJoinExec>> {
    if *join.partition_mode() != PartitionMode::Partitioned {
        return Ok(None);
    }
    let (Some(build), Some(probe)) = (hash_repartition_input(join.left()), hash_repartition_input(join.right())) else {
        return Ok(None);
    };
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
