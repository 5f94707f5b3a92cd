use std::sync::atomic::{AtomicU64, Ordering};

/// What one join moved to and from the device and how much device memory it
/// held at most. Backends update these; the operator reports them in
/// `EXPLAIN ANALYZE`.
#[derive(Debug, Default)]
pub struct DeviceCounters {
    bytes_to_device: AtomicU64,
    bytes_from_device: AtomicU64,
    in_use: AtomicU64,
    peak: AtomicU64,
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
}
