//! The CPU reference backend: the join primitives in plain Rust.
//!
//! It defines the answer the CUDA backend is tested against, so it favours
//! obviously correct code over speed; rayon spreads the per-partition match
//! work over cores. "Backend memory" is host memory here, so uploads and
//! downloads are free and its columns are plain Arrow arrays of any type.

mod grouping;
mod instance;
mod matching;
mod primitives;
mod transform;

pub use instance::CpuBackend;
pub use matching::ChainedTables;
