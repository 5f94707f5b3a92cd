//! Which aggregations group their rows on the backend
//! (`gpu_join.aggregate`), and why the others stay DataFusion's.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::AggregateExec;

use super::assess::session_devices;
use crate::algorithms::Grouping;
use crate::algorithms::choice::PlanStatistics;
use crate::config::{ExplainChoice, GpuJoinConfig};
use crate::exec::GpuAggregateExec;

/// `plan` with each aggregation the backend can group swapped for
/// a [`GpuAggregateExec`] over the same input; the others are logged with
/// their reason, as `gpu_join.explain` says.
pub(super) fn group_on_backend(
    plan: Arc<dyn ExecutionPlan>,
    options: &GpuJoinConfig,
) -> Result<Arc<dyn ExecutionPlan>> {
    let devices = match session_devices(options)? {
        Ok(devices) => devices,
        Err(reason) => {
            log::debug!("gpu_join: aggregations stay on DataFusion: {reason}");
            return Ok(plan);
        }
    };
    let statistics = PlanStatistics::default();
    let rewritten = plan.transform_up(|node| {
        let Some(aggregate) = node.downcast_ref::<AggregateExec>() else {
            return Ok(Transformed::no(node));
        };
        let input_rows = statistics.of(aggregate.input()).and_then(|s| s.num_rows.get_value().copied());
        let reason = match Grouping::of(aggregate)? {
            Ok(_) if input_rows.is_some_and(|rows| rows < options.min_rows) => {
                format!("about {} input rows, below gpu_join.min_rows = {}", input_rows.unwrap_or(0), options.min_rows)
            }
            Ok(grouping) => {
                let aggregate = Arc::new(aggregate.clone());
                let exec = GpuAggregateExec::new(aggregate, grouping, devices.first().clone(), options);
                if options.explain == ExplainChoice::All {
                    log::info!("gpu_join: {} groups on {}", node.name(), devices.first().name());
                }
                return Ok(Transformed::yes(Arc::new(exec) as Arc<dyn ExecutionPlan>));
            }
            Err(reason) => reason.to_string(),
        };
        if options.explain != ExplainChoice::None {
            log::info!("gpu_join: an aggregation ({:?}) stays on DataFusion: {reason}", aggregate.mode());
        }
        Ok(Transformed::no(node))
    })?;
    Ok(rewritten.data)
}
