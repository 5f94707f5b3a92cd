//! Whether one join can run on the GPU.

use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion::common::{JoinType, internal_err, plan_err};
use datafusion::error::Result;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode, SortMergeJoinExec};
use datafusion::physical_plan::sorts::sort::SortExec;

use super::not_on_gpu::NotOnGpu;
use super::shape::{may_collect_build_side, with_one_build_side};
use super::walk::Relied;
use crate::algorithms::choice::PlanStatistics;
use crate::backend::Devices;
use crate::config::{BackendChoice, GpuJoinConfig};
use crate::exec::{GpuJoinExec, ReplacedOperator, SortMergeOrder};
use crate::keys::{is_packable_key_type, is_supported_key_type};

/// A join's size against `gpu_join.min_rows`, as the plan tells it.
#[derive(Debug, PartialEq)]
pub(super) enum PlannedSize {
    /// Below, however large its build side turns out to be.
    Small(NotOnGpu),
    /// At or above by the statistics, or of unknown size.
    Large,
    /// Below by the statistics' estimate of a build side above a join,
    /// which can be millions of rows short; known once it is collected.
    Unsure,
}

pub(super) enum Assessment {
    Replace(Arc<GpuJoinExec>),
    Keep(NotOnGpu),
}

/// Whether the GPU join may run a join in another shape than the plan's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    /// The rule's own: a `Partitioned` join collected into one build side,
    /// a sort-merge join's sorts gone.
    Best,
    /// One for one: each `HashJoinExec` becomes a `GpuJoinExec` over the
    /// same children, with the same schema, partitioning and ordering
    /// (a stage of a distributed plan, which must keep its topology).
    AsPlanned,
}

/// The session's options, once a join asks, the devices to use, and the
/// statistics of the plan's nodes, each computed once for the whole walk.
pub(super) struct RuleContext<'a> {
    options: &'a GpuJoinConfig,
    shape: Shape,
    devices: Option<std::result::Result<Devices, NotOnGpu>>,
    statistics: PlanStatistics,
}

impl<'a> RuleContext<'a> {
    pub fn new(options: &'a GpuJoinConfig, shape: Shape) -> Self {
        Self { options, shape, devices: None, statistics: PlanStatistics::default() }
    }

    /// `None` for nodes that are not joins this rule handles. A hash join
    /// for which [`Self::collects_build_side`] said yes before its inputs
    /// were rewritten is replaced in `CollectLeft` mode (`collects`).
    pub fn assess(
        &mut self,
        node: &Arc<dyn ExecutionPlan>,
        relied: Relied,
        collects: bool,
    ) -> Result<Option<Assessment>> {
        if let Some(join) = node.downcast_ref::<HashJoinExec>() {
            return self.assess_hash_join(join, collects).map(Some);
        }
        if let Some(join) = node.downcast_ref::<SortMergeJoinExec>() {
            return match self.shape {
                Shape::AsPlanned => Ok(Some(Assessment::Keep(NotOnGpu::SortMergeAsPlanned))),
                Shape::Best => self.assess_sort_merge_join(join, relied).map(Some),
            };
        }
        Ok(None)
    }

    /// Whether `node` is a hash join that will run in `CollectLeft` mode
    /// with one build side, asked before its inputs are rewritten: a
    /// `Partitioned` join over a hash repartition that the options allow to
    /// collect its build side, on one device, that nothing above relies on
    /// for its partitioning, and that the plan calls large. Its inputs then
    /// need no partitioning of their own, so a join below it that DataFusion
    /// partitioned by the same keys, for it, collects its build side too: in
    /// TPC-H Q21 the anti join, the semi join below it and the join with
    /// `orders` below that, all on the order key, none of whose inputs is
    /// then repartitioned.
    pub fn collects_build_side(&mut self, node: &Arc<dyn ExecutionPlan>, relied: Relied) -> Result<bool> {
        let Some(join) = node.downcast_ref::<HashJoinExec>() else {
            return Ok(false);
        };
        if !may_collect_build_side(join) {
            return Ok(false);
        }
        let Ok(devices) = self.hash_join_checks(join)? else {
            return Ok(false);
        };
        let size = self.planned_size(join.left(), join.right());
        Ok(self.may_collect(relied, &devices, &size))
    }

