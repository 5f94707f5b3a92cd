//! The grouping primitive on the GPU (kernels in `group.cu`): keys into an
//! open-addressing table, slots numbered densely, values folded with
//! atomics per group.

use arrow::buffer::{Buffer, MutableBuffer};
use datafusion::common::internal_err;
use datafusion::error::Result;

use super::column::CudaColumn;
use super::launch::{Arg, CudaBackend};
use super::memory::DeviceBuffer;
use crate::backend::grouping::{check_grouped, seen_groups};
use crate::backend::{Groups, IntegerWidth, Reduced, Reduction};
use crate::keys::NormalizedKey;

/// A row's group, and the row standing for each group.
struct Grouped {
    row_groups: DeviceBuffer<u32>,
    group_rows: DeviceBuffer<u32>,
}

impl CudaBackend {
    pub(super) fn group_keys<K: NormalizedKey>(
        &self,
        keys: &DeviceBuffer<K>,
        reductions: &[(Reduction, Option<&CudaColumn>)],
    ) -> Result<Groups> {
        let rows = keys.len();
        let shapes: Vec<_> = reductions.iter().map(|(r, c)| (*r, c.map(|c| (Some(c.width), c.len)))).collect();
        check_grouped(rows, &shapes)?;
        let grouped = self.assign_groups(keys)?;
        let groups = grouped.group_rows.len();
        let reduced = reductions
            .iter()
            .map(|(reduction, column)| self.reduce(*reduction, *column, &grouped.row_groups, groups))
            .collect::<Result<Vec<_>>>()?;
        let group_rows = grouped.group_rows.download("the rows of groups")?;
        Ok(Groups { rows: group_rows, reduced })
    }

    /// Each row's group and a row of each group.
    fn assign_groups<K: NormalizedKey>(&self, keys: &DeviceBuffer<K>) -> Result<Grouped> {
        let rows = keys.len();
        let slots = (2 * rows).max(2).next_power_of_two();
        let suffix = if K::BITS == 32 { "u32" } else { "u64" };
        let slot_keys = DeviceBuffer::<K>::filled(&self.instance, slots, 0xFF, "a grouping table")?;
        let slot_rows = DeviceBuffer::<u32>::alloc(&self.instance, slots, "a grouping table's rows")?;
        let row_groups = DeviceBuffer::<u32>::alloc(&self.instance, rows, "the groups of rows")?;
        let (n, count, mask) = (rows as u64, slots as u64, (slots - 1) as u64);
        self.launch(
            &format!("group_insert_{suffix}"),
            n,
            0,
            &[
                keys.pointer().into(),
                n.into(),
                slot_keys.pointer().into(),
                slot_rows.pointer().into(),
                mask.into(),
                row_groups.pointer().into(),
            ],
        )?;
        let slot_groups = DeviceBuffer::<u32>::alloc(&self.instance, slots, "the groups of slots")?;
        self.launch(
            &format!("group_used_{suffix}"),
            count,
            0,
            &[slot_keys.pointer().into(), count.into(), slot_groups.pointer().into()],
        )?;
        let groups = self.exclusive_scan(&slot_groups)?.read()? as usize;
        let group_rows = DeviceBuffer::<u32>::alloc(&self.instance, groups, "the rows of groups")?;
        self.launch(
            &format!("group_rows_{suffix}"),
            count,
            0,
            &[
                slot_keys.pointer().into(),
                slot_rows.pointer().into(),
                slot_groups.pointer().into(),
                count.into(),
                group_rows.pointer().into(),
            ],
        )?;
        self.launch("group_of_rows", n, 0, &[row_groups.pointer().into(), n.into(), slot_groups.pointer().into()])?;
        Ok(Grouped { row_groups, group_rows })
    }

