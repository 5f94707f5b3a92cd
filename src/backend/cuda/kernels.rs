//! The join kernels: compiled by NVRTC at run time, cached on disk, loaded
//! once per device.
//!
//! Compiled images are cached under `GPU_JOIN_KERNEL_CACHE`, or
//! `$XDG_CACHE_HOME/datafusion-gpu-join`, or `~/.cache/datafusion-gpu-join`,
//! keyed by a hash of the source, the target architecture and the NVRTC
//! version, so a second process starts without compiling.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{Ptx, result as nvrtc, sys as nvrtc_sys};

/// Kernel sources, concatenated in this order into one translation unit.
const SOURCES: [(&str, &str); 9] = [
    ("common.cuh", include_str!("../../../kernels/common.cuh")),
    ("scan.cu", include_str!("../../../kernels/scan.cu")),
    ("radix.cu", include_str!("../../../kernels/radix.cu")),
    ("match.cu", include_str!("../../../kernels/match.cu")),
    ("directory.cu", include_str!("../../../kernels/directory.cu")),
    ("gather.cu", include_str!("../../../kernels/gather.cu")),
    ("compact.cu", include_str!("../../../kernels/compact.cu")),
    ("filter.cu", include_str!("../../../kernels/filter.cu")),
    ("group.cu", include_str!("../../../kernels/group.cu")),
];

/// Every kernel the backend launches.
pub(crate) const KERNEL_NAMES: [&str; 85] = [
    "scan_block_totals_u32",
    "scan_block_totals_u64",
    "scan_totals_u32",
    "scan_totals_u64",
    "scan_blocks_u32",
    "scan_blocks_u64",
    "radix_digit_counts_u32",
    "radix_digit_counts_u64",
    "radix_scatter_u32",
    "radix_scatter_u64",
    "partition_offsets_u32",
    "partition_offsets_u64",
    "sorted_offsets_u32",
    "sorted_offsets_u64",
    "build_tables_u32",
    "build_tables_u64",
    "hash_first_shared_u32",
    "hash_first_shared_u64",
    "hash_first_kept_u32",
    "hash_first_kept_u64",
    "hash_second_shared_u32",
    "hash_second_shared_u64",
    "hash_second_kept_u32",
    "hash_second_kept_u64",
    "hash_mark_shared_u32",
    "hash_mark_shared_u64",
    "hash_mark_kept_u32",
    "hash_mark_kept_u64",
    "hash_misplaced",
    "plan_piece_counts",
    "plan_pieces",
    "plan_unit_counts",
    "plan_units",
    "merge_splits_u32",
    "merge_splits_u64",
    "merge_search_u32",
    "merge_search_u64",
    "merge_expand",
    "mark_sorted_u32",
    "mark_sorted_u64",
    "directory_counts_u32",
    "directory_counts_u64",
    "directory_search_u32",
    "directory_search_u64",
    "directory_mark_probe_u32",
    "directory_mark_probe_u64",
    "directory_mark_build_u32",
    "directory_mark_build_u64",
    "gather_1",
    "gather_2",
    "gather_4",
    "gather_8",
    "gather_16",
    "gather_validity",
    "gather_positions",
    "pack_bits",
    "unpack_bits",
    "compact_count",
    "compact_write",
    "set_flags",
    "scatter_permutation",
    "sequence",
    "raw_codes_u32",
    "compare_rows_i8",
    "compare_rows_i16",
    "compare_rows_i32",
    "compare_rows_i64",
    "compare_rows_u8",
    "compare_rows_u16",
    "compare_rows_u32",
    "compare_rows_u64",
    "group_insert_u32",
    "group_insert_u64",
    "group_used_u32",
    "group_used_u64",
    "group_rows_u32",
    "group_rows_u64",
    "group_of_rows",
    "group_count",
    "group_sum_8",
    "group_sum_16",
    "group_min_4",
    "group_max_4",
    "group_min_8",
    "group_max_8",
];

/// The whole kernel source, with `#line` markers so that NVRTC's messages
/// name the original file.
pub(crate) fn kernel_source() -> String {
    SOURCES.iter().map(|(name, text)| format!("#line 1 \"{name}\"\n{text}\n")).collect()
}

/// A hash of the kernel sources: what was measured of one build of the
/// kernels does not describe another.
pub(crate) fn kernel_fingerprint() -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    kernel_source().hash(&mut hasher);
    hasher.finish()
}

fn nvrtc_version() -> Result<(i32, i32), String> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two integers.
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| format!("NVRTC version query failed: {e:?}"))?;
    Ok((major, minor))
}

fn options(arch: &str) -> Vec<String> {
    vec![format!("--gpu-architecture={arch}"), "--std=c++17".to_string(), "-default-device".to_string()]
}