    /// Whether a join may collect one build side: the options allow it,
    /// nothing above relies on its partitioning, it runs on one device (one
    /// build side would keep every partition on the first of several, where
    /// in `Partitioned` mode each partition takes its own build side to a
    /// device of its own), and it is large by the plan. One that may well be
    /// small keeps DataFusion's shape: where its build side goes to
    /// DataFusion's operator, that operator then runs as DataFusion planned
    /// it, a `Partitioned` join in parallel (collected into one build side,
    /// a left join's unmatched rows all leave from one partition, and the
    /// aggregation above runs on one core: TPC-DS Q75 at scale factor 10
    /// took 2.4 times DataFusion's time so on the H100).
    fn may_collect(&self, relied: Relied, devices: &Devices, size: &PlannedSize) -> bool {
        self.shape == Shape::Best
            && self.options.collect_build_side
            && !relied.partitioning
            && devices.len() == 1
            && *size == PlannedSize::Large
    }

    fn assess_hash_join(&mut self, join: &HashJoinExec, collects: bool) -> Result<Assessment> {
        let devices = match self.hash_join_checks(join)? {
            Ok(devices) => devices,
            Err(reason) => return Ok(Assessment::Keep(reason)),
        };
        if collects {
            let Some(reshaped) = with_one_build_side(join)? else {
                return internal_err!(
                    "GPU join rule: a {} join to collect its build side is not partitioned",
                    join.join_type()
                );
            };
            return self.replace(join, Some(reshaped), ReplacedOperator::HashJoin, devices);
        }
        if let Some(reason) = self.below_min_build_rows(join.left()) {
            return Ok(Assessment::Keep(reason));
        }
        if let PlannedSize::Small(reason) = self.planned_size(join.left(), join.right()) {
            return Ok(Assessment::Keep(reason));
        }
        self.replace(join, None, ReplacedOperator::HashJoin, devices)
    }

    /// The devices a hash join would run on, or why it cannot run on any,
    /// whatever its size.
    fn hash_join_checks(&mut self, join: &HashJoinExec) -> Result<std::result::Result<Devices, NotOnGpu>> {
        if *join.partition_mode() == PartitionMode::Auto {
            return Ok(Err(NotOnGpu::PartitionModeUndecided));
        }
        if join.null_aware && join.on().len() != 1 {
            return Ok(Err(NotOnGpu::NullAwareMultiKey));
        }
        self.common_checks(join.left(), join.right(), join.on())
    }

    /// A sort-merge join's twin in `CollectLeft` mode without its hash
    /// repartitions, where it may collect one build side
    /// ([`Self::may_collect`]).
    fn one_build_side(
        &self,
        join: &HashJoinExec,
        relied: Relied,
        devices: &Devices,
        size: &PlannedSize,
    ) -> Result<Option<HashJoinExec>> {
        match self.may_collect(relied, devices, size) {
            true => with_one_build_side(join),
            false => Ok(None),
        }
    }

    /// Why a join stays DataFusion's whose build side cannot reach
    /// `min_build_rows`: the GPU join would only collect it and hand it to
    /// DataFusion's operator, in the same shape, while its probe partitions
    /// read their input ahead and hold it (TPC-DS Q5 at scale factor 10,
    /// two such joins of 15 build rows: 1.15 and 1.23 times DataFusion's
    /// time on the H100 replaced, 0.99 and 0.79 left as planned).
    fn below_min_build_rows(&self, build: &Arc<dyn ExecutionPlan>) -> Option<NotOnGpu> {
        let min_build_rows = self.options.min_build_rows;
        let rows = self.statistics.row_bound(build)?;
        (rows < min_build_rows).then_some(NotOnGpu::BelowMinBuildRows { rows, min_build_rows })
    }

    /// The GPU join for `join`, as `reshaped` (one build side) where given.
    fn replace(
        &self,
        join: &HashJoinExec,
        reshaped: Option<HashJoinExec>,
        replaces: ReplacedOperator,
        devices: Devices,
    ) -> Result<Assessment> {
        let gpu_join =
            |join| GpuJoinExec::try_new_ordered(join, devices, self.options, replaces, None, &self.statistics);
        let exec = match reshaped {
            Some(reshaped) => gpu_join(&reshaped)?.reshaped(),
            // A join swapped as planned may come with the dynamic filter it
            // planted in its probe side: the GPU join feeds it instead.
            None => gpu_join(join)?.feeding_planted_filter(join)?,
        };
        Ok(Assessment::Replace(Arc::new(exec)))
    }

