//! Bounded admission: how many joins' GPU jobs (loading a chunk, joining
//! it, preparing a build side) run on one device at once, whatever the
//! number of partitions and concurrent queries, as spark-rapids'
//! `concurrentGpuTasks`. Jobs beyond the bound wait, asynchronously, for a
//! running one to end; a job retried after running out of memory runs
//! alone.

use std::sync::Arc;

use datafusion::common::exec_datafusion_err;
use datafusion::error::Result;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Permits of a device; a job holds `PERMITS / concurrent_tasks`.
const PERMITS: u32 = 1 << 10;

#[derive(Debug)]
pub struct Admission {
    permits: Arc<Semaphore>,
}

impl Default for Admission {
    fn default() -> Self {
        Self { permits: Arc::new(Semaphore::new(PERMITS as usize)) }
    }
}

impl Admission {
    /// Waits until one more job may run beside `concurrent_tasks - 1` others.
    pub async fn shared(&self, concurrent_tasks: usize) -> Result<OwnedSemaphorePermit> {
        let tasks = u32::try_from(concurrent_tasks).unwrap_or(PERMITS).clamp(1, PERMITS);
        self.acquire(PERMITS / tasks).await
    }

    /// Waits until the job may run alone on the device.
    pub async fn exclusive(&self) -> Result<OwnedSemaphorePermit> {
        self.acquire(PERMITS).await
    }

    async fn acquire(&self, permits: u32) -> Result<OwnedSemaphorePermit> {
        Arc::clone(&self.permits)
            .acquire_many_owned(permits)
            .await
            .map_err(|e| exec_datafusion_err!("GPU join admission closed: {e}"))
    }
}
