//! Hooks for tests of code that runs the GPU join: device allocations that
//! fail on purpose, so that the paths a full device takes (retries, passes,
//! DataFusion's operator) run on any machine, and smaller limits, so that
//! small inputs take the paths that huge outputs take.
//!
//! They are set on the session's configuration, not as `gpu_join.*`
//! options, so that no user meets them in `SHOW ALL`:
//!
//! ```
//! use std::sync::Arc;
//! use datafusion::prelude::{SessionConfig, SessionContext};
//! use datafusion_gpu_join::testing::InjectedAllocationFailures;
//!
//! let faults = InjectedAllocationFailures { probe: 1, ..Default::default() };
//! let config = SessionConfig::new().with_extension(Arc::new(faults));
//! let ctx = SessionContext::new_with_config(config);
//! ```

use datafusion::prelude::SessionConfig;

use crate::backend::MAX_CANDIDATES;
use crate::values::MAX_ARRAY_VALUES;

/// Device allocations of each join that fail as if the device were full.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InjectedAllocationFailures {
    /// The first `probe` allocations of each join partition's probe chunks.
    pub probe: usize,
    /// Allocations of each build side's preparation, after the first
    /// `build_spared`.
    pub build: usize,
    /// How many of each build side's allocations succeed before its
    /// failures start.
    pub build_spared: usize,
}

impl InjectedAllocationFailures {
    /// The failures set on `config`; none where none are set.
    pub fn of(config: &SessionConfig) -> Self {
        config.get_extension::<Self>().map(|faults| *faults).unwrap_or_default()
    }
}

/// The limits a join works within, smaller in tests: a probe chunk whose
/// matches are more pairs than `pairs` is joined in pieces, and output rows
/// whose values taken on the host would hold more than `array_values`
/// behind one array's 32-bit offsets are cut into several batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinLimits {
    /// The most candidate pairs one match call makes.
    pub pairs: usize,
    /// The most values (bytes of strings, values of lists) one output
    /// array holds behind its offsets.
    pub array_values: usize,
}

impl Default for JoinLimits {
    fn default() -> Self {
        Self { pairs: MAX_CANDIDATES, array_values: MAX_ARRAY_VALUES }
    }
}

impl JoinLimits {
    /// The limits set on `config`; the join's own where none are set.
    pub fn of(config: &SessionConfig) -> Self {
        config.get_extension::<Self>().map(|limits| *limits).unwrap_or_default()
    }
}
