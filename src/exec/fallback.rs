//! DataFusion's own operator for a probe chunk the GPU could not join.
//!
//! A probe chunk that keeps running out of device memory is joined by
//! `HashJoinExec` over the build side's host copy
//! ([`super::device_build`]). A build side too large for the device, of a join that cannot be split
//! into passes, is joined by the same operator for the whole probe side.
//! Where the GPU join's output leaves in key order, DataFusion's output is
//! sorted into it.

use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::common::internal_err;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::metrics::MetricValue;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, SendableRecordBatchStream, collect};
use futures::stream;

use crate::algorithms::JoinDefinition;
use crate::arrays::concat_record_batches;

/// Every output row of a partition that the device could not join whole
/// (a join whose output leaves in key order): DataFusion's hash join of
/// both sides' host copies, sorted.
pub(super) async fn join_partition_on_cpu(
    twin: &HashJoinExec,
    definition: &JoinDefinition,
    build: &RecordBatch,
    probe: RecordBatch,
    context: Arc<TaskContext>,
    error: DataFusionError,
) -> Result<Vec<RecordBatch>> {
    log::warn!("gpu_join: joining a partition of {} probe rows on DataFusion's operator: {error}", probe.num_rows());
    let right = MemorySourceConfig::try_new_exec(&[vec![probe]], twin.right().schema(), None)?;
    let join = hash_join_over(twin, std::slice::from_ref(build), right, PartitionMode::CollectLeft, 0)?;
    collect(in_key_order(definition, join), context_for(definition, &context)).await
}

/// DataFusion's default `batch_size`: the fewest rows a batch of DataFusion's
/// operator holds where its output is sorted into the GPU join's key order.
const SORTED_RUN_ROWS: usize = 8192;

/// The task context DataFusion's operator runs in for `definition`'s join:
/// where its output is sorted into the key order ([`in_key_order`]),
/// `context` with batches of at least [`SORTED_RUN_ROWS`] rows. The sort
/// merges each batch of its input as a run, and each batch it emits
/// interleaves over every run: in batches of a few rows, a partition's
/// thousands of runs made that quadratic and the sort never ended. The
/// partition's output is sliced to the session's batch size on its way
/// out, so larger batches change nothing its consumer sees.
pub(super) fn context_for(definition: &JoinDefinition, context: &Arc<TaskContext>) -> Arc<TaskContext> {
    let config = context.session_config();
    if definition.key_order.is_none() || config.batch_size() >= SORTED_RUN_ROWS {
        return Arc::clone(context);
    }
    Arc::new(TaskContext::new(
        context.task_id(),
        context.session_id(),
        config.clone().with_batch_size(SORTED_RUN_ROWS),
        context.scalar_functions().clone(),
        context.higher_order_functions().clone(),
        context.aggregate_functions().clone(),
        context.window_functions().clone(),
        context.runtime_env(),
    ))
}

/// The CPU time partition `partition` of DataFusion's plan `join` spent in
/// its operators, not in the leaves that hand it the GPU join's batches.
pub(super) fn datafusion_compute(join: &Arc<dyn ExecutionPlan>, partition: usize) -> Duration {
    let mut nanos = 0;
    let _ = join.apply(|node| {
        if !node.children().is_empty()
            && let Some(metrics) = node.metrics()
        {
            nanos += metrics
                .iter()
                .filter(|metric| metric.partition() == Some(partition))
                .filter(|metric| matches!(metric.value(), MetricValue::ElapsedCompute(_)))
                .map(|metric| metric.value().as_usize())
                .sum::<usize>();
        }
        Ok(TreeNodeRecursion::Continue)
    });
    Duration::from_nanos(nanos as u64)
}

/// DataFusion's plan `join` made to leave in the GPU join's key order, if
/// it has one: sorted, partition by partition.
pub(super) fn in_key_order(definition: &JoinDefinition, join: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    match &definition.key_order {
        Some(order) => Arc::new(SortExec::new(order.output_ordering.clone(), join).with_preserve_partitioning(true)),
        None => join,
    }
}

/// DataFusion's hash join of the build side's host batches with `right`. In
/// `CollectLeft` mode the build side serves every partition of `right`; in
/// `Partitioned` mode it is partition `partition`'s alone, and only that
/// partition of the join may be executed.
pub(super) fn hash_join_over(
    twin: &HashJoinExec,
    build: &[RecordBatch],
    right: Arc<dyn ExecutionPlan>,
    mode: PartitionMode,
    partition: usize,
) -> Result<Arc<dyn ExecutionPlan>> {
    Ok(Arc::new(hash_join_exec(twin, build, right, mode, partition)?))
}

