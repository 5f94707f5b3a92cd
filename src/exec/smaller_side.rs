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
//! In `CollectLeft` mode one build side serves every probe partition,
//! and DataFusion's operator builds its table once, on one thread (in TPC-DS
//! Q12 at scale factor 10, 2.1 million build rows against 31 probe rows in
//! all). There each probe partition decides alone, without waiting for the
//! others: where its rows are few ([`shared_build_swap_rows`]) and, as many
//! again in every partition, would be fewer than half the build side, it
//! builds a table of its own rows and streams the whole build side through
//! it, every partition at once on its own core. Only for join types whose probe partitions join independently
//! (no build-side rows emitted at the end): each partition's output then
//! still holds only its own probe rows' matches, as the plan's
//! partitioning says.
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
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, SendableRecordBatchStream};
use futures::StreamExt;
use futures::stream::BoxStream;

use super::device_join::DeviceJoin;
use super::fallback::{concatenated_last_first, context_for, hash_join_over, in_key_order, swapped_hash_join};
use super::inputs::PartitionInputs;
use super::read_ahead::{SlotJoin, handed_on_first};
use crate::algorithms::JoinDefinition;
use crate::backend::JoinBackend;
use crate::config::{GpuJoinConfig, ProbeOrderChoice};

/// The most rows of a probe partition that builds its own table against a
/// build side shared by every partition, each of which streams all of it:
/// a table this small stays in a core's first-level cache, where a probe
/// costs a few nanoseconds. With 31,250 rows a partition, sixteen
/// partitions each streaming 5.5 million build rows took TPC-DS Q38 at
/// scale factor 10 to 1.3 times DataFusion's time on two cores.
const SHARED_BUILD_SWAP_ROWS: usize = 1024;

/// The same for a partition of up to a batch of rows, whose table stays in
/// a core's second-level cache, where the cores can stream the build side
/// for every partition at once: no more than two partitions a core. In
/// TPC-DS Q90 at scale factor 10 the two probe partitions that hold rows
/// (3,600 and 5,400) did not swap, and DataFusion's operator built its
/// table of 724,913 rows on one thread in about 7 ms.
const SHARED_BUILD_SWAP_BATCH_ROWS: usize = 8192;

/// The most rows of a probe partition, one of `partitions`, that swaps
/// against a shared build side. The cores are counted as the host work's
/// thread pools are sized, by rayon (its count is kept, not looked up).
fn shared_build_swap_rows(partitions: usize) -> usize {
    match partitions <= 2 * rayon::current_num_threads() {
        true => SHARED_BUILD_SWAP_BATCH_ROWS,
        false => SHARED_BUILD_SWAP_ROWS,
    }
}

/// A build side for DataFusion's operator that a smaller probe partition
/// may join with the sides swapped.
pub(crate) struct SwappableBuild {
    /// As collected (`Partitioned` mode), or as concatenated for the
    /// operator (`CollectLeft`).
    pub batches: Vec<RecordBatch>,
    /// Why the device does not join it.
    pub reason: String,
}

/// Whether a build side of this join, left to DataFusion's operator in
/// `mode`, may be swapped with a probe partition: a join type DataFusion
/// swaps (not `NOT IN`, whose build side's nulls decide every row), no
/// probe order that the plan or the settings keep, and in `CollectLeft`
/// mode no build-side rows emitted at the end, which would take every
/// partition's matches.
pub(super) fn may_swap_sides(definition: &JoinDefinition, options: &GpuJoinConfig, mode: PartitionMode) -> bool {
    options.build_smaller_side
        && definition.join_type.supports_swap()
        && !definition.null_aware
        && !definition.probe_order_required
        && definition.keep_probe_order != ProbeOrderChoice::Always
        && (mode == PartitionMode::Partitioned || definition.probe_chunks_join_independently())
}

/// DataFusion's operator's output for partition `inputs.partition` over
/// `build`, reading the partition's probe input from `probe`; the smaller
/// side builds the hash table. Otherwise the partition runs `shared` where
/// given (`CollectLeft`), or a plan of its own over its own build side.
/// Also the plan that runs, for its metrics.
pub(super) async fn join_on_cpu<B: JoinBackend>(
    join: &DeviceJoin<B>,
    build: &SwappableBuild,
    mut probe: BoxStream<'static, Result<RecordBatch>>,
    inputs: &PartitionInputs,
    shared: Option<&SlotJoin>,
) -> Result<(SendableRecordBatchStream, Arc<dyn ExecutionPlan>)> {
    let (partition, partitions) = (inputs.partition, inputs.right.output_partitioning().partition_count());
    let build_rows: usize = build.batches.iter().map(RecordBatch::num_rows).sum();
    let reservation =
        MemoryConsumer::new(format!("GpuJoinProbePeek[{partition}]")).register(inputs.context.memory_pool());
    // Probe rows below half the build side's, counted once for every
    // partition where each streams the whole build side.
    let limit = match inputs.mode {
        PartitionMode::CollectLeft => (build_rows / (2 * partitions.max(1))).min(shared_build_swap_rows(partitions)),
        _ => build_rows / 2,
    };
    let read = read_up_to(&mut probe, limit, &reservation).await?;
    let context = context_for(&join.definition, &inputs.context);
    if read.whole && read.rows <= limit {
        let Read { batches, rows, .. } = read;
        join.chosen.record_datafusion_swapped(&format!(
            "{}; a probe partition of {rows} rows built the hash table, against {build_rows} build rows",
            build.reason
        ));
        // DataFusion's operator accounts them as its build side.
        drop(reservation);
        let streamed = in_slices(&build.batches, context.session_config().batch_size());
        let plan =
            in_key_order(&join.definition, swapped_hash_join(&join.twin, &streamed, batches, partitions, partition)?);
        return Ok((plan.execute(partition, context)?, plan));
    }
    join.chosen.record_datafusion(&build.reason);
    let probe = handed_on_first(read.batches.into_iter().map(Ok).collect(), probe, reservation);
    if let Some(shared) = shared {
        return Ok((shared.execute(partition, probe, context)?, Arc::clone(shared.plan())));
    }
    let own = concatenated_last_first(&inputs.left.schema(), build.batches.clone(), false)?;
    let own = SlotJoin::new(inputs.right.schema(), partitions, |probe| {
        Ok(in_key_order(
            &join.definition,
            hash_join_over(&join.twin, &own, probe, PartitionMode::Partitioned, partition)?,
        ))
    })?;
    Ok((own.execute(partition, probe, context)?, Arc::clone(own.plan())))
}

/// `batches` cut into slices of at most `rows` rows, without a copy: a
/// build side concatenated for the operator streams through the swapped
/// join as the batches of any other probe input.
fn in_slices(batches: &[RecordBatch], rows: usize) -> Vec<RecordBatch> {
    let rows = rows.max(1);
    batches
        .iter()
        .flat_map(|batch| {
            (0..batch.num_rows()).step_by(rows).map(move |at| batch.slice(at, rows.min(batch.num_rows() - at)))
        })
        .collect()
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