    /// A sort-merge join's sorts below it only fed the CPU merge and go.
    /// Where something above relies on its sorted output, the GPU join
    /// sorts on the device and leaves in the same order, in the same
    /// partitions; otherwise it is any GPU join.
    fn assess_sort_merge_join(&mut self, join: &SortMergeJoinExec, relied: Relied) -> Result<Assessment> {
        let ordered = relied.ordering && join.properties().output_ordering().is_some();
        if ordered && let Some(unsorted) = unsortable_key_type(join)? {
            return Ok(Assessment::Keep(NotOnGpu::OrderingRelied(unsorted)));
        }
        let (left_keys, right_keys): (Vec<_>, Vec<_>) = join.on().iter().cloned().unzip();
        let (left, left_sort_removed) = without_key_sort(join, join.left(), &left_keys, ordered)?;
        let (right, right_sort_removed) = without_key_sort(join, join.right(), &right_keys, ordered)?;
        let devices = match self.common_checks(&left, &right, join.on())? {
            Ok(devices) => devices,
            Err(reason) => return Ok(Assessment::Keep(reason)),
        };
        let join_type = join.join_type();
        let swapped = ordered && SortMergeOrder::keeps_right_order(join_type);
        let (build, probe) = match swapped {
            true => (&right, &left),
            false => (&left, &right),
        };
        let size = match self.planned_size(build, probe) {
            PlannedSize::Small(reason) => return Ok(Assessment::Keep(reason)),
            size => size,
        };
        // A swapped Right join keeps its columns in place by a projection.
        let projection = (swapped && join_type == JoinType::Right).then(|| (0..join.schema().fields().len()).collect());
        let twin = HashJoinExec::try_new(
            left,
            right,
            join.on().to_vec(),
            join.filter().clone(),
            &join_type,
            projection,
            PartitionMode::Partitioned,
            join.null_equality(),
            false,
        )?;
        if !ordered {
            let reshaped = self.one_build_side(&twin, relied, &devices, &size)?;
            return self.replace(&twin, reshaped, ReplacedOperator::SortMergeJoin, devices);
        }
        let twin = match swapped {
            true => swapped_sides(&twin)?,
            false => twin,
        };
        let order = SortMergeOrder::new(join, swapped, (left_sort_removed, right_sort_removed));
        let exec = GpuJoinExec::try_new_ordered(
            &twin,
            devices,
            self.options,
            ReplacedOperator::SortMergeJoin,
            Some(order),
            &self.statistics,
        )?;
        Ok(Assessment::Replace(Arc::new(exec)))
    }

    /// Checks shared by every join: enabled, a backend, key types.
    fn common_checks(
        &mut self,
        left: &Arc<dyn ExecutionPlan>,
        right: &Arc<dyn ExecutionPlan>,
        on: &[(PhysicalExprRef, PhysicalExprRef)],
    ) -> Result<std::result::Result<Devices, NotOnGpu>> {
        if !self.options.enabled {
            return Ok(Err(NotOnGpu::Disabled));
        }
        let devices = match self.devices()? {
            Ok(devices) => devices,
            Err(reason) => return Ok(Err(reason)),
        };
        let (left_schema, right_schema) = (left.schema(), right.schema());
        for (l, r) in on {
            let (build, probe) = (key_type(l, &left_schema)?, key_type(r, &right_schema)?);
            if build != probe {
                return Ok(Err(NotOnGpu::KeyTypesDiffer { build, probe }));
            }
            if !is_supported_key_type(&build) {
                return Ok(Err(NotOnGpu::UnsupportedKeyType(build)));
            }
        }
        Ok(Ok(devices))
    }

    /// The join's size against `min_rows`, with the build side as large as
    /// the plan lets it be and the probe side as estimated. Once collected,
    /// the build side is checked again with its rows (`GpuJoinExec`), so the
    /// plan leaves to DataFusion only what that check would, whatever the
    /// build side turns out to be; a build side above a join, whose
    /// estimate can be millions of rows short, is left to that check.
    fn planned_size(&self, build: &Arc<dyn ExecutionPlan>, probe: &Arc<dyn ExecutionPlan>) -> PlannedSize {
        let min_rows = self.options.min_rows;
        let Some(probe_rows) = self.estimated_rows(probe) else {
            return PlannedSize::Large;
        };
        let estimate = self.estimated_rows(build);
        match (self.statistics.row_bound(build), estimate) {
            (Some(bound), _) => {
                let rows = bound.max(estimate.unwrap_or(0)).saturating_add(probe_rows);
                match rows < min_rows {
                    true => PlannedSize::Small(NotOnGpu::BelowMinRows { rows, min_rows }),
                    false => PlannedSize::Large,
                }
            }
            (None, Some(estimate)) if estimate.saturating_add(probe_rows) < min_rows => PlannedSize::Unsure,
            (None, _) => PlannedSize::Large,
        }
    }

