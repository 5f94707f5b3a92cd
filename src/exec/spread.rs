//! A join's partitions spread over several devices (`gpu_join.devices`).
//!
//! Each device has a runner of its own, and with it its own build sides,
//! admission queue and memory budget. Partition `p` of a `Partitioned`
//! join has a build side of its own and runs on the `p mod n`-th device. A
//! `CollectLeft` join's one build side serves every probe partition, and
//! its flags of matched build rows, which the last partition to finish
//! reads, are kept in one place: it runs on the first device.

use std::fmt;
use std::sync::Arc;

use datafusion::error::Result;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::joins::PartitionMode;

use super::inputs::PartitionInputs;
use super::runner::JoinRunner;

/// The index among `devices` devices of the one partition `partition` of a
/// join in `mode` runs on.
pub(crate) fn device_of(partition: usize, mode: PartitionMode, devices: usize) -> usize {
    match mode {
        PartitionMode::Partitioned => partition % devices.max(1),
        PartitionMode::CollectLeft | PartitionMode::Auto => 0,
    }
}

/// The runners of a join's devices, one each, in the order of
/// `gpu_join.devices`.
pub(crate) struct Spread {
    runners: Vec<Arc<dyn JoinRunner>>,
}

impl Spread {
    pub fn new(runners: Vec<Arc<dyn JoinRunner>>) -> Self {
        Self { runners }
    }
}

impl fmt::Debug for Spread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.runners).finish()
    }
}

impl JoinRunner for Spread {
    fn execute(self: Arc<Self>, inputs: PartitionInputs) -> Result<SendableRecordBatchStream> {
        let device = device_of(inputs.partition, inputs.mode, self.runners.len());
        match self.runners.get(device) {
            Some(runner) => Arc::clone(runner).execute(inputs),
            None => datafusion::common::internal_err!("GPU join: no device {device} among {}", self.runners.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitioned_joins_take_turns_and_collect_left_joins_stay_on_the_first() {
        let on = |mode| (0..5).map(|p| device_of(p, mode, 2)).collect::<Vec<_>>();
        assert_eq!(on(PartitionMode::Partitioned), vec![0, 1, 0, 1, 0]);
        assert_eq!(on(PartitionMode::CollectLeft), vec![0; 5]);
        assert_eq!(device_of(7, PartitionMode::Partitioned, 1), 0);
    }
}
