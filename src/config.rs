//! `gpu_join.*` session options.
//!
//! The options live in DataFusion's own config system as a [`ConfigExtension`],
//! so `SET gpu_join.enabled = false` works from SQL and `SHOW ALL` lists them.
//! The doc comment of each option is its description for users: the table
//! of options in `docs/configuration.md` is generated from them, and a test
//! fails when that table is stale.

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
        /// When the plan relies on it, for small probe chunks, where it
        /// costs nothing measurable (so that small results, LIMIT without
        /// ORDER BY among them, come out exactly as DataFusion's), and for
        /// chunks whose probe columns are taken on the host.
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

/// The devices a join spreads its partitions over (`gpu_join.devices`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DeviceList {
    /// The one device `gpu_join.device` names.
    #[default]
    One,
    /// Every device the driver makes visible.
    All,
    /// These ordinals, in this order; one named twice is used twice.
    Ordinals(Vec<usize>),
}

impl DeviceList {
    /// The ordinals of the devices, `device` being `gpu_join.device` and
    /// `visible` how many devices there are.
    pub fn ordinals(&self, device: usize, visible: impl FnOnce() -> usize) -> Vec<usize> {
        match self {
            DeviceList::One => vec![device],
            DeviceList::All => (0..visible().max(1)).collect(),
            DeviceList::Ordinals(ordinals) => ordinals.clone(),
        }
    }
}

impl FromStr for DeviceList {
    type Err = DataFusionError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "one" => Ok(DeviceList::One),
            "all" => Ok(DeviceList::All),
            list => {
                match list.split(',').map(|o| o.trim().parse::<usize>()).collect::<std::result::Result<Vec<_>, _>>() {
                    Ok(ordinals) if !ordinals.is_empty() => Ok(DeviceList::Ordinals(ordinals)),
                    _ => config_err!(
                        "gpu_join.devices: '{s}' is not 'one' (the device gpu_join.device names), 'all' (every \
                     visible device) or a comma-separated list of device ordinals such as '0,1'"
                    ),
                }
            }
        }
    }
}

impl fmt::Display for DeviceList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceList::One => f.write_str("one"),
            DeviceList::All => f.write_str("all"),
            DeviceList::Ordinals(ordinals) => {
                let text: Vec<String> = ordinals.iter().map(usize::to_string).collect();
                f.write_str(&text.join(","))
            }
        }
    }
}

config_field!(DeviceList);