    /// The session's devices, found once per plan ([`session_devices`]).
    fn devices(&mut self) -> Result<std::result::Result<Devices, NotOnGpu>> {
        if self.devices.is_none() {
            self.devices = Some(session_devices(self.options)?);
        }
        Ok(self.devices.clone().unwrap_or(Err(NotOnGpu::Disabled)))
    }

    fn estimated_rows(&self, plan: &Arc<dyn ExecutionPlan>) -> Option<usize> {
        self.statistics.of(plan)?.num_rows.get_value().copied()
    }
}

/// The session's devices (`gpu_join.devices`) on its backend. An explicit
/// `cuda` without a usable device is an error rather than a silent
/// fallback, so that a misconfigured GPU never goes unnoticed; under
/// `auto`, operators stay DataFusion's unless every listed device is usable.
pub(super) fn session_devices(options: &GpuJoinConfig) -> Result<std::result::Result<Devices, NotOnGpu>> {
    Ok(match options.backend {
        BackendChoice::Cpu => Ok(Devices::cpu(options)),
        BackendChoice::Auto => Devices::cuda(options).map_err(NotOnGpu::NoDevice),
        BackendChoice::Cuda => match Devices::cuda(options) {
            Ok(devices) => Ok(devices),
            Err(why) => {
                return plan_err!(
                    "gpu_join.backend is 'cuda' but no CUDA device is usable: {why} (gpu_join.devices = '{}'). Set \
                     gpu_join.backend = 'auto' to leave joins to DataFusion when no GPU is usable, 'cpu' for the \
                     CPU reference backend, or gpu_join.devices to usable devices",
                    options.devices
                );
            }
        },
    })
}

fn key_type(key: &PhysicalExprRef, schema: &arrow::datatypes::Schema) -> Result<arrow::datatypes::DataType> {
    key.data_type(schema)
}

/// The first key type whose values cannot be sorted into SQL order on the
/// device, if any.
fn unsortable_key_type(join: &SortMergeJoinExec) -> Result<Option<DataType>> {
    let schema = join.left().schema();
    for (key, _) in join.on() {
        let data_type = key.data_type(&schema)?;
        if !is_packable_key_type(&data_type) {
            return Ok(Some(data_type));
        }
    }
    Ok(None)
}

/// `join` with its inputs swapped, as a hash join itself.
fn swapped_sides(join: &HashJoinExec) -> Result<HashJoinExec> {
    let swapped = join.swap_inputs(PartitionMode::Partitioned)?;
    match swapped.downcast_ref::<HashJoinExec>() {
        Some(swapped) => Ok(swapped.builder().reset_state().build()?),
        None => internal_err!("GPU join: swapping the sides of a {} join gave a {}", join.join_type(), swapped.name()),
    }
}

/// The input of a plain sort (no fetch) below a sort-merge join, and
/// whether the sort was removed. Where the join's order is kept, only a
/// sort that a sort by the join's keys makes good for goes: one that also
/// orders by other columns, for the plan above, stays.
fn without_key_sort(
    join: &SortMergeJoinExec,
    plan: &Arc<dyn ExecutionPlan>,
    keys: &[PhysicalExprRef],
    ordered: bool,
) -> Result<(Arc<dyn ExecutionPlan>, bool)> {
    let Some(sort) = plan.downcast_ref::<SortExec>().filter(|sort| sort.fetch().is_none()) else {
        return Ok((Arc::clone(plan), false));
    };
    let input = Arc::clone(sort.input());
    if !ordered {
        return Ok((input, true));
    }
    let Some(key_ordering) = SortMergeOrder::key_ordering(join, keys) else {
        return Ok((Arc::clone(plan), false));
    };
    let by_keys = SortExec::new(key_ordering, Arc::clone(&input)).with_preserve_partitioning(true);
    match by_keys.properties().equivalence_properties().ordering_satisfy(sort.expr().clone())? {
        true => Ok((input, true)),
        false => Ok((Arc::clone(plan), false)),
    }
}
