//! How the join's work meets tokio: blocking work off the async workers,
//! the device's admission, out-of-memory errors and cancellation.

use std::sync::Arc;

use datafusion::common::exec_datafusion_err;
use datafusion::error::{DataFusionError, Result};

use super::metrics::GpuJoinMetrics;
use crate::backend::{Admitted, DeviceCounters, too_many_pairs};

/// Runs blocking join work on tokio's blocking pool, so that no backend
/// call holds up an async worker. A panic there becomes an error.
pub(crate) async fn run_blocking<T: Send + 'static>(
    what: &'static str,
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work).await.map_err(|e| exec_datafusion_err!("GPU join failed while {what}: {e}"))?
}

/// Drops `value` on tokio's blocking pool, where what it frees (thousands
/// of batches, device buffers) holds up no task: on a worker it held up
/// the consumer of the stream that had just ended, which tokio runs next on
/// the same worker.
pub(crate) fn drop_off_the_workers<T: Send + 'static>(value: T) {
    drop(tokio::task::spawn_blocking(move || drop(value)));
}

/// Whether an error says that device memory ran out.
pub(crate) fn is_out_of_memory(error: &DataFusionError) -> bool {
    matches!(error.find_root(), DataFusionError::ResourcesExhausted(_))
}

/// Whether probe rows that failed so are to be joined again in smaller
/// pieces: device memory ran out, or their matches were more pairs than a
/// match call makes.
pub(crate) fn needs_smaller_pieces(error: &DataFusionError) -> bool {
    is_out_of_memory(error) || too_many_pairs(error).is_some()
}

/// A permit of the device's admission, its wait counted.
pub(crate) async fn admitted(
    metrics: &GpuJoinMetrics,
    permit: impl Future<Output = Result<Admitted>>,
) -> Result<Admitted> {
    let _wait = metrics.admission_wait_time.timer();
    permit.await
}

/// Stops the partition's backend work when the partition's task is
/// dropped (the query was cancelled): the next launch fails.
pub(crate) struct CancelOnDrop(pub Arc<DeviceCounters>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}