extensions_options! {
    /// Options of the GPU join, set with `SET gpu_join.<name> = <value>`.
    pub struct GpuJoinConfig {
        /// Replace DataFusion's hash and sort-merge joins with `GpuJoinExec`.
        /// With `false` every plan is exactly DataFusion's.
        pub enabled: bool, default = true
        /// `auto`: the CUDA backend where a device is usable, else joins stay
        /// DataFusion's (plans unchanged). `cuda`: always CUDA; planning
        /// fails with an error saying what to set where no device is usable.
        /// `cpu`: the CPU reference backend, the oracle the CUDA backend is
        /// tested against.
        pub backend: BackendChoice, default = BackendChoice::Auto
        /// `auto`, `hash`, `sort_merge` or `direct`. `auto` runs the
        /// directory join where a build side's key codes are dense, and
        /// otherwise lets the cost model pick the partitioned hash or the
        /// sort-merge join from the build side's sampled keys, the plan's
        /// statistics and the device's measured profile (docs/algorithms.md).
        /// A join that keeps a replaced sort-merge join's order is always
        /// sort-merge.
        pub algorithm: AlgorithmChoice, default = AlgorithmChoice::Auto
        /// Where payloads are gathered from: `transformed` (GFTR, the `-OM`
        /// variants: payloads move with the keys, gathers are clustered) or
        /// `untransformed` (GFUR, `-UM`: gathers by row id). `auto`: the cost
        /// model's choice per side on the GPU, GFUR on the CPU.
        pub materialization: MaterializationChoice, default = MaterializationChoice::Auto
        /// Joins whose build plus probe rows are below this stay on
        /// DataFusion: checked at planning with the most rows the build side
        /// can have and the probe side's estimate, and again with each build
        /// side as collected, when `EXPLAIN ANALYZE` shows
        /// `algorithm=DataFusion` and why. The default is where the GPU
        /// session overtakes DataFusion on the operator benchmark
        /// (docs/benchmarks.md).
        pub min_rows: usize, default = 10_000_000
        /// A build side (a partition's, in `Partitioned` mode) with fewer
        /// rows as collected is joined by DataFusion's operator: its hash
        /// table sits in the CPU's caches, and DataFusion probes it for less
        /// than moving a probe row's key over PCIe costs. A join whose build
        /// side can never reach it is not replaced at all, unless the GPU
        /// join runs it in another shape than DataFusion planned.
        pub min_build_rows: usize, default = 1 << 18
        /// Where a build side goes to DataFusion's operator, a probe
        /// partition that turns out the smaller side builds the hash table
        /// and the build side's rows stream through it: in `Partitioned`
        /// mode one with fewer than half its partition's build rows, in
        /// `CollectLeft` mode one of at most 1,024 rows (8,192 where there
        /// are no more partitions than twice the cores) that, counted once
        /// for every partition, is under half the shared build side.
        pub build_smaller_side: bool, default = true
        /// The CUDA device the joins run on.
        pub device: usize, default = 0
        /// The devices each join spreads its partitions over, each with its
        /// own admission queue and memory budget: `one` (the device
        /// `gpu_join.device` names), `all` (every visible device), or
        /// ordinals such as `0,1` (one named twice is used twice). Partition
        /// `p` of a `Partitioned` join runs on the `p mod n`-th device, with
        /// its own build side, and over several devices such a join keeps
        /// its partitions (`collect_build_side` applies to one device). So
        /// does probe partition `p` of a `CollectLeft` join, its one build
        /// side collected once and placed whole on each device, or, where it
        /// does not fit one, split once by key hash into passes that the
        /// devices hold in turn, each probe partition sending a pass's rows
        /// to the device holding it; unless the join keeps flags of its
        /// matched build rows (left, full, left semi, left anti and left
        /// mark joins), or is a NOT IN or in key order: that one runs on the
        /// first. On the CPU backend each listed
        /// device is an instance of its own, all under the CPU's one
        /// admission queue (`all` is one).
        pub devices: DeviceList, default = DeviceList::One
        /// The device memory the GPU join may hold at once: `auto` (80% of
        /// the memory free when the device is first opened), a size such as
        /// `40G` or `512M`, or a percentage such as `75%`. The device's pool
        /// grows to it when the device opens; an allocation beyond it fails
        /// with an error naming this option, and the join retries or falls
        /// back.
        pub memory_limit: MemoryLimit, default = MemoryLimit::Auto
        /// Run a join DataFusion planned in `Partitioned` mode over hash
        /// repartitions of its inputs in `CollectLeft` mode without them,
        /// where nothing above relies on the join's partitioning, the plan
        /// calls it large and it runs on one device (`gpu_join.devices`):
        /// one build side on the device serves every probe partition. An
        /// input that is another join, which DataFusion partitioned by the
        /// same keys for this one, needs its partitions no longer, and
        /// collects its build side too.
        pub collect_build_side: bool, default = true
        /// Most build rows joined in one pass; a larger build side is split
        /// by key hash into passes, each probe partition joined pass by
        /// pass. 0 sizes passes from the device budget alone (a pass's
        /// transform takes at most a quarter of `memory_limit`). Joins that
        /// cannot be split (Left, Full, LeftSemi, LeftAnti, LeftMark, NOT IN,
        /// or a probe order the plan relies on) run on DataFusion's operator
        /// when their build side does not fit.
        pub build_pass_rows: usize, default = 0
        /// Most bytes of page-locked host memory the join keeps for data
        /// on its way to and from the device (probe chunks, build sides,
        /// output columns), taken as needed and reused until the process
        /// ends, one pool per device. Beyond it, and at 0, data goes through
        /// small staging buffers and fresh memory, more slowly.
        pub pinned_pool_bytes: usize, default = 8 << 30
        /// Probe rows gathered into one chunk before it is joined. Larger
        /// chunks use the GPU better and need more device memory. A chunk
        /// that runs out of device memory, or matches more than 2^24 pairs,
        /// is joined again alone, then in halves down to 4,096 rows, then by
        /// DataFusion's operator over the build side's host copy.
        pub probe_chunk_rows: usize, default = 1 << 22
        /// Most probe rows a partition of a `CollectLeft` join reads while
        /// its build side is collected, as long as fewer than
        /// `min_build_rows` build rows are in (a larger build side goes to
        /// the device, whose wait the probe scan would lengthen), and not
        /// where the probe input is a scan of batches in memory or reads the
        /// join's dynamic filter. 0 reads the probe input only once the build
        /// side is in, as DataFusion's hash join does. The same bounds the
        /// rows a `FilteredFromAboveExec` reads while the filters it applies
        /// are not complete.
        pub probe_read_ahead_rows: usize, default = 1 << 22
        /// Output rows per probe row from which a probe chunk's output
        /// columns are uploaded and gathered on the device; below it only
        /// keys are uploaded and the matched rows are taken on the host.
        /// A join's first chunks decide after matching, by their own output
        /// rows; later ones by those of the chunks so far. 0 always uploads
        /// them.
        pub probe_device_gather_ratio: f64, default = 0.25
        /// Apply the dynamic filter of a GPU join above to the rows of a GPU
        /// join below, through which it passes on its way to the scans (and
        /// those of DataFusion's joins and `TopK`s above as they stand, without
        /// waiting for them): the join below waits until the one above has its
        /// build sides in, as long as they are at most 2^20 rows, then drops
        /// the rows whose key none of them holds (with several key columns, one
        /// of whose key values none holds in that column), and those outside
        /// their spans, before it joins them; where they drop fewer than a
        /// quarter of the first 2^20 rows of an input, it stops checking that
        /// input's rows. An input the plan bounds below `min_rows` rows is
        /// joined whole, without the wait, and so are the probe rows of a
        /// partition whose join goes to DataFusion's operator. The same holds
        /// for the rows an aggregation in the join's probe side reads, where
        /// the filter reaches them (it reads grouping columns only): a
        /// `FilteredFromAboveExec` under the aggregation drops them before they
        /// are grouped. Off, the filter only reaches the scans, which skip row
        /// groups with it. EXPLAIN shows `filters_from_above=[…]` on the joins
        /// below.
        pub filters_from_above: bool, default = true
        /// Group the rows of DataFusion's aggregations on the backend:
        /// where the grouping columns are integers, dates, times, decimals,
        /// booleans, or strings or bytes (grouped by codes given in each
        /// chunk, up to 63 bits of them together) and every aggregate is a `count`, or a `sum`, `min`,
        /// `max` or `avg` of integers, decimals, dates or times (no
        /// DISTINCT, FILTER or ORDER BY), over at least `min_rows`
        /// estimated input rows. Partial aggregations fold rows into
        /// states; final ones merge them where each aggregate's value is
        /// its state (not `avg`); a single-phase one runs as a partial and
        /// a final one. DataFusion still evaluates the grouping
        /// and argument expressions. `EXPLAIN` shows `GpuAggregateExec`;
        /// the aggregations that stay are logged as `explain` says.
        pub aggregate: bool, default = true
        /// Input rows of a partition grouped at once by `aggregate`, each
        /// chunk while the next is read, so that a partition holds up to
        /// two, counted in the session's memory pool (a chunk the pool
        /// refuses more rows is grouped as it stands). A partial
        /// aggregation's groups of each chunk leave once the next is read
        /// (and where they hardly reduce its rows, by DataFusion's
        /// `skip_partial_aggregation_probe_*` settings, or where a chunk's
        /// keys do not pack, the rest of its input goes to DataFusion's); a
        /// final one merges each chunk into its groups.
        pub aggregate_chunk_rows: usize, default = 1 << 23
        /// The fewest values a chunk's grouping keys must be able to take
        /// (by their ranges, strings by their distinct values in the chunk)
        /// for `aggregate` to group the chunk on the backend. Keys that take
        /// fewer make few groups, which DataFusion's aggregation keeps in
        /// the CPU's caches and folds for less than moving every row to the
        /// device costs: such a chunk, and with it the rest of a partial
        /// aggregation's input, goes to DataFusion's, as a chunk whose keys
        /// do not pack does. A partition's first 262,144 rows are checked
        /// so before its first chunk fills: where they fail, its whole input
        /// goes to DataFusion's with no chunk held for the backend. 0 groups
        /// every chunk that packs on the backend.
        pub aggregate_min_key_values: usize, default = 1 << 16
        /// Evaluate join filters that compare columns of integer, date or
        /// time types (`a.x <> b.y AND a.z < b.z`) on the backend, on the
        /// candidate pairs where they lie. Other filters, and all of them
        /// when false, are evaluated on the host by DataFusion's expression.
        /// `EXPLAIN` shows `filter_on=backend` or `filter_on=host`.
        pub filter_on_backend: bool, default = true
        /// When matches leave in probe row order, as `HashJoinExec` emits
        /// them. `required`: only where the plan relies on it. `auto`: also
        /// for small probe chunks, where it costs nothing measurable, so that
        /// small results (a LIMIT without ORDER BY among them) come out as
        /// DataFusion's, and for chunks whose probe columns are taken on the
        /// host, which then reads them in order. `always`: for every chunk,
        /// at the cost of unclustered gathers on large joins.
        pub keep_probe_order: ProbeOrderChoice, default = ProbeOrderChoice::Auto
        /// GPU jobs (loading or joining a probe chunk, preparing a build
        /// side) that run on the device at once, over every partition and
        /// query of the process. Further jobs wait without holding a thread;
        /// a job retried after running out of memory runs alone. A job holds
        /// its place while it works on the device, not while it takes output
        /// columns on the host.
        pub concurrent_tasks: usize, default = 16
        /// Which placement decisions the rule logs (at `info`, target
        /// `datafusion_gpu_join`): `none`, `not_on_gpu` (the joins that stay
        /// on DataFusion's operator, with the reason) or `all`.
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
    use std::fmt::Write;
    use std::path::Path;

    use datafusion::common::config::ExtensionOptions;

    use super::*;

    const TABLE_BEGIN: &str = "<!-- options: generated from the doc comments in src/config.rs -->";
    const TABLE_END: &str = "<!-- end of options -->";

    /// The table of options, one row each, from their doc comments.
    fn options_table() -> String {
        let mut table = String::from("| option | default | description |\n| --- | --- | --- |\n");
        for entry in GpuJoinConfig::default().entries() {
            let key = &entry.key;
            let description = entry.description.split_whitespace().collect::<Vec<_>>().join(" ");
            let default = entry.value.unwrap_or_default();
            let _ = writeln!(table, "| `gpu_join.{key}` | `{default}` | {} |", description.replace('|', "\\|"));
        }
        table
    }

    /// `docs/configuration.md` holds the table the doc comments give;
    /// `GPU_JOIN_UPDATE_CONFIG_DOCS=1 cargo test --lib configuration_docs`
    /// writes it again.
    #[test]
    fn configuration_docs_are_current() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md");
        let text = std::fs::read_to_string(&path).expect("docs/configuration.md is readable");
        let (before, rest) = text.split_once(TABLE_BEGIN).expect("docs/configuration.md marks where its table begins");
        let (_, after) = rest.split_once(TABLE_END).expect("docs/configuration.md marks where its table ends");
        let current = format!("{before}{TABLE_BEGIN}\n{}{TABLE_END}{after}", options_table());
        if std::env::var_os("GPU_JOIN_UPDATE_CONFIG_DOCS").is_some() {
            std::fs::write(&path, &current).expect("docs/configuration.md is writable");
        } else {
            assert!(
                text == current,
                "docs/configuration.md is stale: run `GPU_JOIN_UPDATE_CONFIG_DOCS=1 cargo test --lib configuration_docs`"
            );
        }
    }

    #[test]
    fn testing_hooks_are_no_options() {
        let keys: Vec<String> = GpuJoinConfig::default().entries().into_iter().map(|e| e.key).collect();
        assert!(keys.iter().all(|key| !key.contains("inject")), "{keys:?}");
    }

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

    #[test]
    fn device_lists_parse_and_name_their_ordinals() {
        assert_eq!("one".parse::<DeviceList>().unwrap().ordinals(3, || 8), vec![3]);
        assert_eq!(" ALL ".parse::<DeviceList>().unwrap().ordinals(3, || 2), vec![0, 1]);
        assert_eq!("all".parse::<DeviceList>().unwrap().ordinals(0, || 0), vec![0]);
        assert_eq!("1, 0,1".parse::<DeviceList>().unwrap().ordinals(0, || 2), vec![1, 0, 1]);
        for text in ["one", "all", "0,0", "2,1"] {
            assert_eq!(text.parse::<DeviceList>().unwrap().to_string(), text);
        }
        for bad in ["", "0,,1", "-1", "gpu0", "0;1"] {
            let err = bad.parse::<DeviceList>().unwrap_err().to_string();
            assert!(err.contains("gpu_join.devices") && err.contains("'0,1'"), "{bad}: {err}");
        }
    }
}
