//! The grouping primitive's terms: what an aggregation keeps per group
//! ([`Reduction`]) and what the backend hands back ([`Groups`]).
//!
//! Rows with equal normalised keys form a group; each reduction folds the
//! values of one column (or counts rows) per group. Values are signed
//! integers of 4, 8 or 16 bytes as Arrow lays them out: integers, dates,
//! times and decimals, whose sums DataFusion also wraps on overflow.

use arrow::buffer::{Buffer, NullBuffer};
use datafusion::common::internal_err;
use datafusion::error::Result;

/// Bytes of one signed integer value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IntegerWidth {
    Four,
    Eight,
    Sixteen,
}

impl IntegerWidth {
    pub fn bytes(self) -> usize {
        match self {
            IntegerWidth::Four => 4,
            IntegerWidth::Eight => 8,
            IntegerWidth::Sixteen => 16,
        }
    }

    /// The width of values of `bytes` bytes, where it is one of the three.
    pub fn of_bytes(bytes: usize) -> Option<Self> {
        match bytes {
            4 => Some(IntegerWidth::Four),
            8 => Some(IntegerWidth::Eight),
            16 => Some(IntegerWidth::Sixteen),
            _ => None,
        }
    }
}

/// What one output column of an aggregation keeps per group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reduction {
    /// The rows whose value is not null; every row where no column is
    /// given (`COUNT(*)`). One `u64` per group.
    Count,
    /// The wrapping sum of the non-null values, 8 or 16 bytes wide, in the
    /// values' width; null for a group without one.
    Sum(IntegerWidth),
    /// The least non-null value, in the values' width; null for a group
    /// without one. 16-byte values must lie within the 8-byte range
    /// (decimals of up to 18 digits), which the caller checks from the
    /// column's type.
    Min(IntegerWidth),
    /// The greatest non-null value, as [`Reduction::Min`].
    Max(IntegerWidth),
}

impl Reduction {
    /// Bytes per group of its output.
    pub fn output_bytes(self) -> usize {
        match self {
            Reduction::Count => 8,
            Reduction::Sum(width) | Reduction::Min(width) | Reduction::Max(width) => width.bytes(),
        }
    }

    /// Whether the reduction reads a column whose values are `bytes`
    /// bytes wide (`None`: not fixed-width), or no column at all.
    pub fn reads(self, column: Option<Option<usize>>) -> bool {
        match (self, column) {
            (Reduction::Count, _) => true,
            (Reduction::Sum(IntegerWidth::Four), _) => false,
            (Reduction::Sum(width) | Reduction::Min(width) | Reduction::Max(width), Some(Some(bytes))) => {
                width.bytes() == bytes
            }
            (_, _) => false,
        }
    }
}

/// One reduction's output: a value per group, in group order.
#[derive(Debug, Clone)]
pub struct Reduced {
    /// [`Reduction::output_bytes`] bytes per group, little-endian.
    pub values: Buffer,
    /// Which groups have a value; `None` where all do.
    pub nulls: Option<NullBuffer>,
}

/// Rows grouped by key, and their reductions.
#[derive(Debug, Clone)]
pub struct Groups {
    /// A row of each group, whose key columns are the group's.
    pub rows: Vec<u32>,
    /// One per reduction asked for, in that order.
    pub reduced: Vec<Reduced>,
}

impl Groups {
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// A reduction's column as [`check_grouped`] sees it: the bytes of its
/// values (`None`: not fixed-width) and its rows.
pub(crate) type ColumnShape = Option<(Option<usize>, usize)>;

/// Checks a grouping's arguments, given as the rows of the keys and, per
/// reduction, the value width (`None`: not fixed-width) and rows of its
/// column, if it has one.
pub(crate) fn check_grouped(rows: usize, reductions: &[(Reduction, ColumnShape)]) -> Result<()> {
    if rows > super::MAX_RELATION_ROWS {
        return internal_err!("group_rows: {rows} rows, more than {} at once", super::MAX_RELATION_ROWS);
    }
    for (reduction, column) in reductions {
        if let Some((_, len)) = column.filter(|(_, len)| *len != rows) {
            return internal_err!("group_rows: a column of {len} rows for {rows} keys");
        }
        if !reduction.reads(column.map(|(bytes, _)| bytes)) {
            return internal_err!("group_rows: {reduction:?} cannot read {column:?} (value bytes, rows)");
        }
    }
    Ok(())
}

/// The null buffer of groups whose flag in `seen` is set; `None` where
/// every group's is.
pub(crate) fn seen_groups(seen: impl IntoIterator<Item = bool>) -> Option<NullBuffer> {
    Some(NullBuffer::from_iter(seen)).filter(|nulls| nulls.null_count() > 0)
}
