//! Transform phase on the GPU: stable radix partitioning and radix sorting
//! (over the key bits in use), both as sequences of stable radix passes of
//! up to 8 bits, carrying payload columns and row ids along. The digits of
//! every pass are counted up front; each pass is then one kernel whose
//! tiles find their output offsets by decoupled look-back (see radix.cu).

use std::sync::Arc;

use datafusion::common::exec_err;
use datafusion::error::Result;

use super::column::CudaColumn;
use super::launch::{Arg, CudaBackend};
use super::memory::DeviceBuffer;
use crate::backend::{Layout, MAX_RELATION_ROWS, PartitionSpec, SortSpec, Transformed, radix_pass_count};
use crate::keys::NormalizedKey;

/// Items per tile of the radix kernels (BLOCK x TILE_ITEMS in radix.cu).
const TILE: usize = 256 * 16;
/// Digits of one radix pass (8 bits).
const MAX_DIGITS: usize = 256;
/// Passes whose digits one read of the keys counts (COUNTED_PASSES in radix.cu).
const COUNTED_PASSES: usize = 4;
/// Blocks of the digit count kernel: enough to fill the device, few enough
/// that their global atomics stay cheap.
const COUNT_BLOCKS: usize = 1024;
/// Tells the radix kernels to take digits of the key rather than of its
/// partition id (SORT_BY_KEY in common.cuh).
const SORT_BY_KEY: u32 = u32::MAX;

/// What the digits of the radix passes are taken from.
#[derive(Debug, Clone, Copy)]
pub(super) enum Digits {
    /// The partition id: `bits` partition bits plus the unmatchable partition.
    Partition(PartitionSpec),
    /// The low bits of the key that the sort orders by.
    Key(SortSpec),
}

impl Digits {
    fn partition_bits(&self) -> u32 {
        match self {
            Digits::Partition(spec) => spec.bits,
            Digits::Key(_) => SORT_BY_KEY,
        }
    }

    /// (shift, digit mask) of every pass, least significant first: as few
    /// passes as 8-bit digits allow, the bits spread evenly over them, since
    /// fewer digits per pass make longer runs to write.
    fn passes(&self) -> Vec<(u32, u32)> {
        let total = match self {
            Digits::Partition(spec) => spec.digit_bits(),
            Digits::Key(spec) => spec.digit_bits(),
        };
        let count = radix_pass_count(total);
        let per_pass = total.div_ceil(count);
        (0..count)
            .map(|pass| {
                let shift = pass * per_pass;
                (shift, (1u32 << per_pass.min(total - shift)) - 1)
            })
            .collect()
    }
}

/// Transformed keys, the moved columns in order, and the row ids if asked.
pub(super) type RadixOutput<K> = (DeviceBuffer<K>, Vec<DeviceBuffer<u8>>, Option<DeviceBuffer<u32>>);

/// A column moved by the passes: its current buffer and the element width.
struct Moving {
    buffer: DeviceBuffer<u8>,
    width: usize,
}

impl CudaBackend {
    pub(super) fn kernel_name<K: NormalizedKey>(&self, base: &str) -> String {
        format!("{base}_u{}", K::BITS)
    }

