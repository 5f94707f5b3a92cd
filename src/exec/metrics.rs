//! What `EXPLAIN ANALYZE` shows for a GPU join, per output partition.

use std::sync::Arc;
use std::time::Duration;

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
    /// Each device's share, in the order of the join's devices, where it
    /// spreads over several; none otherwise.
    device_shares: Arc<[DeviceShare]>,
    /// The device the partition runs on, among them; passes of a build
    /// side split over the devices are joined on the others.
    home: usize,
    /// Output rows and time credited to devices other than `home`, which
    /// gets the rest when the partition ends.
    credited_elsewhere: (Count, Time),
}

/// What one device did for the partitions it served, named after its
/// ordinal (`device1_output_rows`, …), so that `EXPLAIN ANALYZE` shows each
/// device's part beside the join's totals.
#[derive(Debug, Clone)]
struct DeviceShare {
    output_rows: Count,
    bytes_moved: Count,
    time: Time,
    peak_memory: Gauge,
    /// Build rows prepared on the device: all of them on each device that
    /// holds a whole copy, its passes' where the build side is split over
    /// the devices.
    build_rows: Count,
}

impl DeviceShare {
    fn new(metrics: &ExecutionPlanMetricsSet, partition: usize, ordinal: usize) -> Self {
        let named = |what: &str| format!("device{ordinal}_{what}");
        Self {
            output_rows: MetricBuilder::new(metrics).counter(named("output_rows"), partition),
            bytes_moved: MetricBuilder::new(metrics).counter(named("bytes_moved"), partition),
            time: MetricBuilder::new(metrics).subset_time(named("time"), partition),
            peak_memory: MetricBuilder::new(metrics).gauge(named("peak_memory"), partition),
            build_rows: MetricBuilder::new(metrics).counter(named("build_rows"), partition),
        }
    }
}

impl GpuJoinMetrics {
    /// The metrics of partition `partition` of a join over the devices of
    /// ordinals `devices`, which runs on the `home`-th of them.
    pub fn new(metrics: &ExecutionPlanMetricsSet, partition: usize, devices: &[usize], home: usize) -> Self {
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
            device_shares: match devices.len() {
                0 | 1 => Arc::new([]),
                _ => devices.iter().map(|&ordinal| DeviceShare::new(metrics, partition, ordinal)).collect(),
            },
            home,
            credited_elsewhere: (Count::new(), Time::new()),
        }
    }

    /// Adds what the backend counted on the partition's own device.
    pub fn record_device(&self, counters: &DeviceCounters) {
        self.record_device_on(self.home, counters);
    }

    /// Adds what the backend counted on the `device`-th of the join's
    /// devices while serving this partition.
    pub fn record_device_on(&self, device: usize, counters: &DeviceCounters) {
        self.bytes_to_device.add(counters.bytes_to_device() as usize);
        self.bytes_from_device.add(counters.bytes_from_device() as usize);
        self.peak_device_memory.set_max(counters.peak() as usize);
        if let Some(share) = self.device_shares.get(device) {
            share.bytes_moved.add((counters.bytes_to_device() + counters.bytes_from_device()) as usize);
            share.peak_memory.set_max(counters.peak() as usize);
        }
    }

    /// `rows` build rows were prepared on the `device`-th device.
    pub fn built_on(&self, device: usize, rows: usize) {
        if let Some(share) = self.device_shares.get(device) {
            share.build_rows.add(rows);
        }
    }

    /// Credits output rows and time of this partition to the `device`-th
    /// device, which joined them, rather than to the partition's own.
    pub fn credit(&self, device: usize, rows: usize, time: Duration) {
        if device == self.home {
            return;
        }
        if let Some(share) = self.device_shares.get(device) {
            share.output_rows.add(rows);
            share.time.add_duration(time);
            self.credited_elsewhere.0.add(rows);
            self.credited_elsewhere.1.add_duration(time);
        }
    }

    /// Ends the partition: its output rows and time not credited to other
    /// devices added to its own device's share.
    pub fn done(&self) {
        self.baseline.done();
        if let Some(share) = self.device_shares.get(self.home) {
            let (rows, time) = (&self.credited_elsewhere.0, &self.credited_elsewhere.1);
            share.output_rows.add(self.baseline.output_rows().value().saturating_sub(rows.value()));
            let own = self.baseline.elapsed_compute().value().saturating_sub(time.value());
            share.time.add_duration(Duration::from_nanos(own as u64));
        }
    }
}
