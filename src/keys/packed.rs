//! Exact bit-packing of integer-like key columns.
//!
//! Each column contributes `value - min` (plus one slot for NULL under
//! `NullEqualsNull`) in just enough bits for the build side's range; columns
//! are concatenated most significant first, so packed keys also sort in the
//! lexicographic order of the original key columns.
//!
//! A join whose output must leave in key order (one that replaces a
//! sort-merge join) asks for a column order: descending columns count down
//! from the maximum, and NULL gets the first or the last code, so that the
//! sorted keys are in SQL order. The build side's NULLs then get that code
//! even under `NullEqualsNothing`, while the probe side's stay unmatchable:
//! no probe key has a NULL's code, so such rows sort in place and never
//! match.

use arrow::array::{Array, ArrayRef, AsArray, PrimitiveArray, new_empty_array};
use arrow::compute::SortOptions;
use arrow::compute::{max, min};
use arrow::datatypes::*;
use datafusion::common::{NullEquality, ScalarValue, internal_err};
use datafusion::error::Result;
use rayon::prelude::*;

use super::normalized::{NormalizedKey, RawCodes};

/// Widest packed key; one code above it stays free for the unmatchable key.
const MAX_PACKED_BITS: u32 = 63;
/// Packed keys of up to this many bits use 32-bit keys.
const MAX_U32_BITS: u32 = 31;

#[derive(Debug, Clone)]
pub(super) struct PackedLayout {
    columns: Vec<PackedColumn>,
    total_bits: u32,
}

#[derive(Debug, Clone)]
struct PackedColumn {
    /// Build-side value range, `None` when the build side has no non-null value.
    range: Option<(i128, i128)>,
    /// Where NULL's code lies, when it has one: under `NullEqualsNull`, or
    /// when the keys must sort in SQL order.
    null_code: Option<NullCode>,
    /// Codes count down from the largest value.
    descending: bool,
    bits: u32,
}

/// The code of NULL in a column: before every value's, or after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NullCode {
    First,
    Last,
}

/// The native values of an integer-like column as the layout reads them.
trait KeyValue: Copy {
    fn to_i128(self) -> i128;
    /// A build-side bound as a value of this type, when it is one.
    fn bound(value: i128) -> Option<Self>;
    /// `upper - self`, wrapping in the type's own width and read unsigned:
    /// exact when `self <= upper`; for a value outside a range of this type,
    /// its distance from the range's bound is above the range's span.
    fn distance_to(self, upper: Self) -> u64;
}

macro_rules! key_value {
    ($($t:ty => $unsigned:ty),*) => { $(impl KeyValue for $t {
        fn to_i128(self) -> i128 { self as i128 }
        fn bound(value: i128) -> Option<Self> { Self::try_from(value).ok() }
        fn distance_to(self, upper: Self) -> u64 { upper.wrapping_sub(self) as $unsigned as u64 }
    })* };
}
key_value!(i8 => u8, i16 => u16, i32 => u32, i64 => u64, u8 => u8, u16 => u16, u32 => u32, u64 => u64);

impl KeyValue for i128 {
    fn to_i128(self) -> i128 {
        self
    }
    fn bound(value: i128) -> Option<Self> {
        Some(value)
    }
    /// Saturates: spans are below 2^63, so a distance beyond 64 bits is
    /// above every span.
    fn distance_to(self, upper: Self) -> u64 {
        u64::try_from(upper.wrapping_sub(self) as u128).unwrap_or(u64::MAX)
    }
}

