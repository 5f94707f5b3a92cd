//! Prefix sums, stream compaction, flags and permutations on the GPU.

use datafusion::common::internal_err;
use datafusion::error::Result;

use super::launch::{Arg, CudaBackend};
use super::memory::DeviceBuffer;

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

    /// `out[positions[i]] = values[i]` when `positions` is a permutation of
    /// `0..len`. Unless their writer knows they are, one bit per position
    /// records which were written, and a word after the bits is set on a
    /// position met twice or out of range, so that one read back tells
    /// whether every position was written once.
    pub(super) fn scatter_if_permutation(
        &self,
        positions: &DeviceBuffer<u32>,
        values: &DeviceBuffer<u32>,
        len: usize,
    ) -> Result<Option<DeviceBuffer<u32>>> {
        if positions.len() != values.len() {
            return internal_err!("scatter_permutation: {} positions for {} values", positions.len(), values.len());
        }
        if positions.len() != len {
            return Ok(None);
        }
        let words = len.div_ceil(32);
        let seen = match positions.holds_each_once() {
            true => None,
            false => {
                Some(DeviceBuffer::<u32>::filled(&self.instance, words + 1, 0, "a permutation's written positions")?)
            }
        };
        let out = DeviceBuffer::<u32>::alloc(&self.instance, len, "permuted positions")?;
        let n = len as u64;
        let seen_at = seen.as_ref().map_or(0, DeviceBuffer::pointer);
        let args =
            [positions.pointer().into(), values.pointer().into(), n.into(), seen_at.into(), out.pointer().into()];
        self.launch("scatter_permutation", n, 0, &args)?;
        let Some(seen) = seen else {
            return Ok(Some(out));
        };
        let clash = seen.download_at(words, "whether positions form a permutation")?;
        Ok((clash == 0).then_some(out))
    }
}
