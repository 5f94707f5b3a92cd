//! Which aggregations group their rows on the backend
//! (`gpu_join.aggregate`), and why the others stay DataFusion's.

use std::cell::OnceCell;
use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::physical_expr::PartitioningSatisfaction;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};

use super::assess::session_devices;
use super::not_on_gpu::NotOnGpu;
use crate::algorithms::choice::PlanStatistics;
use crate::algorithms::{AggregateNotOnGpu, Grouping};
use crate::backend::{BackendHandle, Devices};
use crate::config::{ExplainChoice, GpuJoinConfig};
use crate::exec::GpuAggregateExec;

/// Where an aggregation of a plan groups its rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AggregatePlacement {
    /// On a backend, in a `GpuAggregateExec`.
    Gpu { backend: &'static str },
    /// On DataFusion's operator, for this reason.
    NotOnGpu(String),
}

/// One aggregation of a plan and where it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AggregateDecision {
    /// Its mode as DataFusion planned it (`Partial`, `FinalPartitioned`, ...).
    pub mode: String,
    pub placement: AggregatePlacement,
}

impl fmt::Display for AggregateDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.placement {
            AggregatePlacement::Gpu { backend } => write!(f, "{} {backend}", self.mode),
            AggregatePlacement::NotOnGpu(reason) => write!(f, "{}: {reason}", self.mode),
        }
    }
}

/// `plan` with each aggregation the backend can group swapped for
/// a [`GpuAggregateExec`] over the same input; the others are logged with
/// their reason, as `gpu_join.explain` says.
pub(super) fn group_on_backend(
    plan: Arc<dyn ExecutionPlan>,
    options: &GpuJoinConfig,
) -> Result<Arc<dyn ExecutionPlan>> {
    if let Some(reason) = why_all_stay(options) {
        log::debug!("gpu_join: aggregations stay on DataFusion: {reason}");
        return Ok(plan);
    }
    let assessor = Assessor::new(options);
    let on_backend = |aggregate: AggregateExec| -> Result<Arc<dyn ExecutionPlan>> {
        match assessor.assess(&aggregate)? {
            Ok((grouping, backend)) => {
                if options.explain == ExplainChoice::All {
                    log::info!("gpu_join: an aggregation ({:?}) groups on {}", aggregate.mode(), backend.name());
                }
                Ok(Arc::new(GpuAggregateExec::new(Arc::new(aggregate), grouping, backend, options)))
            }
            Err(reason) => {
                if options.explain != ExplainChoice::None {
                    log::info!("gpu_join: an aggregation ({:?}) stays on DataFusion: {reason}", aggregate.mode());
                }
                Ok(Arc::new(aggregate))
            }
        }
    };
    let rewritten = plan.transform_up(|node| {
        let Some(aggregate) = node.downcast_ref::<AggregateExec>() else {
            return Ok(Transformed::no(node));
        };
        if is_single_phase(aggregate) {
            return match in_two_phases(aggregate, &assessor)? {
                Ok((partial, mode)) => {
                    let last = last_phase(aggregate, mode, &partial, on_backend(partial.clone())?)?;
                    Ok(Transformed::yes(on_backend(last)?))
                }
                Err(reason) => {
                    if options.explain != ExplainChoice::None {
                        log::info!("gpu_join: an aggregation ({:?}) stays on DataFusion: {reason}", aggregate.mode());
                    }
                    Ok(Transformed::no(node))
                }
            };
        }
        let replaced = on_backend(aggregate.clone())?;
        Ok(match replaced.downcast_ref::<GpuAggregateExec>() {
            Some(_) => Transformed::yes(replaced),
            None => Transformed::no(node),
        })
    })?;
    Ok(rewritten.data)
}

/// A single-phase aggregation (rows in, final values out) as DataFusion's
/// two phases over the same partitions: a partial aggregation of its input,
/// which the backend groups, and a final one (of the returned mode) of the
/// partial's states, which the backend merges where each aggregate's value
/// is its state. The backend folds rows only into states, so a single phase
/// stays whole otherwise: where the partial would stay DataFusion's, where
/// it emits in its input's order or keeps a limit, and where the two phases
/// would not make the single one's schema over its partitions.
fn in_two_phases(
    aggregate: &AggregateExec,
    assessor: &Assessor<'_>,
) -> Result<std::result::Result<(AggregateExec, AggregateMode), String>> {
    let mode = match aggregate.mode() {
        AggregateMode::SinglePartitioned => AggregateMode::FinalPartitioned,
        _ => AggregateMode::Final,
    };
    if aggregate.limit_options().is_some() || aggregate.properties().output_ordering().is_some() {
        return Ok(Err(AggregateNotOnGpu::Ordered.to_string()));
    }
    if !aggregate.dynamic_expressions_produced().is_empty() {
        return Ok(Err(AggregateNotOnGpu::DynamicFilter.to_string()));
    }
    let partial = AggregateExec::try_new(
        AggregateMode::Partial,
        aggregate.group_expr().clone(),
        aggregate.aggr_expr().to_vec(),
        aggregate.filter_expr().to_vec(),
        Arc::clone(aggregate.input()),
        aggregate.input_schema(),
    )?;
    if let Err(reason) = assessor.assess(&partial)? {
        return Ok(Err(reason));
    }
    let input = Arc::new(partial.clone()) as Arc<dyn ExecutionPlan>;
    let last = last_phase(aggregate, mode, &partial, Arc::clone(&input))?;
    let requirements = last.input_distribution_requirements();
    let distributed = requirements.child_distribution(0).is_none_or(|required| {
        let properties = input.properties();
        let satisfaction =
            properties.output_partitioning().satisfaction(required, properties.equivalence_properties(), false);
        satisfaction == PartitioningSatisfaction::Exact
    });
    Ok(match distributed && last.schema() == aggregate.schema() {
        true => Ok((partial, mode)),
        false => Err(AggregateNotOnGpu::SinglePhase.to_string()),
    })
}