/// Runs `$body` with `$typed` bound to the column as a primitive array of an
/// integer-like type, or evaluates `$other` for every other type.
macro_rules! with_integer_array {
    ($array:expr, $typed:ident => $body:expr, other => $other:expr) => {{
        let array: &dyn Array = $array;
        match array.data_type() {
            DataType::Int8 => {
                let $typed = array.as_primitive::<Int8Type>();
                $body
            }
            DataType::Int16 => {
                let $typed = array.as_primitive::<Int16Type>();
                $body
            }
            DataType::Int32 => {
                let $typed = array.as_primitive::<Int32Type>();
                $body
            }
            DataType::Int64 => {
                let $typed = array.as_primitive::<Int64Type>();
                $body
            }
            DataType::UInt8 => {
                let $typed = array.as_primitive::<UInt8Type>();
                $body
            }
            DataType::UInt16 => {
                let $typed = array.as_primitive::<UInt16Type>();
                $body
            }
            DataType::UInt32 => {
                let $typed = array.as_primitive::<UInt32Type>();
                $body
            }
            DataType::UInt64 => {
                let $typed = array.as_primitive::<UInt64Type>();
                $body
            }
            DataType::Date32 => {
                let $typed = array.as_primitive::<Date32Type>();
                $body
            }
            DataType::Date64 => {
                let $typed = array.as_primitive::<Date64Type>();
                $body
            }
            DataType::Time32(TimeUnit::Second) => {
                let $typed = array.as_primitive::<Time32SecondType>();
                $body
            }
            DataType::Time32(TimeUnit::Millisecond) => {
                let $typed = array.as_primitive::<Time32MillisecondType>();
                $body
            }
            DataType::Time64(TimeUnit::Microsecond) => {
                let $typed = array.as_primitive::<Time64MicrosecondType>();
                $body
            }
            DataType::Time64(TimeUnit::Nanosecond) => {
                let $typed = array.as_primitive::<Time64NanosecondType>();
                $body
            }
            DataType::Timestamp(TimeUnit::Second, _) => {
                let $typed = array.as_primitive::<TimestampSecondType>();
                $body
            }
            DataType::Timestamp(TimeUnit::Millisecond, _) => {
                let $typed = array.as_primitive::<TimestampMillisecondType>();
                $body
            }
            DataType::Timestamp(TimeUnit::Microsecond, _) => {
                let $typed = array.as_primitive::<TimestampMicrosecondType>();
                $body
            }
            DataType::Timestamp(TimeUnit::Nanosecond, _) => {
                let $typed = array.as_primitive::<TimestampNanosecondType>();
                $body
            }
            DataType::Duration(TimeUnit::Second) => {
                let $typed = array.as_primitive::<DurationSecondType>();
                $body
            }
            DataType::Duration(TimeUnit::Millisecond) => {
                let $typed = array.as_primitive::<DurationMillisecondType>();
                $body
            }
            DataType::Duration(TimeUnit::Microsecond) => {
                let $typed = array.as_primitive::<DurationMicrosecondType>();
                $body
            }
            DataType::Duration(TimeUnit::Nanosecond) => {
                let $typed = array.as_primitive::<DurationNanosecondType>();
                $body
            }
            DataType::Decimal32(_, _) => {
                let $typed = array.as_primitive::<Decimal32Type>();
                $body
            }
            DataType::Decimal64(_, _) => {
                let $typed = array.as_primitive::<Decimal64Type>();
                $body
            }
            DataType::Decimal128(_, _) => {
                let $typed = array.as_primitive::<Decimal128Type>();
                $body
            }
            _ => $other,
        }
    }};
}

/// Rows each parallel task of a range or encoding pass reads.
pub(super) const PARALLEL_ROWS: usize = 1 << 18;

/// The smallest and largest value of an array.
fn value_range<T>(array: &PrimitiveArray<T>) -> Option<(i128, i128)>
where
    T: ArrowPrimitiveType,
    T::Native: KeyValue,
{
    Some((min(array)?.to_i128(), max(array)?.to_i128()))
}

/// The span of one key column: `None` when it is not integer-like (its keys
/// are hashed), else its smallest and largest value, `None` while it holds
/// none. Booleans span both values.
type ColumnSpan = Option<Option<(i128, i128)>>;

/// The span of one piece of a key column, on the calling thread.
fn piece_span(array: &dyn Array) -> ColumnSpan {
    match array.data_type() {
        DataType::Boolean => Some(Some((0, 1))),
        _ => with_integer_array!(array, typed => Some(value_range(typed)), other => None),
    }
}

