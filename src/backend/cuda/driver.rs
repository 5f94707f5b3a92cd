//! Loading the CUDA libraries, and CUDA's errors as DataFusion's.

use datafusion::common::DataFusionError;

/// Why no CUDA device can be used, or `Ok` when the driver and NVRTC load.
pub(crate) fn probe_libraries() -> Result<(), String> {
    // cudarc panics on first use when a library is missing, so look first.
    // SAFETY: only tries to load the shared libraries by name.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("the CUDA driver library (libcuda) was not found".into());
    }
    // SAFETY: as above.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err("the NVRTC library (libnvrtc) was not found".into());
    }
    Ok(())
}

pub(crate) fn cuda_error(what: &str, error: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Execution(format!("GPU join: CUDA error while {what}: {error}"))
}
