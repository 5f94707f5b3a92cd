use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use datafusion::common::{exec_datafusion_err, resources_datafusion_err};
use datafusion::error::Result;

/// What one partition of a join shares with the backend instances serving
/// it: what they moved to and from the device and the most device memory
/// they held (reported in `EXPLAIN ANALYZE`), whether the partition's
/// consumer has gone, and allocation failures injected for testing.
#[derive(Debug, Default)]
pub struct DeviceCounters {
    bytes_to_device: AtomicU64,
    bytes_from_device: AtomicU64,
    in_use: AtomicU64,
    peak: AtomicU64,
    cancelled: AtomicBool,
    /// Allocations that succeed before the injected failures start.
    spared_allocations: AtomicUsize,
    injected_failures: AtomicUsize,
}

impl DeviceCounters {
    pub fn record_upload(&self, bytes: u64) {
        self.bytes_to_device.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn record_download(&self, bytes: u64) {
        self.bytes_from_device.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn record_alloc(&self, bytes: u64) {
        let now = self.in_use.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    pub fn record_free(&self, bytes: u64) {
        self.in_use.fetch_sub(bytes, Ordering::Relaxed);
    }

    pub fn bytes_to_device(&self) -> u64 {
        self.bytes_to_device.load(Ordering::Relaxed)
    }

    pub fn bytes_from_device(&self) -> u64 {
        self.bytes_from_device.load(Ordering::Relaxed)
    }

    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Stops the partition's work at the next launch: its consumer has gone.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    /// An error once the partition is cancelled; backends check it before
    /// each launch, so that a dropped query stops between launches.
    pub fn check_cancelled(&self, what: &str) -> Result<()> {
        match self.cancelled.load(Ordering::Relaxed) {
            true => Err(exec_datafusion_err!("GPU join cancelled before {what}: the query's consumer has gone")),
            false => Ok(()),
        }
    }

    /// Makes `count` allocations fail after the next `spared`
    /// ([`crate::testing::InjectedAllocationFailures`]).
    pub fn inject_allocation_failures(&self, spared: usize, count: usize) {
        self.spared_allocations.store(spared, Ordering::Relaxed);
        self.injected_failures.store(count, Ordering::Relaxed);
    }

    /// An out-of-memory error while injected failures remain, once the
    /// spared allocations have passed.
    pub fn check_injected_failure(&self, bytes: u64, what: &str) -> Result<()> {
        let spare = self.spared_allocations.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        if spare.is_ok() {
            return Ok(());
        }
        let take = self.injected_failures.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        match take {
            Ok(_) => Err(resources_datafusion_err!(
                "GPU join: {what} could not get {bytes} bytes of device memory (injected failure)"
            )),
            Err(_) => Ok(()),
        }
    }
}
