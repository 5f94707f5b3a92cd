//! Why a join stays on DataFusion's operator.

use std::fmt;

use arrow::datatypes::DataType;

/// Why a join stays on DataFusion's operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotOnGpu {
    /// `gpu_join.enabled` is false.
    Disabled,
    /// No usable CUDA device under `gpu_join.backend = auto`.
    NoDevice(String),
    /// The join's partition mode was not decided by the planner.
    PartitionModeUndecided,
    /// A null-aware anti join (NOT IN) with more than one key.
    NullAwareMultiKey,
    /// The two sides of a key have different types.
    KeyTypesDiffer { build: DataType, probe: DataType },
    /// A key type the GPU join does not handle.
    UnsupportedKeyType(DataType),
    /// The most rows the build side can have plus the probe side's
    /// estimated rows are below `gpu_join.min_rows`.
    BelowMinRows { rows: usize, min_rows: usize },
    /// The build side can have no more rows than this, below
    /// `gpu_join.min_build_rows`, and the GPU join would run the join in
    /// the shape DataFusion planned it: DataFusion's operator would join it
    /// as collected anyway.
    BelowMinBuildRows { rows: usize, min_build_rows: usize },
    /// An ancestor relies on the sort-merge join's sorted output, and a key
    /// of this type does not sort on the GPU.
    OrderingRelied(DataType),
    /// A sort-merge join, in a plan whose joins are swapped one for one
    /// (a stage of a distributed plan): its sorts would have to go.
    SortMergeAsPlanned,
    /// The plan was made without the GPU join rule.
    RuleNotRun,
}

impl fmt::Display for NotOnGpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotOnGpu::Disabled => write!(f, "gpu_join.enabled is false"),
            NotOnGpu::NoDevice(why) => write!(f, "no usable CUDA device ({why})"),
            NotOnGpu::PartitionModeUndecided => write!(f, "its partition mode is not decided"),
            NotOnGpu::NullAwareMultiKey => write!(f, "null-aware anti join with several keys"),
            NotOnGpu::KeyTypesDiffer { build, probe } => {
                write!(f, "key types differ: build {build}, probe {probe}")
            }
            NotOnGpu::UnsupportedKeyType(t) => write!(f, "unsupported key type {t}"),
            NotOnGpu::BelowMinRows { rows, min_rows } => {
                write!(f, "at most about {rows} rows, below gpu_join.min_rows = {min_rows}")
            }
            NotOnGpu::BelowMinBuildRows { rows, min_build_rows } => {
                write!(f, "at most {rows} build rows, below gpu_join.min_build_rows = {min_build_rows}")
            }
            NotOnGpu::OrderingRelied(t) => {
                write!(
                    f,
                    "the plan relies on the sort-merge join's output ordering, and {t} keys do not sort on the GPU"
                )
            }
            NotOnGpu::SortMergeAsPlanned => {
                write!(f, "a sort-merge join is kept where joins are swapped one for one, its sorts in place")
            }
            NotOnGpu::RuleNotRun => {
                write!(f, "the GPU join rule is not registered for this session")
            }
        }
    }
}