    /// One reduction's value per group.
    fn reduce(
        &self,
        reduction: Reduction,
        column: Option<&CudaColumn>,
        row_groups: &DeviceBuffer<u32>,
        groups: usize,
    ) -> Result<Reduced> {
        let n = row_groups.len() as u64;
        let validity = column.and_then(|c| c.validity.as_ref()).map_or(0, |v| v.pointer());
        let Some(column) = column.filter(|_| reduction != Reduction::Count) else {
            let counts = DeviceBuffer::<u64>::filled(&self.instance, groups, 0, "counts of groups")?;
            let args = [row_groups.pointer().into(), n.into(), validity.into(), counts.pointer().into()];
            self.launch("group_count", n, 0, &args)?;
            return Ok(Reduced { values: Buffer::from_vec(counts.download("counts of groups")?), nulls: None });
        };
        let what = "an aggregate's groups";
        let seen = match column.validity {
            Some(_) => Some(DeviceBuffer::<u8>::filled(&self.instance, groups, 0, what)?),
            None => None,
        };
        let seen_pointer = seen.as_ref().map_or(0, |s| s.pointer());
        let (values, width) = (column.values.pointer(), column.width);
        let words = groups * width.max(8) / 8;
        let (kernel, start, stride): (&str, u8, Option<u32>) = match reduction {
            Reduction::Sum(IntegerWidth::Eight) => ("group_sum_8", 0, None),
            Reduction::Sum(IntegerWidth::Sixteen) => ("group_sum_16", 0, None),
            Reduction::Min(IntegerWidth::Four) => ("group_min_4", 0xFF, None),
            Reduction::Max(IntegerWidth::Four) => ("group_max_4", 0, None),
            Reduction::Min(IntegerWidth::Eight) => ("group_min_8", 0xFF, Some(1)),
            Reduction::Max(IntegerWidth::Eight) => ("group_max_8", 0, Some(1)),
            Reduction::Min(IntegerWidth::Sixteen) => ("group_min_8", 0xFF, Some(2)),
            Reduction::Max(IntegerWidth::Sixteen) => ("group_max_8", 0, Some(2)),
            Reduction::Sum(IntegerWidth::Four) | Reduction::Count => {
                return internal_err!("group_rows: no kernel folds {reduction:?}");
            }
        };
        // Narrowed 16-byte minima and maxima are folded in one word each.
        let folded_words = match (reduction, stride) {
            (_, Some(2)) => groups,
            (Reduction::Min(IntegerWidth::Four) | Reduction::Max(IntegerWidth::Four), _) => groups.div_ceil(2),
            _ => words,
        };
        let out = DeviceBuffer::<u64>::filled(&self.instance, folded_words, start, what)?;
        let mut args: Vec<Arg> = vec![row_groups.pointer().into(), n.into(), values.into()];
        args.extend(stride.map(Arg::U32));
        args.extend([Arg::from(validity), Arg::from(out.pointer()), Arg::from(seen_pointer)]);
        self.launch(kernel, n, 0, &args)?;
        let mut host = MutableBuffer::from_len_zeroed(folded_words * 8);
        out.download_into(host.as_slice_mut(), what)?;
        let values = match (reduction, stride) {
            (Reduction::Sum(_), _) => Buffer::from(host),
            (_, Some(2)) => Buffer::from_iter(words_of(&host).map(|word| i128::from(signed_8(word)))),
            (_, Some(_)) => Buffer::from_iter(words_of(&host).map(signed_8)),
            _ => Buffer::from_iter(
                host.as_slice()[..groups * 4]
                    .chunks_exact(4)
                    .map(|b| (u32::from_le_bytes([b[0], b[1], b[2], b[3]]) ^ (1 << 31)) as i32),
            ),
        };
        let nulls = match seen {
            Some(seen) => seen_groups(seen.download(what)?.into_iter().map(|s| s != 0)),
            None => None,
        };
        Ok(Reduced { values, nulls })
    }
}

fn words_of(host: &MutableBuffer) -> impl Iterator<Item = u64> + '_ {
    host.as_slice().chunks_exact(8).map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
}

/// A minimum or maximum as kept on the device (sign bit flipped) to its value.
fn signed_8(word: u64) -> i64 {
    (word ^ (1 << 63)) as i64
}
