//! A partition joined in key order: its whole probe side as one chunk, every
//! output row of the partition, build-side rows included, leaving in the
//! build side's key order (see [`crate::algorithms::KeyOrder`]). A
//! partition that runs out of device memory, even alone on the device, or
//! makes more pairs than one match call, is joined by DataFusion's operator
//! and sorted.

use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use datafusion::common::{internal_datafusion_err, internal_err};
use datafusion::error::Result;
use datafusion::execution::memory_pool::MemoryConsumer;
use futures::StreamExt;
use futures::stream::BoxStream;

use super::chunk_jobs::{assemble_chunk, load_and_join};
use super::device_build::DeviceBuild;
use super::fallback::join_partition_on_cpu;
use super::output::OutputSender;
use super::probing::Probing;
use super::runtime::{needs_smaller_pieces, run_blocking};
use super::staging::{ProbeStaging, held_bytes};
use crate::algorithms::{Emit, HostRows, ProbeColumns};
use crate::backend::{JoinBackend, too_many_pairs};

/// Joins the whole probe side of a partition as one chunk and sends every
/// output row of the partition in key order.
pub(super) async fn join_partition_in_key_order<B: JoinBackend>(
    probing: &Probing<'_, B>,
    build: &Arc<DeviceBuild<B>>,
    mut probe: BoxStream<'_, Result<RecordBatch>>,
    output: &mut OutputSender<'_>,
) -> Result<()> {
    let inputs = probing.inputs;
    let reservation =
        MemoryConsumer::new(format!("GpuJoinProbe[{}]", inputs.partition)).register(inputs.context.memory_pool());
    let mut staging = ProbeStaging::new(inputs.right.schema(), usize::MAX);
    while let Some(batch) = probe.next().await {
        let batch = batch?;
        reservation.try_grow(held_bytes(&batch))?;
        if !staging.push(batch).is_empty() {
            return internal_err!("GPU join: a probe side of more than {} rows", usize::MAX);
        }
    }
    let (chunk, columns) = match staging.finish() {
        Some(staged) => assemble_chunk(probing, &probing.build_backend, staged).await?,
        None => (HostRows::whole(RecordBatch::new_empty(inputs.right.schema())), ProbeColumns::Upload),
    };
    let backend = probing.open_backend()?;
    let mut error = None;
    // Beside other jobs first, then alone on the device.
    for alone in [false, true] {
        let permit = match alone {
            false => probing.admitted().await?,
            true => probing.admitted_alone().await?,
        };
        // The device is let go once the join's device work is done, and
        // not held while the consumer takes the output: a merge above waits
        // for every partition's first batch, and a partition waiting for
        // the device behind one that waits for the device alone would never
        // send it.
        let joined = load_and_join(probing, &backend, build, chunk.clone(), columns, Emit::AllInKeyOrder, permit).await;
        match joined {
            Ok(batches) => {
                output.send_all(batches).await?;
                return Ok(());
            }
            Err(e) if needs_smaller_pieces(&e) => {
                log::info!(
                    "gpu_join: a probe side of {} rows in key order could not be joined whole: {e}",
                    chunk.rows()
                );
                inputs.metrics.out_of_memory_retries.add(1);
                // Alone on the device a join gets more memory, not a larger
                // match call: too many pairs go to DataFusion's operator now.
                let too_many = too_many_pairs(&e).is_some();
                error = Some(e);
                if too_many {
                    break;
                }
            }
            Err(e) => return Err(e),
        }
    }
    let error = error.ok_or_else(|| internal_datafusion_err!("GPU join: no attempt joined the probe side"))?;
    let (build, context) = (Arc::clone(build), Arc::clone(&inputs.context));
    let (build, probe) = run_blocking("assembling both sides for DataFusion's operator", move || {
        Ok((build.whole_batch()?, chunk.whole_batch()?))
    })
    .await?;
    let join = probing.join;
    let batches = join_partition_on_cpu(&join.twin, &join.definition, &build, probe, context, error).await?;
    output.send_all(batches).await?;
    Ok(())
}