/// DataFusion's hash join of partition `partition` with its sides swapped:
/// `probe`, the partition's probe rows read whole, builds the hash table,
/// and the build side's batches stream through it. The output has the
/// join's columns, in the order of the build side's rows. Only that
/// partition of the join may be executed.
pub(super) fn swapped_hash_join(
    twin: &HashJoinExec,
    build: &[RecordBatch],
    probe: Vec<RecordBatch>,
    partitions: usize,
    partition: usize,
) -> Result<Arc<dyn ExecutionPlan>> {
    let right = held_partition(twin.right().schema(), partitions, partition, probe)?;
    hash_join_exec(twin, build, right, PartitionMode::Partitioned, partition)?.swap_inputs(PartitionMode::Partitioned)
}

/// DataFusion's hash join as [`hash_join_over`] describes it, before it is
/// shared as a plan, so that [`swapped_hash_join`] can swap its sides.
fn hash_join_exec(
    twin: &HashJoinExec,
    build: &[RecordBatch],
    right: Arc<dyn ExecutionPlan>,
    mode: PartitionMode,
    partition: usize,
) -> Result<HashJoinExec> {
    let (partitions, at) = match mode {
        PartitionMode::Partitioned => (right.output_partitioning().partition_count(), partition),
        _ => (1, 0),
    };
    let mode = match mode {
        PartitionMode::Partitioned => PartitionMode::Partitioned,
        _ => PartitionMode::CollectLeft,
    };
    let left = held_partition(twin.left().schema(), partitions, at, build.to_vec())?;
    twin.builder()
        .reset_state()
        .with_partition_mode(mode)
        .with_fetch(None)
        .with_new_children(vec![left, right])?
        .recompute_properties()
        .build()
}

/// A build side for DataFusion's operator: its batches as one, in the
/// order the operator would concatenate them (the last batch first), each
/// string view buffer that the batches share kept once. The operator
/// concatenates with arrow's `concat`, which keeps every batch's buffers:
/// a build side taken from another join's output then holds each of that
/// join's buffers once per batch, and every batch of its output carries
/// them all (TPC-DS Q65 at scale factor 10: 1.2 million buffers in one
/// column of a semi join's output, walked again by each memory count above
/// it). One batch the operator keeps as it is, at the cost of the copy it
/// would have made. Copied `in_parallel` on the calling thread's rayon
/// pool, or by one thread.
pub(super) fn concatenated_last_first(
    schema: &SchemaRef,
    mut batches: Vec<RecordBatch>,
    in_parallel: bool,
) -> Result<Vec<RecordBatch>> {
    if batches.len() < 2 {
        return Ok(batches);
    }
    batches.reverse();
    Ok(vec![concat_record_batches(schema, &batches, in_parallel)?])
}

/// A plan of `partitions` partitions of which partition `at` yields
/// `batches` and the others nothing.
fn held_partition(
    schema: SchemaRef,
    partitions: usize,
    at: usize,
    batches: Vec<RecordBatch>,
) -> Result<Arc<dyn ExecutionPlan>> {
    if at >= partitions {
        return internal_err!("GPU join: no partition {at} of {partitions} for DataFusion's operator");
    }
    let mut batches = Some(batches);
    let held = (0..partitions)
        .map(|p| {
            let batches = if p == at { batches.take().unwrap_or_default() } else { vec![] };
            Arc::new(HeldBatches { schema: Arc::clone(&schema), batches }) as Arc<dyn PartitionStream>
        })
        .collect();
    Ok(Arc::new(StreamingTableExec::try_new(schema, held, None, vec![], false, None)?))
}

/// One partition of a build side handed to DataFusion's operator, read as
/// the batches it holds. A memory source would cut each batch into slices
/// of the session's batch size, every slice holding all of the batch's
/// string-view buffers, and the operator would concatenate the slices again
/// with each buffer once per slice: a build side concatenated into one
/// batch (its shared buffers kept once) would come back to the operator as
/// hundreds of copies of its buffer list (TPC-DS Q20 at scale factor 10:
/// 2.7 times DataFusion's time on the H100).
#[derive(Debug)]
struct HeldBatches {
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
}

impl PartitionStream for HeldBatches {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _context: Arc<TaskContext>) -> SendableRecordBatchStream {
        let batches = self.batches.clone().into_iter().map(Ok);
        Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), stream::iter(batches)))
    }
}
