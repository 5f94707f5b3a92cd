//! Apache DataFusion joins on NVIDIA GPUs.
//!
//! One call turns it on for a session:
//!
//! ```
//! use datafusion::execution::SessionStateBuilder;
//! use datafusion::prelude::SessionContext;
//! use datafusion_gpu_join::SessionStateBuilderExt;
//!
//! let state = SessionStateBuilder::new().with_default_features().with_gpu_join().build();
//! let ctx = SessionContext::new_with_state(state);
//! ```
//!
//! From then on an optimizer rule replaces `HashJoinExec` and
//! `SortMergeJoinExec` with [`GpuJoinExec`] wherever a GPU join backend can
//! run them; other joins keep DataFusion's operator, and
//! [`plan_decisions`] says why. The layers, from the top:
//!
//! * [`rule`]: which joins move, and why the others do not;
//! * [`exec`]: the operator, streaming batches through a backend;
//! * [`algorithms`]: the partitioned hash and sort-merge joins, written once;
//! * [`backend`]: the join primitives, on the CPU (the reference) or CUDA;
//! * [`keys`]: join keys normalised to fixed-width integers.
//!
//! With the `distributed` feature, `distributed` runs the joins of a
//! `datafusion-distributed` cluster on its workers' GPUs.

pub mod algorithms;
mod arrays;
pub mod backend;
pub mod config;
#[cfg(feature = "distributed")]
pub mod distributed;
pub mod exec;
pub mod keys;
mod lanes;
mod pinned_batches;
pub mod rule;
mod session;
pub mod testing;
mod values;

pub use config::GpuJoinConfig;
pub use exec::GpuJoinExec;
pub use rule::{
    AggregateDecision, AggregatePlacement, GpuJoinRule, JoinDecision, NotOnGpu, Placement, plan_aggregate_decisions,
    plan_decisions, replace_joins_as_planned,
};
pub use session::{GpuJoinContextExt, SessionStateBuilderExt, register};
