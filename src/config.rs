//! `gpu_join.*` session options.
//!
//! The options live in DataFusion's own config system as a [`ConfigExtension`],
//! so `SET gpu_join.enabled = false` works from SQL and `SHOW ALL` lists them.
//! Every option is documented for users in `docs/configuration.md`.

use std::fmt;
use std::str::FromStr;

use datafusion::common::config::{ConfigExtension, ConfigOptions};
use datafusion::common::{config_err, config_field, extensions_options};
use datafusion::error::{DataFusionError, Result};

/// Defines a config enum with its SQL spelling, `FromStr`, `Display` and
/// `ConfigField`, so that each option has exactly one list of accepted values.
macro_rules! config_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident => $text:literal),+ $(,)? } default $default:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub enum $name {
            $($(#[$vdoc])* $variant,)+
        }

        impl $name {
            /// Every accepted spelling, for error messages and docs.
            pub const VALUES: &'static [&'static str] = &[$($text),+];
        }

        impl FromStr for $name {
            type Err = DataFusionError;
            fn from_str(s: &str) -> Result<Self> {
                match s.trim().to_ascii_lowercase().as_str() {
                    $($text => Ok(Self::$variant),)+
                    other => config_err!(
                        "gpu_join: '{}' is not a valid {}; expected one of {}",
                        other,
                        stringify!($name),
                        Self::VALUES.join(", ")
                    ),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(match self { $(Self::$variant => $text,)+ })
            }
        }

        config_field!($name);
    };
}

config_enum! {
    /// Which implementation of the join primitives runs the join.
    BackendChoice {
        /// CUDA when a usable device exists; otherwise joins stay with DataFusion.
        #[default]
        Auto => "auto",
        /// Always CUDA; planning fails with a clear error when no device is usable.
        Cuda => "cuda",
        /// The CPU reference backend (the oracle the CUDA backend is tested against).
        Cpu => "cpu",
    } default Auto
}

config_enum! {
    /// Which join algorithm runs on the backend.
    AlgorithmChoice {
        /// Chosen per join from sizes and key properties.
        #[default]
        Auto => "auto",
        /// Partitioned hash join (PHJ).
        Hash => "hash",
        /// Sort-merge join (SMJ).
        SortMerge => "sort_merge",
        /// Directory join (DIR) where the build side's key codes are dense
        /// enough, partitioned hash join where they are not.
        Direct => "direct",
    } default Auto
}

config_enum! {
    /// Where payload columns are gathered from.
    MaterializationChoice {
        /// Chosen per join side.
        #[default]
        Auto => "auto",
        /// Gather from transformed relations (GFTR, the `-OM` variants).
        Transformed => "transformed",
        /// Gather from untransformed relations by row id (GFUR, the `-UM` variants).
        Untransformed => "untransformed",
    } default Auto
}

config_enum! {
    /// When matches leave in probe row order, as HashJoinExec emits them.
    ProbeOrderChoice {
        /// When the plan relies on it, and for small probe chunks, where it
        /// costs nothing measurable (so that small results, LIMIT without
        /// ORDER BY among them, come out exactly as DataFusion's).
        #[default]
        Auto => "auto",
        /// Always, at the cost of unclustered gathers on large joins.
        Always => "always",
        /// Only when the plan relies on the probe side's order.
        Required => "required",
    } default Auto
}

config_enum! {
    /// Which join placement decisions are written to the log.
    ExplainChoice {
        /// Nothing is logged.
        None => "none",
        /// Joins that stay on DataFusion's operator, with the reason.
        #[default]
        NotOnGpu => "not_on_gpu",
        /// Every join, replaced or not.
        All => "all",
    } default NotOnGpu
}

/// A memory budget: `auto`, a byte count with an optional K/M/G/T suffix, or a
/// percentage of the device's total memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemoryLimit {
    /// 80% of the device memory that is free when the backend starts.
    #[default]
    Auto,
    /// An absolute number of bytes.
    Bytes(u64),
    /// A share of the device's total memory, 1 to 100.
    Percent(u8),
}

impl MemoryLimit {
    /// The budget in bytes for a device with `total` bytes of which `free` are free.
    pub fn resolve(&self, total: u64, free: u64) -> u64 {
        match *self {
            MemoryLimit::Auto => free / 10 * 8,
            MemoryLimit::Bytes(bytes) => bytes.min(total),
            MemoryLimit::Percent(p) => total / 100 * u64::from(p),
        }
    }
}