/// Whether `aggregate` takes rows in and gives final values out.
fn is_single_phase(aggregate: &AggregateExec) -> bool {
    matches!(aggregate.mode(), AggregateMode::Single | AggregateMode::SinglePartitioned)
}

/// The final phase, in `mode`, of `aggregate` split in two, over `input`,
/// which runs `partial`.
fn last_phase(
    aggregate: &AggregateExec,
    mode: AggregateMode,
    partial: &AggregateExec,
    input: Arc<dyn ExecutionPlan>,
) -> Result<AggregateExec> {
    AggregateExec::try_new(
        mode,
        partial.group_expr().as_final(),
        partial.aggr_expr().to_vec(),
        aggregate.filter_expr().to_vec(),
        input,
        aggregate.input_schema(),
    )
}

/// Where each aggregation of a physical plan runs, in plan order
/// (bottom-up): those grouped on the backend, and for the others, why they
/// stay on DataFusion.
pub fn plan_aggregate_decisions(
    plan: &Arc<dyn ExecutionPlan>,
    config: &ConfigOptions,
) -> Result<Vec<AggregateDecision>> {
    let options = GpuJoinConfig::from_config(config);
    let why_all_stay = why_all_stay(&options);
    let mut decisions = vec![];
    add_decisions(plan, &Assessor::new(&options), why_all_stay.as_deref(), &mut decisions)?;
    Ok(decisions)
}

fn add_decisions(
    node: &Arc<dyn ExecutionPlan>,
    assessor: &Assessor<'_>,
    why_all_stay: Option<&str>,
    decisions: &mut Vec<AggregateDecision>,
) -> Result<()> {
    for child in node.children() {
        add_decisions(child, assessor, why_all_stay, decisions)?;
    }
    let (mode, placement) = if let Some(exec) = node.downcast_ref::<GpuAggregateExec>() {
        (exec.aggregate().mode(), AggregatePlacement::Gpu { backend: exec.backend().name() })
    } else if let Some(aggregate) = node.downcast_ref::<AggregateExec>() {
        let reason = match why_all_stay {
            Some(reason) => reason.to_string(),
            None => {
                let stays = match is_single_phase(aggregate) {
                    true => in_two_phases(aggregate, assessor)?.err(),
                    false => assessor.assess(aggregate)?.err(),
                };
                stays.unwrap_or_else(|| NotOnGpu::RuleNotRun.to_string())
            }
        };
        (aggregate.mode(), AggregatePlacement::NotOnGpu(reason))
    } else {
        return Ok(());
    };
    decisions.push(AggregateDecision { mode: format!("{mode:?}"), placement });
    Ok(())
}

/// Why every aggregation stays DataFusion's whatever the devices, if so.
fn why_all_stay(options: &GpuJoinConfig) -> Option<String> {
    if !options.enabled {
        return Some(NotOnGpu::Disabled.to_string());
    }
    if !options.aggregate {
        return Some("gpu_join.aggregate is false".to_string());
    }
    None
}

/// Decides, aggregation by aggregation, whether the backend groups its
/// rows. The session's devices are looked up once, and only for an
/// aggregation the backend could group, so that a plan with none (or with
/// none that qualifies) plans as DataFusion's even where the configured
/// backend is unusable.
struct Assessor<'a> {
    options: &'a GpuJoinConfig,
    statistics: PlanStatistics,
    devices: OnceCell<std::result::Result<Devices, String>>,
}

impl<'a> Assessor<'a> {
    fn new(options: &'a GpuJoinConfig) -> Self {
        Self { options, statistics: PlanStatistics::default(), devices: OnceCell::new() }
    }

    /// How the backend groups `aggregate`'s rows and on which device, or
    /// why it stays DataFusion's.
    fn assess(&self, aggregate: &AggregateExec) -> Result<std::result::Result<(Grouping, BackendHandle), String>> {
        let input_rows = self.statistics.of(aggregate.input()).and_then(|s| s.num_rows.get_value().copied());
        let grouping = match Grouping::of(aggregate)? {
            Ok(_) if let Some(rows) = input_rows.filter(|rows| *rows < self.options.min_rows) => {
                return Ok(Err(format!(
                    "about {rows} input rows, below gpu_join.min_rows = {}",
                    self.options.min_rows
                )));
            }
            Ok(grouping) => grouping,
            Err(reason) => return Ok(Err(reason.to_string())),
        };
        let devices = match self.devices.get() {
            Some(devices) => devices,
            None => {
                let found = session_devices(self.options)?.map_err(|reason| reason.to_string());
                self.devices.get_or_init(|| found)
            }
        };
        Ok(match devices {
            Ok(devices) => Ok((grouping, devices.first().clone())),
            Err(reason) => Err(reason.clone()),
        })
    }
}