    /// Stable radix transform of `keys`; `columns` are (pointer, width) pairs
    /// moved along. Returns the transformed keys, the moved columns in the
    /// same order, and the row ids (original row of each position) if asked.
    pub(super) fn radix_transform<K: NormalizedKey>(
        &self,
        keys: &DeviceBuffer<K>,
        columns: &[(u64, usize)],
        with_row_ids: bool,
        digits: Digits,
    ) -> Result<RadixOutput<K>> {
        let n = keys.len();
        if n > MAX_RELATION_ROWS {
            return exec_err!(
                "radix transform: {n} rows exceed the {MAX_RELATION_ROWS} rows one relation may have; \
                 lower gpu_join.probe_chunk_rows"
            );
        }
        let what = "a radix transform";
        let tiles = n.div_ceil(TILE).max(1);
        let passes = digits.passes();
        let digit_counts = self.count_digits(keys, digits, &passes)?;
        // The tiles' published digit counts, then the next tile to take.
        let mut statuses = DeviceBuffer::<u64>::alloc(&self.instance, tiles * MAX_DIGITS + 1, what)?;
        let mut current_keys: Option<DeviceBuffer<K>> = None;
        let mut moving: Vec<Moving> = vec![];
        let mut row_ids: Option<DeviceBuffer<u32>> = None;
        for (pass, &(shift, digit_mask)) in passes.iter().enumerate() {
            let keys_in = current_keys.as_ref().unwrap_or(keys);
            statuses.fill(0, what)?;
            let next_tile = statuses.pointer() + (tiles * MAX_DIGITS * size_of::<u64>()) as u64;
            let pass_counts = digit_counts.pointer() + (pass * MAX_DIGITS * size_of::<u32>()) as u64;
            let keys_out = DeviceBuffer::<K>::alloc(&self.instance, n, what)?;
            // The first pass reads the caller's columns; later ones the last outputs.
            let sources: Vec<(u64, usize)> = if pass == 0 {
                columns.to_vec()
            } else {
                moving.iter().map(|m| (m.buffer.pointer(), m.width)).collect()
            };
            let row_id_source = row_ids.as_ref().map(|r| r.pointer());
            let mut outputs: Vec<Moving> = vec![];
            let mut descriptors: Vec<u64> = vec![];
            for (source, width) in sources.iter().copied().chain(row_id_source.map(|r| (r, 4))) {
                let buffer = DeviceBuffer::<u8>::alloc(&self.instance, n * width, what)?;
                descriptors.extend([source, buffer.pointer(), width as u64]);
                outputs.push(Moving { buffer, width });
            }
            let generated = match (pass, with_row_ids) {
                (0, true) => Some(DeviceBuffer::<u32>::alloc(&self.instance, n, what)?),
                _ => None,
            };
            let descriptor_buffer = DeviceBuffer::upload(&self.instance, &descriptors, what)?;
            let args = [
                Arg::from(keys_in.pointer()),
                keys_out.pointer().into(),
                (n as u64).into(),
                digits.partition_bits().into(),
                shift.into(),
                digit_mask.into(),
                pass_counts.into(),
                next_tile.into(),
                statuses.pointer().into(),
                descriptor_buffer.pointer().into(),
                (outputs.len() as u32).into(),
                generated.as_ref().map_or(0, |g| g.pointer()).into(),
            ];
            self.launch_blocks(&self.kernel_name::<K>("radix_scatter"), tiles as u64, 0, n as u64, &args)?;
            if row_id_source.is_some() {
                let moved_ids = outputs.pop().map(|m| m.buffer);
                row_ids = moved_ids.map(|b| b.into_typed::<u32>(n));
            } else if generated.is_some() {
                row_ids = generated;
            }
            moving = outputs;
            current_keys = Some(keys_out);
        }
        let keys = match current_keys {
            Some(keys) => keys,
            None => return exec_err!("radix transform without passes"),
        };
        Ok((keys, moving.into_iter().map(|m| m.buffer).collect(), row_ids))
    }

    /// Every pass's digit counts over the whole relation, `MAX_DIGITS` per
    /// pass, counted [`COUNTED_PASSES`] passes per read of the keys.
    fn count_digits<K: NormalizedKey>(
        &self,
        keys: &DeviceBuffer<K>,
        digits: Digits,
        passes: &[(u32, u32)],
    ) -> Result<DeviceBuffer<u32>> {
        let counts = DeviceBuffer::<u32>::filled(&self.instance, passes.len() * MAX_DIGITS, 0, "radix digit counts")?;
        let n = keys.len();
        let blocks = n.div_ceil(TILE).clamp(1, COUNT_BLOCKS);
        for (first, counted) in passes.chunks(COUNTED_PASSES).enumerate() {
            // Each pass as its shift in the high half and its mask in the low.
            let plan = |p: usize| counted.get(p).map_or(0, |&(shift, mask)| (shift << 16) | mask);
            let offset = (first * COUNTED_PASSES * MAX_DIGITS * size_of::<u32>()) as u64;
            let args = [
                Arg::from(keys.pointer()),
                (n as u64).into(),
                digits.partition_bits().into(),
                plan(0).into(),
                plan(1).into(),
                plan(2).into(),
                plan(3).into(),
                (counted.len() as u32).into(),
                (counts.pointer() + offset).into(),
            ];
            self.launch_blocks(&self.kernel_name::<K>("radix_digit_counts"), blocks as u64, 0, n as u64, &args)?;
        }
        Ok(counts)
    }

