//! What one output partition of a GPU join is given to run.

use std::sync::Arc;

use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::joins::PartitionMode;

use super::filters_from_above::RowReduction;
use super::metrics::GpuJoinMetrics;
use super::probe_filter::ProbeFilter;
use crate::algorithms::OutputLimits;
use crate::testing::JoinLimits;

/// What one output partition needs to run.
pub(crate) struct PartitionInputs {
    pub partition: usize,
    pub context: Arc<TaskContext>,
    pub left: Arc<dyn ExecutionPlan>,
    pub right: Arc<dyn ExecutionPlan>,
    pub mode: PartitionMode,
    pub fetch: Option<usize>,
    pub metrics: GpuJoinMetrics,
    /// The dynamic filter of the probe side's scan, where one reads it.
    pub probe_filter: Option<Arc<ProbeFilter>>,
    /// What the rows read from each input go through, from joins above.
    pub reductions: InputReductions,
    /// The join is the one DataFusion planned (`GpuJoinExec::reshaped`).
    pub as_planned: bool,
    /// The limits it joins within (smaller only in tests).
    pub limits: JoinLimits,
}

/// The dynamic filters of joins above that each input's rows go through
/// ([`super::filters_from_above`]).
#[derive(Debug, Default, Clone)]
pub(crate) struct InputReductions {
    pub build: Option<Arc<RowReduction>>,
    pub probe: Option<Arc<RowReduction>>,
}

impl PartitionInputs {
    /// How the partition's output batches are cut.
    pub fn output_limits(&self) -> OutputLimits {
        let batch_rows = self.context.session_config().batch_size().max(1);
        OutputLimits { batch_rows, array_values: self.limits.array_values }
    }
}