fn union(a: Option<(i128, i128)>, b: Option<(i128, i128)>) -> Option<(i128, i128)> {
    match (a, b) {
        (Some((lo1, hi1)), Some((lo2, hi2))) => Some((lo1.min(lo2), hi1.max(hi2))),
        (range, None) | (None, range) => range,
    }
}

/// The spans of a build side's key columns. They can be gathered batch by
/// batch while the build side is collected, so that the encoder is ready
/// when the rows are in, rather than after another pass over the keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRanges(Vec<ColumnSpan>);

impl KeyRanges {
    /// The spans of one piece's key columns, on the calling thread.
    pub fn of_piece(keys: &[ArrayRef]) -> Self {
        Self(keys.iter().map(|key| piece_span(key.as_ref())).collect())
    }

    /// The span of a single key column of integers: its smallest and
    /// largest value, `None` when it holds none.
    pub(super) fn of_one_column(span: Option<(i128, i128)>) -> Self {
        Self(vec![Some(span)])
    }

    /// The spans of the rows of both.
    pub fn merge(self, other: Self) -> Self {
        let spans = self.0.into_iter().zip(other.0).map(|(a, b)| Some(union(a?, b?)));
        Self(spans.collect())
    }

    /// The spans of both, where both are known; else the one that is.
    pub fn merge_known(a: Option<Self>, b: Option<Self>) -> Option<Self> {
        match (a, b) {
            (Some(a), Some(b)) => Some(a.merge(b)),
            (ranges, None) | (None, ranges) => ranges,
        }
    }

    /// The spans of key columns given in pieces, over slices in parallel.
    pub fn of_pieces(pieces: &[Vec<ArrayRef>]) -> Self {
        let columns = pieces.first().map_or(0, Vec::len);
        Self(
            (0..columns)
                .map(|c| column_span(&pieces.iter().filter_map(|keys| keys.get(c)).collect::<Vec<_>>()))
                .collect(),
        )
    }

    pub(super) fn columns(&self) -> usize {
        self.0.len()
    }

    /// Each column's span as values of its type (`types`, one per column),
    /// for predicates that pass only the keys a build side can match.
    pub fn bounds(&self, types: &[DataType]) -> Vec<SpanBounds> {
        let between = |data_type: &DataType, lo: i128, hi: i128| {
            let typed = new_empty_array(data_type);
            with_integer_array!(typed.as_ref(), typed => Some((scalar_of(typed, lo)?, scalar_of(typed, hi)?)), other => None)
        };
        self.0
            .iter()
            .zip(types)
            .map(|(span, data_type)| match span {
                // Both boolean values: nothing to bound.
                _ if data_type == &DataType::Boolean => SpanBounds::Unknown,
                Some(Some((lo, hi))) => match between(data_type, *lo, *hi) {
                    Some((lo, hi)) => SpanBounds::Between(lo, hi),
                    None => SpanBounds::Unknown,
                },
                Some(None) => SpanBounds::NoValue,
                None => SpanBounds::Unknown,
            })
            .collect()
    }
}

/// What a build side's span says of one key column's values.
#[derive(Debug, Clone, PartialEq)]
pub enum SpanBounds {
    /// Not gathered: the column's keys are hashed.
    Unknown,
    /// The column holds no value, only NULLs or no row.
    NoValue,
    /// Every value lies between these two, both included.
    Between(ScalarValue, ScalarValue),
}

/// `value` as a scalar of the array's type (its precision, scale or time
/// zone included), when it is one.
fn scalar_of<T>(typed: &PrimitiveArray<T>, value: i128) -> Option<ScalarValue>
where
    T: ArrowPrimitiveType,
    T::Native: KeyValue,
{
    let one = PrimitiveArray::<T>::from_value(T::Native::bound(value)?, 1).with_data_type(typed.data_type().clone());
    ScalarValue::try_from_array(&one, 0).ok()
}

