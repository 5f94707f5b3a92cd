//! What one output partition of a GPU join is given to run.

use std::sync::Arc;

use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::joins::PartitionMode;

use super::metrics::GpuJoinMetrics;
use super::probe_filter::ProbeFilter;

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
    /// The join is the one DataFusion planned (`GpuJoinExec::reshaped`).
    pub as_planned: bool,
}
