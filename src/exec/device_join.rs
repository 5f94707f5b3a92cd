//! One GPU join as each of its parts sees it.

use std::sync::Arc;

use datafusion::error::Result;
use datafusion::physical_plan::joins::HashJoinExec;

use super::chosen::ChosenStrategies;
use crate::algorithms::{JoinDefinition, ProbeChunkPolicy};
use crate::backend::{Admission, DeviceCounters, JoinBackend};

/// One GPU join: the device it runs on, what it computes, and DataFusion's
/// join for what the device cannot take.
pub(crate) struct DeviceJoin<B: JoinBackend> {
    pub device: B::Device,
    /// The device's place among the join's devices.
    pub index: usize,
    pub definition: Arc<JoinDefinition>,
    /// DataFusion's join, for chunks the device cannot take.
    pub twin: Arc<HashJoinExec>,
    /// Where the strategies of its build sides are recorded.
    pub chosen: Arc<ChosenStrategies>,
    /// The output rows its probe chunks gave so far, and what they say of
    /// the next chunks.
    pub probe_chunks: ProbeChunkPolicy,
}

impl<B: JoinBackend> DeviceJoin<B> {
    pub fn open_backend(&self, counters: Arc<DeviceCounters>) -> Result<B> {
        B::open(&self.device, counters)
    }

    pub fn admission(&self) -> &Admission {
        B::admission(&self.device)
    }
}