/// The span of a key column given in pieces, over slices of at most
/// `PARALLEL_ROWS` rows in parallel.
fn column_span(pieces: &[&ArrayRef]) -> ColumnSpan {
    let first = pieces.first()?;
    if first.data_type() == &DataType::Boolean {
        return Some(Some((0, 1)));
    }
    with_integer_array!(first.as_ref(), _typed => (), other => return None);
    let slices: Vec<ArrayRef> = pieces
        .iter()
        .flat_map(|piece| {
            (0..piece.len())
                .step_by(PARALLEL_ROWS)
                .map(|start| piece.slice(start, PARALLEL_ROWS.min(piece.len() - start)))
        })
        .collect();
    let ranges = slices.par_iter().map(|slice| piece_span(slice.as_ref())).collect::<Option<Vec<_>>>()?;
    Some(ranges.into_iter().fold(None, union))
}

/// Bits needed to store codes `0..count`.
fn bits_for(count: u128) -> u32 {
    if count <= 1 { 0 } else { 128 - (count - 1).leading_zeros() }
}

impl PackedLayout {
    /// A layout for the build side's key columns of these spans, or `None`
    /// when a column is not integer-like or the ranges do not fit in 63 bits.
    /// With `order`, one per column, keys sort in that SQL order.
    pub(super) fn try_new(
        spans: &KeyRanges,
        null_equality: NullEquality,
        order: Option<&[SortOptions]>,
    ) -> Result<Option<Self>> {
        if order.is_some_and(|order| order.len() != spans.columns()) {
            return internal_err!("a key order for {} of {} key columns", order.map_or(0, <[_]>::len), spans.columns());
        }
        let mut columns = Vec::with_capacity(spans.columns());
        for (c, span) in spans.0.iter().enumerate() {
            let Some(range) = *span else {
                return Ok(None);
            };
            let options = order.and_then(|order| order.get(c));
            let null_code = match options {
                Some(options) if !options.nulls_first => Some(NullCode::Last),
                Some(_) => Some(NullCode::First),
                None => (null_equality == NullEquality::NullEqualsNull).then_some(NullCode::First),
            };
            let codes = match range {
                Some((lo, hi)) => match hi.checked_sub(lo) {
                    Some(span) => span as u128 + 1 + u128::from(null_code.is_some()),
                    None => return Ok(None),
                },
                None => u128::from(null_code.is_some()),
            };
            let bits = bits_for(codes);
            if bits > MAX_PACKED_BITS {
                return Ok(None);
            }
            let descending = options.is_some_and(|o| o.descending);
            columns.push(PackedColumn { range, null_code, descending, bits });
        }
        let total_bits: u32 = columns.iter().map(|c| c.bits).sum();
        Ok((total_bits <= MAX_PACKED_BITS).then_some(Self { columns, total_bits }))
    }

    pub(super) fn total_bits(&self) -> u32 {
        self.total_bits
    }

    pub(super) fn fits_u32(&self) -> bool {
        self.total_bits <= MAX_U32_BITS
    }

    /// How the raw bits of the one key column's 4-byte values become their
    /// codes, where the key is one column whose codes count up from its
    /// smallest value and fit 32 bits ([`super::raw`]).
    pub(super) fn raw_codes(&self) -> Option<RawCodes> {
        let ([column], true) = (self.columns.as_slice(), self.fits_u32()) else {
            return None;
        };
        let (lo, hi) = column.range.filter(|_| !column.descending)?;
        // The low 32 bits are the raw bits of a 4-byte value, signed or not.
        Some(RawCodes { lo: lo as u32, span: u32::try_from(hi - lo).ok()?, shift: column.shift() as u32 })
    }

