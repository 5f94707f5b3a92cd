//! The integration tests, in one binary.
//!
//! `GPU_JOIN_TEST_BACKEND=cuda` runs every suite on the CUDA backend (on a
//! GPU machine); the default is the CPU reference backend.

mod common;

mod aggregates;
mod devices;
mod distributed;
mod dynamic_filters;
mod fuzz;
mod huge_outputs;
mod kernels;
mod layers;
mod plans;
mod primitives;
mod reliability;
mod sqllogic;
mod tpcds;
mod tpch;
