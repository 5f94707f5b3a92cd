//! The grouping primitive in plain Rust: a hash map from key to group, in
//! the order groups first appear, and one fold per reduction.

use std::collections::HashMap;

use arrow::array::{Array, ArrayRef};
use arrow::buffer::{Buffer, ScalarBuffer};
use datafusion::common::internal_err;
use datafusion::error::Result;

use crate::backend::grouping::{check_grouped, seen_groups};
use crate::backend::{Groups, IntegerWidth, Reduced, Reduction};
use crate::keys::NormalizedKey;
use crate::values::value_width;

/// Groups `keys` and folds each reduction's column per group.
pub(super) fn group_rows<K: NormalizedKey>(
    keys: &[K],
    reductions: &[(Reduction, Option<&ArrayRef>)],
) -> Result<Groups> {
    let shapes: Vec<_> =
        reductions.iter().map(|(r, c)| (*r, c.map(|c| (value_width(c.data_type()), c.len())))).collect();
    check_grouped(keys.len(), &shapes)?;
    let mut group_of = HashMap::with_capacity(keys.len().min(1 << 20));
    let mut rows = vec![];
    let groups: Vec<u32> = keys
        .iter()
        .enumerate()
        .map(|(row, key)| {
            *group_of.entry(*key).or_insert_with(|| {
                rows.push(row as u32);
                (rows.len() - 1) as u32
            })
        })
        .collect();
    let reduced = reductions
        .iter()
        .map(|(reduction, column)| reduce(*reduction, column.map(|c| c.as_ref()), &groups, rows.len()))
        .collect::<Result<_>>()?;
    Ok(Groups { rows, reduced })
}

/// One reduction's value per group.
fn reduce(reduction: Reduction, column: Option<&dyn Array>, groups: &[u32], count: usize) -> Result<Reduced> {
    let valid = |row: usize| column.is_none_or(|c| c.is_valid(row));
    let Some(column) = column.filter(|_| reduction != Reduction::Count) else {
        let mut counts = vec![0u64; count];
        for (row, group) in groups.iter().enumerate() {
            counts[*group as usize] += u64::from(valid(row));
        }
        return Ok(Reduced { values: Buffer::from_vec(counts), nulls: None });
    };
    let width = match reduction {
        Reduction::Sum(width) | Reduction::Min(width) | Reduction::Max(width) => width,
        Reduction::Count => return internal_err!("a count has no values to fold"),
    };
    let mut seen = vec![false; count];
    let values = match width {
        IntegerWidth::Four => Buffer::from_vec(fold::<i32>(reduction, column, groups, &mut seen)),
        IntegerWidth::Eight => Buffer::from_vec(fold::<i64>(reduction, column, groups, &mut seen)),
        IntegerWidth::Sixteen => Buffer::from_vec(fold::<i128>(reduction, column, groups, &mut seen)),
    };
    Ok(Reduced { values, nulls: seen_groups(seen) })
}

/// Signed integers that a reduction folds.
trait Folded: arrow::datatypes::ArrowNativeType + Ord {
    fn wrapping_sum(self, other: Self) -> Self;
}

impl Folded for i32 {
    fn wrapping_sum(self, other: Self) -> Self {
        self.wrapping_add(other)
    }
}

impl Folded for i64 {
    fn wrapping_sum(self, other: Self) -> Self {
        self.wrapping_add(other)
    }
}

impl Folded for i128 {
    fn wrapping_sum(self, other: Self) -> Self {
        self.wrapping_add(other)
    }
}

fn fold<T: Folded>(reduction: Reduction, column: &dyn Array, groups: &[u32], seen: &mut [bool]) -> Vec<T> {
    let data = column.to_data();
    let values = ScalarBuffer::<T>::new(data.buffers()[0].clone(), data.offset(), data.len());
    let mut out = vec![T::default(); seen.len()];
    for (row, group) in groups.iter().enumerate().filter(|(row, _)| column.is_valid(*row)) {
        let (slot, value, first) = (&mut out[*group as usize], values[row], !seen[*group as usize]);
        *slot = match (reduction, first) {
            (_, true) => value,
            (Reduction::Min(_), false) => (*slot).min(value),
            (Reduction::Max(_), false) => (*slot).max(value),
            (_, false) => slot.wrapping_sum(value),
        };
        seen[*group as usize] = true;
    }
    out
}
