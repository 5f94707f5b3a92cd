//! A partition's build side left to DataFusion's operator, joined with the
//! sides swapped where its probe partition turns out the smaller.
//!
//! DataFusion's plan puts the side it estimates smaller on the build side,
//! and it often misjudges a filter. In TPC-DS Q3 at scale factor 10, each
//! partition's build side (`store_sales` joined with `date_dim`) has 290
//! thousand rows and its probe side (`item`, filtered) 121: the hash join
//! copies every build row into one batch and builds a table of them, to
//! probe it with a hundred rows. Such a build side is too small for the
//! device and goes to DataFusion's operator all the same, but the GPU join
//! has it collected and can look at the probe partition first. In
//! `Partitioned` mode, where each partition's two sides are its own, the
//! partition reads its probe input up to half the build side's rows; where
//! that is all of it, those rows build the hash table and the build side's
//! batches, as collected, stream through it: no copy of the build side and
//! no table of its rows. Otherwise the rows read go first to the operator,
//! which joins as planned.
//!
//! The swapped join emits its rows in the build side's order rather than
//! the probe side's; it is used only where the plan does not rely on the
//! probe side's order. In `Partitioned` mode the probe partition is mostly
//! a hash repartition, whose rows come in an order that varies between
//! runs anyway.

use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use datafusion::error::Result;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_plan::joins::PartitionMode;
use datafusion::physical_plan::{ExecutionPlanProperties, SendableRecordBatchStream};
use futures::StreamExt;
use futures::stream::BoxStream;

use super::build::{DeviceJoin, concatenated_last_first};
use super::fallback::{hash_join_over, in_key_order, swapped_hash_join};
use super::read_ahead::{ProbeSlots, handed_on_first};
use super::runner::PartitionInputs;
use crate::algorithms::JoinDefinition;
use crate::backend::JoinBackend;
use crate::config::{GpuJoinConfig, ProbeOrderChoice};

/// Whether a partition's build side of this join, left to DataFusion's
/// operator, may be swapped with its probe side: a join type DataFusion
/// swaps (not `NOT IN`, whose build side's nulls decide every row), and
/// no probe order that the plan or the settings keep.
pub(super) fn may_swap_sides(definition: &JoinDefinition, options: &GpuJoinConfig) -> bool {
    options.build_smaller_side
        && definition.join_type.supports_swap()
        && !definition.null_aware
        && !definition.probe_order_required
        && definition.keep_probe_order != ProbeOrderChoice::Always
}

/// DataFusion's operator's output for partition `inputs.partition`, whose
/// own build side `build` went to it for `reason`, reading the partition's
/// probe input from `probe`; the smaller side builds the hash table.
pub(super) async fn join_on_cpu<B: JoinBackend>(
    join: &DeviceJoin<B>,
    build: &[RecordBatch],
    reason: &str,
    mut probe: BoxStream<'static, Result<RecordBatch>>,
    inputs: &PartitionInputs,
) -> Result<SendableRecordBatchStream> {
    let (partition, partitions) = (inputs.partition, inputs.right.output_partitioning().partition_count());
    let build_rows: usize = build.iter().map(RecordBatch::num_rows).sum();
    let reservation =
        MemoryConsumer::new(format!("GpuJoinProbePeek[{partition}]")).register(inputs.context.memory_pool());
    let limit = build_rows / 2;
    let read = read_up_to(&mut probe, limit, &reservation).await?;
    let plan = match read {
        Read { batches, rows, whole: true } if rows <= limit => {
            join.chosen.record_datafusion_swapped(&format!(
                "{reason}; its partition's {rows} probe rows built the hash table, \
                 fewer than half its {build_rows} build rows"
            ));
            // DataFusion's operator accounts them as its build side.
            drop(reservation);
            swapped_hash_join(&join.twin, build, batches, partitions, partition)?
        }
        Read { batches, .. } => {
            join.chosen.record_datafusion(reason);
            let build = concatenated_last_first(&inputs.left.schema(), build.to_vec(), false)?;
            let slots = ProbeSlots::new(inputs.right.schema(), partitions);
            slots.put(partition, handed_on_first(batches.into_iter().map(Ok).collect(), probe, reservation))?;
            hash_join_over(&join.twin, &build, slots.plan()?, PartitionMode::Partitioned, partition)?
        }
    };
    in_key_order(&join.definition, plan).execute(partition, Arc::clone(&inputs.context))
}

/// The first batches of a probe partition.
struct Read {
    batches: Vec<RecordBatch>,
    rows: usize,
    /// They are all of it.
    whole: bool,
}

/// Reads `probe` until more than `limit_rows` rows are in, it ends, or
/// `reservation` cannot hold another batch (which is kept all the same).
async fn read_up_to(
    probe: &mut BoxStream<'static, Result<RecordBatch>>,
    limit_rows: usize,
    reservation: &MemoryReservation,
) -> Result<Read> {
    let mut read = Read { batches: vec![], rows: 0, whole: false };
    while read.rows <= limit_rows {
        let Some(batch) = probe.next().await.transpose()? else {
            read.whole = true;
            break;
        };
        read.rows += batch.num_rows();
        let held = reservation.try_grow(batch.get_array_memory_size()).is_ok();
        read.batches.push(batch);
        if !held {
            break;
        }
    }
    Ok(read)
}
