//! The join algorithms, written once over the backend primitives.
//!
//! A join runs in the three phases of the GFTR paper:
//!
//! 1. **transform**: the build side is radix-partitioned (partitioned hash
//!    join) or sorted (sort-merge join) once; each probe chunk is transformed
//!    the same way. Payload columns travel with the keys when that side
//!    gathers from its transformed relation (GFTR), otherwise row ids do (GFUR).
//! 2. **match**: candidate pairs of equal normalised keys, then key
//!    verification for hashed keys (on the host) and the residual join
//!    filter (on the backend where it compares columns, on the host
//!    otherwise); then the join type's semantics (outer padding, semi,
//!    anti, mark) from flags.
//! 3. **materialize**: output columns gathered from positions.

mod build_side;
pub mod choice;
mod definition;
mod grouping;
mod host_rows;
mod materialize;
mod pair_filter;
mod phases;
mod probe_chunk;
mod probe_columns;
mod residual;
mod semantics;
mod side;
mod staged_keys;
mod strategy;
mod string_codes;

pub use build_side::{BuildSide, ProbePlan, finish_build_side, prepare_build_side};
pub use definition::{JoinDefinition, KeyOrder, OutputColumn};
pub use grouping::{AggregateNotOnGpu, Grouping, GroupingTimers};
pub use host_rows::{HostRows, assemble_columns};
pub use materialize::OutputLimits;
pub use pair_filter::{ColumnComparison, PairFilter};
pub use phases::PhaseTimers;
pub use probe_chunk::{Emit, JoinedChunk, LoadedChunk, join_loaded_chunk, load_probe_chunk};
pub use probe_columns::{ProbeChunkPolicy, ProbeColumns, ProbeOutput, upload_pays};
pub(crate) use side::columns_held;
pub use staged_keys::{CollectedKeys, evaluate_keys};
pub use strategy::{Algorithm, Strategy};
