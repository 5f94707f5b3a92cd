//! Bounded admission: how many joins' GPU jobs (loading a chunk, joining
//! it, preparing a build side) run on one device at once, whatever the
//! number of partitions and concurrent queries, as spark-rapids'
//! `concurrentGpuTasks`. Jobs beyond the bound wait, asynchronously, for a
//! running one to end; a job retried after running out of memory runs
//! alone. A join's job holds its admission while it works on the device and
//! lets it go once only host work is left ([`Admitted`]); an aggregation's
//! chunk holds it until its groups are built.

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
    pub async fn shared(&self, concurrent_tasks: usize) -> Result<Admitted> {
        let tasks = u32::try_from(concurrent_tasks).unwrap_or(PERMITS).clamp(1, PERMITS);
        self.acquire(PERMITS / tasks).await
    }

    /// Waits until the job may run alone on the device.
    pub async fn exclusive(&self) -> Result<Admitted> {
        self.acquire(PERMITS).await
    }

    async fn acquire(&self, permits: u32) -> Result<Admitted> {
        let permit = Arc::clone(&self.permits)
            .acquire_many_owned(permits)
            .await
            .map_err(|e| exec_datafusion_err!("GPU join admission closed: {e}"))?;
        Ok(Admitted(Some(permit)))
    }
}

/// A job's admission to its device, held while the job works on the device
/// and let go once only host work is left (taking rows on the host,
/// building arrays), so that another job's device work runs beside that.
/// The job holds it until [`Admitted::let_go`] or its end.
#[derive(Debug)]
pub struct Admitted(Option<OwnedSemaphorePermit>);

impl Admitted {
    /// The job's device work is over: another job may start.
    pub fn let_go(&mut self) {
        self.0 = None;
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    #[tokio::test]
    async fn a_job_that_lets_go_admits_the_next_before_it_ends() -> Result<()> {
        let admission = Admission::default();
        let mut first = admission.shared(1).await?;
        assert!(admission.shared(1).now_or_never().is_none(), "one job at a time: the second waits");
        first.let_go();
        let second = admission.shared(1).now_or_never();
        assert!(matches!(second, Some(Ok(_))), "the first let go while it still runs: the second starts");
        drop(first);
        Ok(())
    }
}