/// Compiles the kernels for a real architecture such as `sm_90` and returns
/// the CUBIN image; the error is NVRTC's log.
pub fn compile_kernels(arch: &str) -> Result<Vec<u8>, String> {
    let source = CString::new(kernel_source()).map_err(|_| "kernel source contains a NUL byte".to_string())?;
    let name = CString::new("datafusion_gpu_join.cu").map_err(|e| e.to_string())?;
    let program = nvrtc::create_program(&source, Some(&name)).map_err(|e| format!("NVRTC program: {e:?}"))?;
    let options = options(arch);
    // SAFETY: `program` is a live program created above.
    let compiled = unsafe { nvrtc::compile_program(program, &options) };
    let result = match compiled {
        Ok(()) => cubin(program),
        Err(e) => {
            // SAFETY: as above.
            let log = unsafe { nvrtc::get_program_log(program) }
                .map(|raw| {
                    // SAFETY: NVRTC returns a NUL-terminated log.
                    unsafe { CStr::from_ptr(raw.as_ptr()) }.to_string_lossy().into_owned()
                })
                .unwrap_or_default();
            Err(format!("NVRTC failed to compile the join kernels for {arch} ({e:?}):\n{log}"))
        }
    };
    // SAFETY: destroyed once, after its last use.
    unsafe { nvrtc::destroy_program(program) }.map_err(|e| format!("NVRTC: {e:?}"))?;
    result
}

fn cubin(program: nvrtc_sys::nvrtcProgram) -> Result<Vec<u8>, String> {
    let mut size = 0usize;
    // SAFETY: `program` was compiled successfully.
    unsafe { nvrtc_sys::nvrtcGetCUBINSize(program, &mut size) }
        .result()
        .map_err(|e| format!("NVRTC CUBIN size: {e:?}"))?;
    let mut image = vec![0u8; size];
    // SAFETY: `image` holds `size` bytes.
    unsafe { nvrtc_sys::nvrtcGetCUBIN(program, image.as_mut_ptr().cast()) }
        .result()
        .map_err(|e| format!("NVRTC CUBIN: {e:?}"))?;
    // A kernel the backend launches but the source lacks would otherwise
    // only fail on a GPU, at load time.
    let has_symbol = |name: &str| {
        let symbol = [name.as_bytes(), b"\0"].concat();
        image.windows(symbol.len()).any(|w| w == symbol.as_slice())
    };
    if let Some(missing) = KERNEL_NAMES.iter().find(|name| !has_symbol(name)) {
        return Err(format!("the compiled kernels lack {missing}"));
    }
    Ok(image)
}

fn cache_path(arch: &str) -> Result<Option<PathBuf>, String> {
    let (major, minor) = nvrtc_version()?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (kernel_source(), arch, major, minor, options(arch)).hash(&mut hasher);
    let file = format!("kernels-{arch}-nvrtc{major}.{minor}-{:016x}.cubin", hasher.finish());
    Ok(crate::backend::cache_dir().map(|dir| dir.join(file)))
}

/// The CUBIN for `arch`, from the disk cache or freshly compiled (and then
/// cached; a cache that cannot be written is skipped).
fn cached_cubin(arch: &str) -> Result<Vec<u8>, String> {
    let path = cache_path(arch)?;
    if let Some(image) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
        return Ok(image);
    }
    let image = compile_kernels(arch)?;
    if let Some(path) = path {
        let written = path.parent().map(std::fs::create_dir_all).transpose().and_then(|_| {
            let temporary = path.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&temporary, &image)?;
            std::fs::rename(&temporary, &path)
        });
        if let Err(e) = written {
            log::debug!("gpu_join: kernel cache {} not written: {e}", path.display());
        }
    }
    Ok(image)
}

/// The loaded kernels of one device.
#[derive(Debug)]
pub(crate) struct Kernels {
    _module: Arc<CudaModule>,
    functions: HashMap<&'static str, CudaFunction>,
}

impl Kernels {
    pub fn load(context: &Arc<CudaContext>) -> Result<Self, String> {
        let (major, minor) = context.compute_capability().map_err(|e| format!("compute capability: {e}"))?;
        let arch = format!("sm_{major}{minor}");
        let image = cached_cubin(&arch)?;
        let module =
            context.load_module(Ptx::from_binary(image)).map_err(|e| format!("loading the join kernels: {e}"))?;
        let mut functions = HashMap::new();
        for name in KERNEL_NAMES {
            let function = module.load_function(name).map_err(|e| format!("kernel {name}: {e}"))?;
            functions.insert(name, function);
        }
        Ok(Self { _module: module, functions })
    }

    pub fn get(&self, name: &str) -> Option<&CudaFunction> {
        self.functions.get(name)
    }
}

/// Shared memory a work unit's hash table may use.
pub(super) const TABLE_BYTES: u32 = 96 * 1024;

/// Shared memory of one work unit's table on a device that allows `max`.
pub(super) fn table_limit(max_shared_bytes: u32) -> u32 {
    TABLE_BYTES.min(max_shared_bytes)
}

/// Kernels whose blocks hold a piece's table in dynamic shared memory.
pub(super) const TABLE_KERNELS: [&str; 8] = [
    "build_tables_u32",
    "build_tables_u64",
    "hash_first_shared_u32",
    "hash_first_shared_u64",
    "hash_second_shared_u32",
    "hash_second_shared_u64",
    "hash_mark_shared_u32",
    "hash_mark_shared_u64",
];

/// The radix scatter kernels, whose shared memory bounds their occupancy.
pub(super) const SCATTER_KERNELS: [&str; 2] = ["radix_scatter_u32", "radix_scatter_u64"];