impl FromStr for MemoryLimit {
    type Err = DataFusionError;
    fn from_str(s: &str) -> Result<Self> {
        let text = s.trim().to_ascii_lowercase();
        if text == "auto" {
            return Ok(MemoryLimit::Auto);
        }
        let invalid = || {
            config_err!(
                "gpu_join.memory_limit: '{s}' is not 'auto', a size such as '40G' or '512M', or a percentage such as '75%'"
            )
        };
        if let Some(p) = text.strip_suffix('%') {
            return match p.trim().parse::<u8>() {
                Ok(p) if (1..=100).contains(&p) => Ok(MemoryLimit::Percent(p)),
                _ => invalid(),
            };
        }
        let number = text.strip_suffix('b').unwrap_or(&text);
        let (digits, scale) = match number.char_indices().last() {
            Some((i, 'k')) => (&number[..i], 1u64 << 10),
            Some((i, 'm')) => (&number[..i], 1 << 20),
            Some((i, 'g')) => (&number[..i], 1 << 30),
            Some((i, 't')) => (&number[..i], 1 << 40),
            _ => (number, 1),
        };
        match digits.trim().parse::<u64>() {
            Ok(n) if n > 0 => n.checked_mul(scale).map(MemoryLimit::Bytes).map_or_else(invalid, Ok),
            _ => invalid(),
        }
    }
}

impl fmt::Display for MemoryLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryLimit::Auto => f.write_str("auto"),
            MemoryLimit::Bytes(b) => write!(f, "{b}"),
            MemoryLimit::Percent(p) => write!(f, "{p}%"),
        }
    }
}

config_field!(MemoryLimit);

extensions_options! {
    /// Options of the GPU join, set with `SET gpu_join.<name> = <value>`.
    pub struct GpuJoinConfig {
        /// Replace DataFusion's hash and sort-merge joins with GpuJoinExec.
        pub enabled: bool, default = true
        /// Backend running the join primitives: auto, cuda or cpu.
        pub backend: BackendChoice, default = BackendChoice::Auto
        /// Join algorithm: auto, hash, sort_merge or direct.
        pub algorithm: AlgorithmChoice, default = AlgorithmChoice::Auto
        /// Payload materialization: auto, transformed (GFTR) or untransformed (GFUR).
        pub materialization: MaterializationChoice, default = MaterializationChoice::Auto
        /// Joins whose estimated build plus probe rows are below this stay on
        /// DataFusion: at planning, from statistics, and again with each build
        /// side as collected. The default is where the GPU session started to
        /// win on the operator benchmark (docs/benchmarks.md).
        pub min_rows: usize, default = 10_000_000
        /// A build side (a partition's, in `Partitioned` mode) with fewer
        /// rows as collected is joined by DataFusion's operator: its hash
        /// table then sits in the CPU's caches and it probes faster than
        /// probe rows cross PCIe (docs/benchmarks.md, TPC-H at SF 10).
        pub min_build_rows: usize, default = 1 << 18
        /// Where a build side goes to DataFusion's operator, a probe
        /// partition that turns out the smaller side builds the hash table
        /// and the build side's rows stream through it: in `Partitioned`
        /// mode one with fewer than half its partition's build rows, in
        /// `CollectLeft` mode one of at most 1,024 rows (8,192 where there
        /// are no more partitions than twice the cores) that, counted once
        /// for every partition, is under half the shared build side.
        pub build_smaller_side: bool, default = true
        /// CUDA device ordinal.
        pub device: usize, default = 0
        /// Device memory budget: auto, a size such as 40G, or a percentage such as 75%.
        pub memory_limit: MemoryLimit, default = MemoryLimit::Auto
        /// Run partitioned joins with one build side shared by every probe
        /// partition, without DataFusion's hash repartitioning, where nothing
        /// above relies on the join's partitioning.
        pub collect_build_side: bool, default = true
        /// Most build rows joined in one pass; a larger build side is split
        /// by key hash into passes. 0 sizes passes from the device budget.
        pub build_pass_rows: usize, default = 0
        /// Most bytes of page-locked host memory the join keeps for data
        /// on its way to and from the device (probe chunks, build sides,
        /// output columns), taken as needed and reused. Beyond it, and at
        /// 0, data goes through small staging buffers and fresh memory.
        pub pinned_pool_bytes: usize, default = 8 << 30
        /// Probe rows gathered into one chunk before it is joined.
        pub probe_chunk_rows: usize, default = 1 << 22
        /// Most probe rows a partition of a `CollectLeft` join reads while
        /// its build side is collected, as long as fewer than
        /// `min_build_rows` build rows are in (a larger build side goes to
        /// the device, whose wait the probe scan would lengthen), and not
        /// where the probe input is a scan of batches in memory. 0 reads
        /// the probe input only once the build side is in, as DataFusion's
        /// hash join does.
        pub probe_read_ahead_rows: usize, default = 1 << 22
        /// Output rows per probe row from which a probe chunk's output
        /// columns are uploaded and gathered on the device; below it only
        /// keys are uploaded and the matched rows are taken on the host.
        /// 0 always uploads them.
        pub probe_device_gather_ratio: f64, default = 0.25
        /// Evaluate join filters that compare columns of integer, date or
        /// time types (`a.x <> b.y AND a.z < b.z`) on the backend, on the
        /// candidate pairs where they lie. Other filters, and all of them
        /// when false, are evaluated on the host by DataFusion's expression.
        pub filter_on_backend: bool, default = true
        /// When matches keep the probe side's row order: auto, always or required.
        pub keep_probe_order: ProbeOrderChoice, default = ProbeOrderChoice::Auto
        /// GPU jobs (loading or joining a probe chunk, preparing a build side)
        /// that run on the device at once, over every partition and query.
        pub concurrent_tasks: usize, default = 16
        /// Testing only: the first N device allocations of each join
        /// partition fail as if the device were full.
        pub inject_allocation_failures: usize, default = 0
        /// Testing only: the first N device allocations of each build
        /// side's preparation fail as if the device were full.
        pub inject_build_allocation_failures: usize, default = 0
        /// Testing only: that many of each build side's device allocations
        /// succeed before its injected failures start.
        pub inject_build_allocation_failures_after: usize, default = 0
        /// Which placement decisions are logged: none, not_on_gpu or all.
        pub explain: ExplainChoice, default = ExplainChoice::NotOnGpu
    }
}

