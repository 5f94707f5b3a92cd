//! Whether one join can run on the GPU.

use std::sync::Arc;

use datafusion::common::plan_err;
use datafusion::error::Result;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode, SortMergeJoinExec};
use datafusion::physical_plan::sorts::sort::SortExec;

use super::NotOnGpu;
use super::shape::with_one_build_side;
use super::walk::Relied;
use crate::algorithms::choice::plan_statistics;
use crate::backend::{BackendHandle, cuda_backend};
use crate::config::{BackendChoice, GpuJoinConfig};
use crate::exec::{GpuJoinExec, ReplacedOperator};
use crate::keys::is_supported_key_type;

pub(super) enum Assessment {
    Replace(Arc<GpuJoinExec>),
    Keep(NotOnGpu),
}

/// The session's options and, once a join asks, the backend to use.
pub(super) struct RuleContext<'a> {
    options: &'a GpuJoinConfig,
    backend: Option<std::result::Result<BackendHandle, NotOnGpu>>,
}

impl<'a> RuleContext<'a> {
    pub fn new(options: &'a GpuJoinConfig) -> Self {
        Self { options, backend: None }
    }

    /// `None` for nodes that are not joins this rule handles.
    pub fn assess(&mut self, node: &Arc<dyn ExecutionPlan>, relied: Relied) -> Result<Option<Assessment>> {
        if let Some(join) = node.downcast_ref::<HashJoinExec>() {
            return self.assess_hash_join(join, relied).map(Some);
        }
        if let Some(join) = node.downcast_ref::<SortMergeJoinExec>() {
            return self.assess_sort_merge_join(join, relied).map(Some);
        }
        Ok(None)
    }

    fn assess_hash_join(&mut self, join: &HashJoinExec, relied: Relied) -> Result<Assessment> {
        if *join.partition_mode() == PartitionMode::Auto {
            return Ok(Assessment::Keep(NotOnGpu::PartitionModeUndecided));
        }
        if join.null_aware && join.on().len() != 1 {
            return Ok(Assessment::Keep(NotOnGpu::NullAwareMultiKey));
        }
        let backend = match self.common_checks(join.left(), join.right(), join.on())? {
            Ok(backend) => backend,
            Err(reason) => return Ok(Assessment::Keep(reason)),
        };
        self.replace(join, relied, ReplacedOperator::HashJoin, backend)
    }

    /// The GPU join for `join`, with one build side where nothing above
    /// relies on the join's partitioning.
    fn replace(
        &self,
        join: &HashJoinExec,
        relied: Relied,
        replaces: ReplacedOperator,
        backend: BackendHandle,
    ) -> Result<Assessment> {
        let reshaped = match self.options.collect_build_side && !relied.partitioning {
            true => with_one_build_side(join)?,
            false => None,
        };
        let exec = GpuJoinExec::try_new(reshaped.as_ref().unwrap_or(join), backend, self.options, replaces)?;
        Ok(Assessment::Replace(Arc::new(exec)))
    }

    /// A sort-merge join is replaced only when nothing above relies on its
    /// sorted output; the sorts below it then only fed the CPU merge and go.
    fn assess_sort_merge_join(&mut self, join: &SortMergeJoinExec, relied: Relied) -> Result<Assessment> {
        if relied.ordering {
            return Ok(Assessment::Keep(NotOnGpu::OrderingRelied));
        }
        let (left, right) = (without_sort(join.left()), without_sort(join.right()));
        let backend = match self.common_checks(&left, &right, join.on())? {
            Ok(backend) => backend,
            Err(reason) => return Ok(Assessment::Keep(reason)),
        };
        let twin = HashJoinExec::try_new(
            left,
            right,
            join.on().to_vec(),
            join.filter().clone(),
            &join.join_type(),
            None,
            PartitionMode::Partitioned,
            join.null_equality(),
            false,
        )?;
        self.replace(&twin, relied, ReplacedOperator::SortMergeJoin, backend)
    }

    /// Checks shared by every join: enabled, a backend, key types, size.
    fn common_checks(
        &mut self,
        left: &Arc<dyn ExecutionPlan>,
        right: &Arc<dyn ExecutionPlan>,
        on: &[(PhysicalExprRef, PhysicalExprRef)],
    ) -> Result<std::result::Result<BackendHandle, NotOnGpu>> {
        if !self.options.enabled {
            return Ok(Err(NotOnGpu::Disabled));
        }
        let backend = match self.backend()? {
            Ok(backend) => backend,
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
        if let (Some(l), Some(r)) = (estimated_rows(left), estimated_rows(right)) {
            let rows = l.saturating_add(r);
            if rows < self.options.min_rows {
                return Ok(Err(NotOnGpu::BelowMinRows { rows, min_rows: self.options.min_rows }));
            }
        }
        Ok(Ok(backend))
    }

    /// The backend for this session, found once per plan. An explicit
    /// `cuda` without a usable device is an error rather than a silent
    /// fallback, so that a misconfigured GPU never goes unnoticed.
    fn backend(&mut self) -> Result<std::result::Result<BackendHandle, NotOnGpu>> {
        if self.backend.is_none() {
            self.backend = Some(match self.options.backend {
                BackendChoice::Cpu => Ok(BackendHandle::Cpu),
                BackendChoice::Auto => cuda_backend(self.options).map_err(NotOnGpu::NoDevice),
                BackendChoice::Cuda => match cuda_backend(self.options) {
                    Ok(backend) => Ok(backend),
                    Err(why) => {
                        return plan_err!(
                            "gpu_join.backend is 'cuda' but no CUDA device is usable: {why}. \
                             Set gpu_join.backend = 'auto' to leave joins to DataFusion when no GPU is usable, \
                             or 'cpu' for the CPU reference backend"
                        );
                    }
                },
            });
        }
        Ok(self.backend.clone().unwrap_or(Err(NotOnGpu::Disabled)))
    }
}

fn key_type(key: &PhysicalExprRef, schema: &arrow::datatypes::Schema) -> Result<arrow::datatypes::DataType> {
    key.data_type(schema)
}

fn estimated_rows(plan: &Arc<dyn ExecutionPlan>) -> Option<usize> {
    plan_statistics(plan)?.num_rows.get_value().copied()
}

/// The input of a plain sort (no fetch), or the node itself.
fn without_sort(plan: &Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    match plan.downcast_ref::<SortExec>() {
        Some(sort) if sort.fetch().is_none() => Arc::clone(sort.input()),
        _ => Arc::clone(plan),
    }
}
