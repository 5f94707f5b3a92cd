//! A build side on the device, and DataFusion's join over its host copy for
//! the probe rows the device cannot take.
//!
//! A probe chunk that runs out of device memory even alone on the device,
//! split down to its smallest pieces, is joined by DataFusion's
//! `HashJoinExec` over the build side's rows on the host. That operator is
//! made once per build side, on the first such piece, and kept with the
//! build side: its hash table is built once, however many pieces and
//! partitions come to it, as DataFusion builds one table for every probe
//! partition of a `CollectLeft` join.

use std::ops::Deref;
use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::metrics::Count;
use futures::{StreamExt, TryStreamExt};
use tokio::sync::OnceCell;

use super::fallback::hash_join_over;
use super::read_ahead::SlotJoin;
use super::runtime::run_blocking;
use crate::algorithms::BuildSide;
use crate::backend::JoinBackend;

/// A build side prepared on the device, shared by the probe chunks that
/// join it.
pub(crate) struct DeviceBuild<B: JoinBackend> {
    side: BuildSide<B>,
    /// DataFusion's join over the build side's host copy.
    on_cpu: OnceCell<SlotJoin>,
}

impl<B: JoinBackend> DeviceBuild<B> {
    pub fn new(side: BuildSide<B>) -> Self {
        Self { side, on_cpu: OnceCell::new() }
    }

    /// The output rows of `piece`, probe rows of partition `partition` of
    /// `twin`'s `partitions`, joined by DataFusion's operator with the
    /// whole build side. The build side's host copy and the operator (and
    /// with it the hash table it builds) are made on the first call, counted
    /// in `tables`, and kept.
    pub async fn join_on_cpu(
        self: &Arc<Self>,
        twin: &HashJoinExec,
        (partitions, partition): (usize, usize),
        piece: RecordBatch,
        context: Arc<TaskContext>,
        tables: &Count,
    ) -> Result<Vec<RecordBatch>> {
        let host = self
            .on_cpu
            .get_or_try_init(|| async {
                tables.add(1);
                let build = Arc::clone(self);
                let batch =
                    run_blocking("assembling the build side for DataFusion's operator", move || build.whole_batch())
                        .await?;
                SlotJoin::new(twin.right().schema(), partitions, |probe| {
                    hash_join_over(twin, &[batch], probe, PartitionMode::CollectLeft, 0)
                })
            })
            .await?;
        host.execute(partition, futures::stream::iter([Ok(piece)]).boxed(), context)?.try_collect().await
    }
}

impl<B: JoinBackend> Deref for DeviceBuild<B> {
    type Target = BuildSide<B>;

    fn deref(&self) -> &BuildSide<B> {
        &self.side
    }
}
