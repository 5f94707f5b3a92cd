//! Prefix sums, stream compaction and flags on the GPU.

use datafusion::error::Result;

use super::memory::DeviceBuffer;
use super::{Arg, CudaBackend};

/// Items per block of the scan and compaction kernels (BLOCK x 8).
const SCAN_TILE: usize = 256 * 8;

/// Element types the scan kernels handle.
pub(super) trait Scannable: Copy {
    const SUFFIX: &'static str;
}

impl Scannable for u32 {
    const SUFFIX: &'static str = "u32";
}

impl Scannable for u64 {
    const SUFFIX: &'static str = "u64";
}

/// The total of a prefix sum, still on the device.
pub(super) struct ScanTotal<T> {
    totals: DeviceBuffer<T>,
    index: usize,
}

impl<T: Copy> ScanTotal<T> {
    /// Reads the total back (a synchronisation point).
    pub fn read(&self) -> Result<T> {
        self.totals.download_at(self.index, "a prefix sum total")
    }
}

impl CudaBackend {
    /// Exclusive prefix sum of `data` in place.
    pub(super) fn exclusive_scan<T: Scannable>(&self, data: &DeviceBuffer<T>) -> Result<ScanTotal<T>> {
        let n = data.len();
        let blocks = n.div_ceil(SCAN_TILE).max(1);
        // One total per block, then the grand total.
        let totals = DeviceBuffer::<T>::alloc(&self.instance, blocks + 1, "scan totals")?;
        let (values, rows, sums, count) = (data.pointer(), n as u64, totals.pointer(), blocks as u32);
        let kernel = |name: &str| format!("{name}_{}", T::SUFFIX);
        self.launch_blocks(
            &kernel("scan_block_totals"),
            blocks as u64,
            0,
            rows,
            &[values.into(), rows.into(), sums.into()],
        )?;
        self.launch_blocks(&kernel("scan_totals"), 1, 0, rows, &[sums.into(), count.into()])?;
        self.launch_blocks(
            &kernel("scan_blocks"),
            blocks as u64,
            0,
            rows,
            &[values.into(), values.into(), rows.into(), sums.into()],
        )?;
        Ok(ScanTotal { totals, index: blocks })
    }

    /// `values[i]` (or `i` itself when `values` is `None`) for every `i`
    /// whose flag is `want`, in order.
    pub(super) fn compact(
        &self,
        flags: &DeviceBuffer<u8>,
        want: bool,
        values: Option<&DeviceBuffer<u32>>,
    ) -> Result<DeviceBuffer<u32>> {
        let n = flags.len();
        let blocks = n.div_ceil(SCAN_TILE).max(1);
        let counts = DeviceBuffer::<u32>::alloc(&self.instance, blocks, "compaction counts")?;
        let (flag_data, rows, wanted, count_data) =
            (flags.pointer(), n as u64, Arg::U8(u8::from(want)), counts.pointer());
        self.launch_blocks(
            "compact_count",
            blocks as u64,
            0,
            rows,
            &[flag_data.into(), rows.into(), wanted, count_data.into()],
        )?;
        let total = self.exclusive_scan(&counts)?.read()? as usize;
        let out = DeviceBuffer::<u32>::alloc(&self.instance, total, "compacted positions")?;
        let (value_data, out_data) = (values.map_or(0, |v| v.pointer()), out.pointer());
        self.launch_blocks(
            "compact_write",
            blocks as u64,
            0,
            rows,
            &[flag_data.into(), rows.into(), wanted, value_data.into(), count_data.into(), out_data.into()],
        )?;
        Ok(out)
    }
}
