//! One CPU backend instance: its counters and its limit of pairs.

use std::sync::Arc;

use crate::backend::{DeviceCounters, MAX_CANDIDATES};

#[derive(Debug, Clone)]
pub struct CpuBackend {
    pub(super) counters: Arc<DeviceCounters>,
    /// The most candidate pairs one match call makes.
    pub(super) candidate_limit: usize,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self { counters: Arc::default(), candidate_limit: MAX_CANDIDATES }
    }
}