    /// Partitions or sorts `keys` with payload columns and returns the
    /// transformed relation.
    pub(super) fn transform<K: NormalizedKey>(
        &self,
        keys: &DeviceBuffer<K>,
        payloads: &[&CudaColumn],
        with_row_ids: bool,
        digits: Digits,
    ) -> Result<Transformed<CudaBackend, K>> {
        let mut columns: Vec<(u64, usize)> = vec![];
        for payload in payloads {
            columns.push((payload.values.pointer(), payload.width));
            if let Some(validity) = &payload.validity {
                columns.push((validity.pointer(), 1));
            }
        }
        let (transformed_keys, mut moved, row_ids) = self.radix_transform(keys, &columns, with_row_ids, digits)?;
        let mut moved = moved.drain(..);
        let mut transformed_payloads = vec![];
        for payload in payloads {
            let values = moved.next();
            let validity = match payload.validity {
                Some(_) => moved.next(),
                None => None,
            };
            let values =
                values.ok_or_else(|| datafusion::common::internal_datafusion_err!("a moved column is missing"))?;
            transformed_payloads.push(CudaColumn {
                data_type: payload.data_type.clone(),
                len: payload.len,
                width: payload.width,
                values: Arc::new(values),
                validity: validity.map(Arc::new),
            });
        }
        let (layout, offsets) = match digits {
            Digits::Partition(spec) => {
                let offsets = DeviceBuffer::<u32>::alloc(&self.instance, spec.partitions() + 2, "partition offsets")?;
                let args = [
                    Arg::from(transformed_keys.pointer()),
                    (keys.len() as u64).into(),
                    spec.bits.into(),
                    offsets.pointer().into(),
                ];
                self.launch(&self.kernel_name::<K>("partition_offsets"), spec.partitions() as u64 + 2, 0, &args)?;
                (Layout::Partitioned(spec), offsets)
            }
            Digits::Key(spec) => {
                let offsets = DeviceBuffer::<u32>::alloc(&self.instance, 3, "sorted offsets")?;
                let args =
                    [Arg::from(transformed_keys.pointer()), (keys.len() as u64).into(), offsets.pointer().into()];
                self.launch(&self.kernel_name::<K>("sorted_offsets"), 1, 0, &args)?;
                (Layout::Sorted(spec), offsets)
            }
        };
        Ok(Transformed {
            keys: transformed_keys,
            row_ids,
            payloads: transformed_payloads,
            offsets,
            layout,
            rows: keys.len(),
            hash_tables: None,
            directory: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_cover_every_digit_bit_in_as_few_even_passes_as_possible() {
        let partition = |bits| Digits::Partition(PartitionSpec { bits });
        let key = |key_bits| Digits::Key(SortSpec { key_bits });
        // 15 partition bits plus the unmatchable partition: 16 bits.
        assert_eq!(partition(15).passes(), vec![(0, 0xFF), (8, 0xFF)]);
        // 3 bits plus the unmatchable partition: one pass of 4 bits.
        assert_eq!(partition(3).passes(), vec![(0, 0xF)]);
        assert_eq!(partition(8).passes(), vec![(0, 0x1F), (5, 0xF)]);
        assert_eq!(key(32).passes(), vec![(0, 0xFF), (8, 0xFF), (16, 0xFF), (24, 0xFF)]);
        assert_eq!(key(28).passes(), vec![(0, 0x7F), (7, 0x7F), (14, 0x7F), (21, 0x7F)]);
        assert_eq!(key(24).passes().len(), 3);
        assert_eq!(key(1).passes(), vec![(0, 0x1)]);
        assert_eq!(key(64).passes().len(), 8);
    }
}