    /// Packs the key columns into `out`, one key per row for as many rows
    /// as `out` holds; rows that cannot match get the unmatchable key, and
    /// so do NULLs unless `code_nulls` (and the layout has a code for them).
    pub(super) fn encode_rows<K: NormalizedKey>(
        &self,
        keys: &[ArrayRef],
        out: &mut [K],
        code_nulls: bool,
    ) -> Result<()> {
        if let ([column], [key]) = (self.columns.as_slice(), keys)
            && key.null_count() == 0
            && key.data_type() != &DataType::Boolean
            && column.encode_single(key.as_ref(), out)?
        {
            return Ok(());
        }
        let mut codes = vec![0u64; out.len()];
        for (column, key) in self.columns.iter().zip(keys) {
            if key.data_type() == &DataType::Boolean {
                let typed = key.as_boolean();
                column.append(&mut codes, code_nulls, |row| typed.is_valid(row).then(|| i128::from(typed.value(row))));
            } else {
                with_integer_array!(
                    key.as_ref(),
                    typed => column.append(&mut codes, code_nulls, |row| typed.is_valid(row).then(|| typed.value(row).to_i128())),
                    other => return internal_err!("packed key layout got a {} column", key.data_type())
                );
            }
        }
        for (o, c) in out.iter_mut().zip(codes) {
            *o = if c == u64::MAX { K::UNMATCHABLE } else { K::from_u64(c) };
        }
        Ok(())
    }
}

impl PackedColumn {
    /// How far value codes sit above 0: one when NULL's code comes first.
    fn shift(&self) -> u64 {
        u64::from(self.null_code == Some(NullCode::First))
    }

    /// NULL's code, when it has one.
    fn null(&self) -> Option<u64> {
        match (self.null_code?, self.range) {
            (NullCode::First, _) | (NullCode::Last, None) => Some(0),
            (NullCode::Last, Some((lo, hi))) => Some((hi - lo) as u64 + 1),
        }
    }

    /// The whole key is this one integer column and holds no NULL: each
    /// code is the distance from the minimum (from the maximum, descending)
    /// in the values' own width. False, with `out` untouched, when the
    /// build side's bounds are not values of this column's type.
    fn encode_single<K: NormalizedKey>(&self, key: &dyn Array, out: &mut [K]) -> Result<bool> {
        let Some((lo, hi)) = self.range else {
            out.fill(K::UNMATCHABLE);
            return Ok(true);
        };
        with_integer_array!(
            key,
            typed => Ok(self.encode_values(typed.values(), lo, hi, out)),
            other => internal_err!("packed key layout got a {} column", key.data_type())
        )
    }

    fn encode_values<T: KeyValue, K: NormalizedKey>(&self, values: &[T], lo: i128, hi: i128, out: &mut [K]) -> bool {
        let (Some(lo), Some(hi)) = (T::bound(lo), T::bound(hi)) else {
            return false;
        };
        let (span, shift) = (lo.distance_to(hi), self.shift());
        let code = |offset: u64| if offset <= span { K::from_u64(offset + shift) } else { K::UNMATCHABLE };
        // A loop per direction, in the values' width rather than in i64:
        // without a branch, a widening or a 64-bit comparison per value,
        // each compiles to vector code in lanes as wide as the values.
        match self.descending {
            false => out.iter_mut().zip(values).for_each(|(c, &v)| *c = code(lo.distance_to(v))),
            true => out.iter_mut().zip(values).for_each(|(c, &v)| *c = code(v.distance_to(hi))),
        }
        true
    }

    /// Shifts this column's code into every row's key; rows that cannot
    /// match become `u64::MAX` and stay so.
    fn append(&self, codes: &mut [u64], code_nulls: bool, value: impl Fn(usize) -> Option<i128>) {
        let null = self.null().filter(|_| code_nulls);
        for (row, code) in codes.iter_mut().enumerate() {
            if *code == u64::MAX {
                continue;
            }
            let column_code = match (value(row), self.range) {
                (None, _) => null,
                (Some(v), Some((lo, hi))) if (lo..=hi).contains(&v) => {
                    let offset = if self.descending { hi - v } else { v - lo };
                    Some(offset as u64 + self.shift())
                }
                _ => None,
            };
            *code = match column_code {
                Some(c) => (*code << self.bits) | c,
                None => u64::MAX,
            };
        }
    }
}
