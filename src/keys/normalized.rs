//! Keys as the join primitives see them: fixed-width integers, one code
//! kept apart for rows that match nothing.

use std::hash::Hash;

use crate::values::Element;

/// A fixed-width key as the join primitives see it.
pub trait NormalizedKey: Element + Eq + Ord + Hash {
    /// The key of a row that cannot match any other row.
    const UNMATCHABLE: Self;
    /// Width in bits.
    const BITS: u32;
    /// Widening conversion.
    fn to_u64(self) -> u64;
    /// Narrowing conversion; callers guarantee the value fits.
    fn from_u64(value: u64) -> Self;
}

impl NormalizedKey for u32 {
    const UNMATCHABLE: Self = u32::MAX;
    const BITS: u32 = 32;
    fn to_u64(self) -> u64 {
        u64::from(self)
    }
    fn from_u64(value: u64) -> Self {
        value as u32
    }
}

impl NormalizedKey for u64 {
    const UNMATCHABLE: Self = u64::MAX;
    const BITS: u32 = 64;
    fn to_u64(self) -> u64 {
        self
    }
    fn from_u64(value: u64) -> Self {
        value
    }
}

/// Which key bits a sort orders by: the low `key_bits` bits.
///
/// Packed keys take fewer bits than their width, and a radix sort needs a
/// pass per digit of the bits it orders by. The unmatchable key has every
/// bit set, so one bit above the matchable values still sorts it last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SortSpec {
    pub key_bits: u32,
}

impl SortSpec {
    /// Every bit of a `K` (hashed keys).
    pub fn full<K: NormalizedKey>() -> Self {
        Self { key_bits: K::BITS }
    }

    /// Keys whose matchable values are below `2^value_bits`.
    pub fn for_value_bits<K: NormalizedKey>(value_bits: u32) -> Self {
        Self { key_bits: (value_bits + 1).min(K::BITS) }
    }

    pub fn digit_bits(&self) -> u32 {
        self.key_bits
    }

    /// What the sort orders `key` by.
    pub fn sort_key<K: NormalizedKey>(&self, key: K) -> u64 {
        match self.key_bits {
            64.. => key.to_u64(),
            bits => key.to_u64() & ((1u64 << bits) - 1),
        }
    }
}

/// How the raw bits of 4-byte key values become their codes: a value's
/// distance from `lo` (wrapping) is its offset, and an offset up to `span`
/// codes as itself plus `shift`, a larger one (a value outside the build
/// side's span) as the unmatchable key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawCodes {
    pub lo: u32,
    pub span: u32,
    pub shift: u32,
}

impl RawCodes {
    pub fn code(self, value: u32) -> u32 {
        let offset = value.wrapping_sub(self.lo);
        match offset <= self.span {
            true => offset.wrapping_add(self.shift),
            false => <u32 as NormalizedKey>::UNMATCHABLE,
        }
    }
}
