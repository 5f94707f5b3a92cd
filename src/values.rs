//! Value types every layer shares: what backend vectors hold, and how wide
//! a fixed-width Arrow value is.

use std::fmt::Debug;

use arrow::datatypes::DataType;

/// Types that backend vectors hold.
pub trait Element: Copy + Send + Sync + Default + Debug + 'static {}
impl Element for u8 {}
impl Element for u32 {}
impl Element for u64 {}

/// Bytes per value of a primitive type, whose values lie end to end in one
/// buffer; `None` for other types (booleans are bits).
pub(crate) fn value_width(data_type: &DataType) -> Option<usize> {
    data_type.primitive_width().filter(|_| data_type.is_primitive())
}

/// The most values one Arrow array with 32-bit offsets holds: bytes of a
/// string or binary array, child values of a list or map.
pub const MAX_ARRAY_VALUES: usize = i32::MAX as usize;