impl ConfigExtension for GpuJoinConfig {
    const PREFIX: &'static str = "gpu_join";
}

impl GpuJoinConfig {
    /// The session's options, or the defaults when the extension is not registered.
    pub fn from_config(options: &ConfigOptions) -> Self {
        options.extensions.get::<GpuJoinConfig>().cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_limit_parses_sizes_and_percentages() {
        assert_eq!("auto".parse::<MemoryLimit>().unwrap(), MemoryLimit::Auto);
        assert_eq!("40G".parse::<MemoryLimit>().unwrap(), MemoryLimit::Bytes(40 << 30));
        assert_eq!("512mb".parse::<MemoryLimit>().unwrap(), MemoryLimit::Bytes(512 << 20));
        assert_eq!("1024".parse::<MemoryLimit>().unwrap(), MemoryLimit::Bytes(1024));
        assert_eq!("75%".parse::<MemoryLimit>().unwrap(), MemoryLimit::Percent(75));
        for bad in ["", "0", "-1G", "12X", "101%", "0%", "G"] {
            assert!(bad.parse::<MemoryLimit>().is_err(), "{bad} should be rejected");
        }
        assert_eq!(MemoryLimit::Percent(50).resolve(1000, 100), 500);
        assert_eq!(MemoryLimit::Bytes(5000).resolve(1000, 100), 1000);
        assert_eq!(MemoryLimit::Auto.resolve(1000, 100), 80);
    }

    #[test]
    fn enums_round_trip_and_reject_unknown_values() {
        for v in BackendChoice::VALUES {
            assert_eq!(v.parse::<BackendChoice>().unwrap().to_string(), *v);
        }
        for v in AlgorithmChoice::VALUES {
            assert_eq!(v.parse::<AlgorithmChoice>().unwrap().to_string(), *v);
        }
        let err = "gpu".parse::<BackendChoice>().unwrap_err().to_string();
        assert!(err.contains("auto, cuda, cpu"), "{err}");
    }
}
