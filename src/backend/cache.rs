//! Where what is learnt about a device once is kept between processes:
//! compiled kernels and the device's measured cost profile.

use std::path::PathBuf;

/// `GPU_JOIN_KERNEL_CACHE`, or `$XDG_CACHE_HOME/datafusion-gpu-join`, or
/// `~/.cache/datafusion-gpu-join`; `None` when none can be named.
pub(crate) fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("GPU_JOIN_KERNEL_CACHE") {
        return Some(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))?;
    Some(base.join("datafusion-gpu-join"))
}
