//! Keys that go up as their raw bits.
//!
//! A single key column of 4-byte integers without NULLs packs into each
//! value's distance from the build side's smallest, taken in the values'
//! own width ([`super::packed`]): its raw bits less the smallest value's,
//! wrapping. So such keys can go up as they are before their span is known,
//! the span gathered in the same pass over them, and become codes on the
//! backend ([`RawCodes`], from [`super::KeyEncoder::raw_codes`]). The build
//! side's keys are then read once by the host, where gathering the span as
//! the build side is collected and encoding it afterwards read them twice,
//! the first time on the way to the device. Keys that the backend reads
//! where they lie (a table kept in its transfer memory) are not copied at
//! all, on either side: the probe side's are coded on the backend too,
//! values outside the build side's span as the unmatchable key.

use std::sync::atomic::{AtomicI64, Ordering};

use arrow::array::{Array, ArrayData};
use arrow::datatypes::{DataType, TimeUnit};
use datafusion::common::internal_err;
use datafusion::error::Result;

use super::packed::KeyRanges;
use crate::lanes::in_wide_lanes;

/// How the raw bits of a key column's values order: as `i32` or as `u32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawKeys {
    Signed,
    Unsigned,
}

impl RawKeys {
    /// For a key column of `data_type`, when its values are 4-byte integers
    /// that the packed layout reads as they are.
    pub fn of_type(data_type: &DataType) -> Option<Self> {
        match data_type {
            DataType::Int32
            | DataType::Date32
            | DataType::Time32(TimeUnit::Second | TimeUnit::Millisecond)
            | DataType::Decimal32(_, _) => Some(Self::Signed),
            DataType::UInt32 => Some(Self::Unsigned),
            _ => None,
        }
    }

    /// For `key`, when it is of such a type and holds no NULL.
    pub fn of_column(key: &dyn Array) -> Option<Self> {
        Self::of_type(key.data_type()).filter(|_| key.null_count() == 0)
    }

    /// Copies rows `first..first + out.len()` of `key` into `out` as their
    /// raw bits, and widens `span` to their values.
    pub fn copy(self, key: &dyn Array, first: usize, out: &mut [u32], span: &RawSpan) -> Result<()> {
        let data = key.to_data();
        out.copy_from_slice(self.values(&data, first, out.len())?);
        // Apart from the copy, over the values just copied (in the first
        // level cache): a loop with one job each compiles to vector code,
        // the span's comparisons in the values' own lanes.
        self.widen(out, span);
        Ok(())
    }

    /// Widens `span` to the values of `key`, read where they lie: keys that
    /// go up without a copy ([`crate::backend::JoinBackend::upload_values_in_place`]).
    pub fn widen_span(self, key: &dyn Array, span: &RawSpan) -> Result<()> {
        let data = key.to_data();
        self.widen(self.values(&data, 0, key.len())?, span);
        Ok(())
    }

    /// Rows `first..first + len` of `data`'s values, when `data` is a key
    /// column of this kind.
    fn values(self, data: &ArrayData, first: usize, len: usize) -> Result<&[u32]> {
        if Self::of_type(data.data_type()) != Some(self) || data.null_count() > 0 || first + len > data.len() {
            return internal_err!("raw keys of rows {first}..{} asked of {data:?}", first + len);
        }
        Ok(&data.buffer::<u32>(0)[first..first + len])
    }

    fn widen(self, values: &[u32], span: &RawSpan) {
        if values.is_empty() {
            return;
        }
        let (lo, hi) = in_wide_lanes(
            #[inline(always)]
            || self.span_of(values),
        );
        span.widen(lo, hi);
    }

    #[inline(always)]
    fn span_of(self, values: &[u32]) -> (i64, i64) {
        match self {
            Self::Signed => {
                let (lo, hi) =
                    values.iter().fold((i32::MAX, i32::MIN), |(lo, hi), &v| (lo.min(v as i32), hi.max(v as i32)));
                (i64::from(lo), i64::from(hi))
            }
            Self::Unsigned => {
                let (lo, hi) = values.iter().fold((u32::MAX, u32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
                (i64::from(lo), i64::from(hi))
            }
        }
    }
}

/// The smallest and largest value of raw keys copied on several threads.
#[derive(Debug)]
pub struct RawSpan {
    lo: AtomicI64,
    hi: AtomicI64,
}

impl Default for RawSpan {
    fn default() -> Self {
        Self { lo: AtomicI64::new(i64::MAX), hi: AtomicI64::new(i64::MIN) }
    }
}

impl RawSpan {
    fn widen(&self, lo: i64, hi: i64) {
        self.lo.fetch_min(lo, Ordering::Relaxed);
        self.hi.fetch_max(hi, Ordering::Relaxed);
    }

    /// The span of the one key column, as gathered from every piece copied.
    pub fn ranges(&self) -> KeyRanges {
        let (lo, hi) = (self.lo.load(Ordering::Relaxed), self.hi.load(Ordering::Relaxed));
        KeyRanges::of_one_column((lo <= hi).then_some((i128::from(lo), i128::from(hi))))
    }
}
