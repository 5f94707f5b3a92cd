//! A join's partitions spread over several devices (`gpu_join.devices`).
//!
//! Each device has a runner of its own, and with it its own build sides,
//! admission queue and memory budget. Partition `p` of a `Partitioned`
//! join has a build side of its own and runs on the `p mod n`-th device. So
//! does partition `p` of a `CollectLeft` join whose probe chunks join on
//! their own ([`spreads_one_build_side`]): its one build side is collected
//! once into host memory ([`SharedCollection`]) and placed whole on every
//! device that has probe partitions, or, where it does not fit one device,
//! split once by a hash of its keys into passes that the devices hold in
//! turn, pass `j` on device `j mod n`: each partition sends the probe rows
//! of a pass to the device that holds it. A `CollectLeft` join that keeps
//! flags of its matched build rows, which the last partition to finish
//! reads, keeps them in one place: it runs on the first device.

use std::fmt;
use std::sync::{Arc, Mutex};

use datafusion::error::{DataFusionError, Result};
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::joins::PartitionMode;

use super::build::SharedCollection;
use super::device_join::DeviceJoin;
use super::inputs::PartitionInputs;
use super::runner::{JoinRunner, Runner};
use crate::algorithms::JoinDefinition;
use crate::backend::JoinBackend;

/// Whether the probe partitions of a `CollectLeft` join take turns over
/// the devices, each device placing the build side: where each probe chunk
/// joins on its own, with no flags of matched build rows to keep in one
/// place, no NULL of the build side to see from every partition (NOT IN) and
/// no key order to keep.
pub(crate) fn spreads_one_build_side(definition: &JoinDefinition) -> bool {
    definition.probe_chunks_join_independently()
}

/// The index among `devices` devices of the one partition `partition` of a
/// join in `mode` runs on; `one_build_side_spreads` as
/// [`spreads_one_build_side`] says of the join.
pub(crate) fn device_of(partition: usize, mode: PartitionMode, devices: usize, one_build_side_spreads: bool) -> usize {
    match mode {
        PartitionMode::Partitioned => partition % devices.max(1),
        PartitionMode::CollectLeft if one_build_side_spreads => partition % devices.max(1),
        PartitionMode::CollectLeft | PartitionMode::Auto => 0,
    }
}

/// The runners of a join's devices, one each, in the order of
/// `gpu_join.devices`.
pub(crate) struct Spread<B: JoinBackend> {
    runners: Vec<Arc<Runner<B>>>,
    /// The runners' joins, which a shared build side split into passes
    /// is spread over.
    devices: Arc<[Arc<DeviceJoin<B>>]>,
    /// As [`spreads_one_build_side`] says of the join.
    one_build_side_spreads: bool,
    probe_partitions: usize,
    /// The collection the partitions of the current execution of a
    /// `CollectLeft` join share, and how many of them were sent to it.
    shared: Mutex<(Arc<SharedCollection<B>>, usize)>,
}

impl<B: JoinBackend> Spread<B> {
    /// `one_build_side_spreads` as [`spreads_one_build_side`] says of the
    /// join.
    pub fn new(runners: Vec<Arc<Runner<B>>>, one_build_side_spreads: bool, probe_partitions: usize) -> Self {
        let devices: Arc<[_]> = runners.iter().map(|runner| Arc::clone(&runner.join)).collect();
        let shared = Mutex::new((Arc::new(SharedCollection::new(Arc::clone(&devices))), 0));
        Self { runners, devices, one_build_side_spreads, probe_partitions, shared }
    }

    /// The collection for the next partition; once every partition of an
    /// execution has its own, the next execution's is a fresh one.
    fn next_collection(&self) -> Result<Arc<SharedCollection<B>>> {
        let mut shared =
            self.shared.lock().map_err(|_| DataFusionError::Internal("GPU join: spread lock poisoned".into()))?;
        let (collection, sent) = &mut *shared;
        let next = Arc::clone(collection);
        *sent += 1;
        if *sent >= self.probe_partitions {
            *shared = (Arc::new(SharedCollection::new(Arc::clone(&self.devices))), 0);
        }
        Ok(next)
    }
}

impl<B: JoinBackend> fmt::Debug for Spread<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.runners).finish()
    }
}

impl<B: JoinBackend> JoinRunner for Spread<B> {
    fn execute(self: Arc<Self>, inputs: PartitionInputs) -> Result<SendableRecordBatchStream> {
        let device = device_of(inputs.partition, inputs.mode, self.runners.len(), self.one_build_side_spreads);
        let shared = match inputs.mode == PartitionMode::CollectLeft && self.one_build_side_spreads {
            true => Some(self.next_collection()?),
            false => None,
        };
        match self.runners.get(device) {
            Some(runner) => Arc::clone(runner).execute_sharing(inputs, shared),
            None => datafusion::common::internal_err!("GPU join: no device {device} among {}", self.runners.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_partitions_of_one_execution_share_a_collection_and_the_next_gets_its_own() -> Result<()> {
        let spread = Spread::<crate::backend::cpu::CpuBackend>::new(vec![], true, 3);
        let first: Vec<_> = (0..3).map(|_| spread.next_collection()).collect::<Result<_>>()?;
        assert!(first.iter().all(|collection| Arc::ptr_eq(collection, &first[0])));
        let next = spread.next_collection()?;
        assert!(!Arc::ptr_eq(&next, &first[0]), "a fresh collection for the next execution");
        assert!(Arc::ptr_eq(&next, &spread.next_collection()?));
        Ok(())
    }

    #[test]
    fn partitions_take_turns_unless_one_build_side_keeps_its_flags_in_one_place() {
        let on = |mode, spreads| (0..5).map(|p| device_of(p, mode, 2, spreads)).collect::<Vec<_>>();
        assert_eq!(on(PartitionMode::Partitioned, false), vec![0, 1, 0, 1, 0]);
        assert_eq!(on(PartitionMode::CollectLeft, true), vec![0, 1, 0, 1, 0]);
        assert_eq!(on(PartitionMode::CollectLeft, false), vec![0; 5]);
        assert_eq!(device_of(7, PartitionMode::Partitioned, 1, true), 0);
    }
}
