//! What `EXPLAIN ANALYZE` shows for a GPU join, per output partition.

use datafusion::physical_plan::metrics::{BaselineMetrics, Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, Time};

use crate::algorithms::PhaseTimers;
use crate::backend::DeviceCounters;

#[derive(Debug, Clone)]
pub(crate) struct GpuJoinMetrics {
    pub baseline: BaselineMetrics,
    pub build_rows: Count,
    pub probe_rows: Count,
    /// Input rows dropped before the join by the dynamic filters of joins
    /// above (`filters_from_above`); not in `build_rows` or `probe_rows`.
    pub rows_filtered_from_above: Count,
    /// Collecting the build side from its input and assembling it on the
    /// host, before the transform; counted in the partition that collected
    /// it.
    pub build_collect_time: Time,
    /// Preparing the collected build side on the device (keys encoded,
    /// uploads, transform), in the task that places it; counted in the
    /// partition that collected it.
    pub build_prepare_time: Time,
    /// Assembling DataFusion's probe batches into chunks on the host.
    pub probe_staging_time: Time,
    /// Probe chunks whose output columns stayed on the host, taken there
    /// for the output rows only (see `gpu_join.probe_device_gather_ratio`).
    pub probe_chunks_on_host: Count,
    /// Probe chunks each of whose rows matched exactly once, whose own
    /// columns were handed on as they came: nothing of them was moved to
    /// the device or gathered.
    pub probe_chunks_passed_through: Count,
    /// Waiting for the device's admission.
    pub admission_wait_time: Time,
    /// Passes the build side was split into (0 when it fit at once).
    pub build_passes: Count,
    /// Passes prepared on the device: more than `build_passes` when a pass
    /// was evicted for another and needed again.
    pub build_pass_loads: Count,
    /// Device work done again after the device ran out of memory: alone
    /// on the device, in smaller pieces, or, for a build side, in passes.
    pub out_of_memory_retries: Count,
    /// Hash tables DataFusion's operator built over a build side's host
    /// copy, for probe pieces the device could not take: one per build side
    /// at most, however many pieces.
    pub host_fallback_tables: Count,
    pub phases: PhaseTimers,
    pub bytes_to_device: Count,
    pub bytes_from_device: Count,
    pub peak_device_memory: Gauge,
    /// The device's share, where the join spreads over several.
    device_share: Option<DeviceShare>,
}

/// What one device did for the partitions it ran, named after its
/// ordinal (`device1_output_rows`, …), so that `EXPLAIN ANALYZE` shows each
/// device's part beside the join's totals.
#[derive(Debug, Clone)]
struct DeviceShare {
    output_rows: Count,
    bytes_moved: Count,
    time: Time,
    peak_memory: Gauge,
}

impl GpuJoinMetrics {
    /// The metrics of partition `partition`, which runs on the device of
    /// ordinal `device` where the join spreads over several.
    pub fn new(metrics: &ExecutionPlanMetricsSet, partition: usize, device: Option<usize>) -> Self {
        let time = |name: &'static str| MetricBuilder::new(metrics).subset_time(name, partition);
        let count = |name: &'static str| MetricBuilder::new(metrics).counter(name, partition);
        Self {
            baseline: BaselineMetrics::new(metrics, partition),
            build_rows: count("build_rows"),
            probe_rows: count("probe_rows"),
            rows_filtered_from_above: count("rows_filtered_from_above"),
            build_collect_time: time("build_collect_time"),
            build_prepare_time: time("build_prepare_time"),
            probe_staging_time: time("probe_staging_time"),
            probe_chunks_on_host: count("probe_chunks_on_host"),
            probe_chunks_passed_through: count("probe_chunks_passed_through"),
            admission_wait_time: time("admission_wait_time"),
            build_passes: count("build_passes"),
            build_pass_loads: count("build_pass_loads"),
            out_of_memory_retries: count("out_of_memory_retries"),
            host_fallback_tables: count("host_fallback_tables"),
            phases: PhaseTimers {
                transform: time("transform_time"),
                matching: time("match_time"),
                materialize: time("materialize_time"),
            },
            bytes_to_device: count("bytes_to_device"),
            bytes_from_device: count("bytes_from_device"),
            peak_device_memory: MetricBuilder::new(metrics).gauge("peak_device_memory", partition),
            device_share: device.map(|ordinal| DeviceShare {
                output_rows: MetricBuilder::new(metrics).counter(format!("device{ordinal}_output_rows"), partition),
                bytes_moved: MetricBuilder::new(metrics).counter(format!("device{ordinal}_bytes_moved"), partition),
                time: MetricBuilder::new(metrics).subset_time(format!("device{ordinal}_time"), partition),
                peak_memory: MetricBuilder::new(metrics).gauge(format!("device{ordinal}_peak_memory"), partition),
            }),
        }
    }

    /// Adds what the backend counted while serving this partition.
    pub fn record_device(&self, counters: &DeviceCounters) {
        self.bytes_to_device.add(counters.bytes_to_device() as usize);
        self.bytes_from_device.add(counters.bytes_from_device() as usize);
        self.peak_device_memory.set_max(counters.peak() as usize);
        if let Some(share) = &self.device_share {
            share.bytes_moved.add((counters.bytes_to_device() + counters.bytes_from_device()) as usize);
            share.peak_memory.set_max(counters.peak() as usize);
        }
    }

    /// Ends the partition: its output rows and time added to its device's
    /// share.
    pub fn done(&self) {
        self.baseline.done();
        if let Some(share) = &self.device_share {
            share.output_rows.add(self.baseline.output_rows().value());
            share.time.add_duration(std::time::Duration::from_nanos(self.baseline.elapsed_compute().value() as u64));
        }
    }
}
