//! Normalised join keys.
//!
//! Every backend joins fixed-width unsigned keys. This module turns the key
//! columns of a join (any count, any supported type) into one such key per
//! row, in one of two ways:
//!
//! * **Packed** (exact): integer-like columns are offset by the build side's
//!   minimum and bit-packed into 32 or 64 bits. Two rows match exactly when
//!   their packed keys are equal, so no verification is needed. Probe values
//!   outside the build side's range cannot match and are marked unmatchable.
//! * **Hashed**: DataFusion's own `create_hashes` gives a 64-bit hash; pairs
//!   whose hashes collide are verified against the real key values with
//!   DataFusion's `JoinKeyComparator`, so results equal `HashJoinExec`'s.
//!
//! A row that can never match (a NULL key under `NullEqualsNothing`, or a value
//! outside the build range) gets the reserved key [`NormalizedKey::UNMATCHABLE`].

mod normalized;
mod packed;
mod raw;

use arrow::array::{Array, ArrayRef};
use arrow::compute::SortOptions;
use arrow::datatypes::DataType;
use datafusion::common::hash_utils::{RandomState, create_hashes};
use datafusion::common::{NullEquality, internal_err};
use datafusion::error::Result;
use datafusion::physical_plan::joins::utils::JoinKeyComparator;

pub use normalized::{NormalizedKey, RawCodes, SortSpec};
pub use packed::{KeyRanges, SpanBounds};
use packed::{PARALLEL_ROWS, PackedLayout};
pub use raw::{RawKeys, RawSpan};
use rayon::prelude::*;

/// One normalised key per row, in the narrowest width the encoding allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NormalizedKeys {
    U32(Vec<u32>),
    U64(Vec<u64>),
}

impl NormalizedKeys {
    pub fn len(&self) -> usize {
        match self {
            NormalizedKeys::U32(k) => k.len(),
            NormalizedKeys::U64(k) => k.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether matching normalised keys are equal keys, or only candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyExactness {
    /// Equal normalised keys mean equal join keys.
    Exact,
    /// Equal normalised keys must be verified against the key values.
    NeedsVerification,
}

/// How the key columns of one join become normalised keys. Built from the
/// build side once and applied to every probe chunk (as
/// [`KeyEncoder::for_probe_side`]), so both sides agree.
#[derive(Debug, Clone)]
pub struct KeyEncoder {
    scheme: Scheme,
    null_equality: NullEquality,
    /// NULLs get their layout's code rather than the unmatchable key:
    /// under `NullEqualsNull`, and on the build side of ordered keys.
    code_nulls: bool,
}

#[derive(Debug, Clone)]
enum Scheme {
    Packed(PackedLayout),
    Hashed,
}

/// DataFusion's hash seed is irrelevant here (hashes never leave a join), but
/// it must be fixed so that the build side and every probe chunk agree.
const HASH_STATE: RandomState = RandomState::with_seed(0x6a6f_696e);

impl KeyEncoder {
    /// Chooses the encoding for a join from its build-side key columns,
    /// given in pieces: the key columns of each batch of the build side.
    pub fn for_build_side(pieces: &[Vec<ArrayRef>], null_equality: NullEquality) -> Result<Self> {
        Self::for_key_ranges(&KeyRanges::of_pieces(pieces), null_equality)
    }

    /// The encoder for a build side whose key columns span `ranges`.
    pub fn for_key_ranges(ranges: &KeyRanges, null_equality: NullEquality) -> Result<Self> {
        if ranges.columns() == 0 {
            return internal_err!("a join needs at least one key column");
        }
        let scheme = match PackedLayout::try_new(ranges, null_equality, None)? {
            Some(layout) => Scheme::Packed(layout),
            None => Scheme::Hashed,
        };
        Ok(Self { scheme, null_equality, code_nulls: null_equality == NullEquality::NullEqualsNull })
    }

    /// The encoder for a build side whose sorted keys must be in the SQL
    /// order `order` (one per key column), NULLs included; `None` when
    /// the keys cannot be packed (hashes keep no order).
    pub fn for_ordered_keys(
        ranges: &KeyRanges,
        null_equality: NullEquality,
        order: &[SortOptions],
    ) -> Result<Option<Self>> {
        if ranges.columns() == 0 {
            return internal_err!("a join needs at least one key column");
        }
        Ok(PackedLayout::try_new(ranges, null_equality, Some(order))?.map(|layout| Self {
            scheme: Scheme::Packed(layout),
            null_equality,
            code_nulls: true,
        }))
    }

    /// This encoder as the probe side uses it: there a NULL key matches
    /// only under `NullEqualsNull`.
    pub fn for_probe_side(&self) -> Self {
        Self { code_nulls: self.null_equality == NullEquality::NullEqualsNull, ..self.clone() }
    }

    pub fn exactness(&self) -> KeyExactness {
        match self.scheme {
            Scheme::Packed(_) => KeyExactness::Exact,
            Scheme::Hashed => KeyExactness::NeedsVerification,
        }
    }

    /// Key width in bits (32 or 64).
    pub fn key_bits(&self) -> u32 {
        match &self.scheme {
            Scheme::Packed(layout) if layout.fits_u32() => 32,
            _ => 64,
        }
    }

    /// How keys that go up as their raw bits ([`RawKeys`]) become codes on
    /// the backend; `None` where the codes are not the raw bits less one
    /// value (keys of 64 bits, hashed, counting down, or of several
    /// columns).
    pub fn raw_codes(&self) -> Option<RawCodes> {
        match &self.scheme {
            Scheme::Packed(layout) => layout.raw_codes(),
            Scheme::Hashed => None,
        }
    }

    /// How many codes packed keys take (`2^bits`), where that is at most
    /// 2^31: the entries of a directory over them. `None` for hashed keys
    /// and wider packed keys.
    pub fn code_count(&self) -> Option<u32> {
        match &self.scheme {
            Scheme::Packed(layout) if layout.total_bits() < 32 => Some(1 << layout.total_bits()),
            _ => None,
        }
    }

    /// The key bits a sort of these keys orders by: packed keys' values
    /// and one bit to set the unmatchable key apart, every bit of a hash.
    pub fn sort_spec<K: NormalizedKey>(&self) -> SortSpec {
        match &self.scheme {
            Scheme::Packed(layout) => SortSpec::for_value_bits::<K>(layout.total_bits()),
            Scheme::Hashed => SortSpec::full::<K>(),
        }
    }

    /// Short description for EXPLAIN ANALYZE and logs, e.g. `packed 27 bits`.
    pub fn describe(&self) -> String {
        match &self.scheme {
            Scheme::Packed(layout) => format!("packed {} bits", layout.total_bits()),
            Scheme::Hashed => "hashed 64 bits, verified".to_string(),
        }
    }

    /// Encodes the key columns of one side (build or probe), in parallel
    /// pieces.
    pub fn encode(&self, keys: &[ArrayRef]) -> Result<NormalizedKeys> {
        let rows = keys.first().map_or(0, |k| k.len());
        fn encoded<K: NormalizedKey>(encoder: &KeyEncoder, keys: &[ArrayRef], rows: usize) -> Result<Vec<K>> {
            let mut out = vec![K::default(); rows];
            out.par_chunks_mut(PARALLEL_ROWS)
                .enumerate()
                .try_for_each(|(i, piece)| encoder.encode_rows(keys, i * PARALLEL_ROWS, piece))?;
            Ok(out)
        }
        Ok(match self.key_bits() {
            32 => NormalizedKeys::U32(encoded(self, keys, rows)?),
            _ => NormalizedKeys::U64(encoded(self, keys, rows)?),
        })
    }

    /// Encodes rows `first..first + out.len()` of the key columns of one
    /// side into `out`, whose width must be the encoder's `key_bits`.
    pub fn encode_rows<K: NormalizedKey>(&self, keys: &[ArrayRef], first: usize, out: &mut [K]) -> Result<()> {
        if K::BITS != self.key_bits() {
            return internal_err!("keys of {} bits asked of a {}-bit encoding", K::BITS, self.key_bits());
        }
        let piece: Vec<ArrayRef> = keys.iter().map(|k| k.slice(first, out.len())).collect();
        match &self.scheme {
            Scheme::Packed(layout) => layout.encode_rows(&piece, out, self.code_nulls),
            Scheme::Hashed => {
                let mut hashes = vec![0u64; out.len()];
                self.hash_piece(&piece, &mut hashes)?;
                for (o, h) in out.iter_mut().zip(hashes) {
                    *o = K::from_u64(h);
                }
                Ok(())
            }
        }
    }

    /// Hashed keys of one piece of rows.
    fn hash_piece(&self, keys: &[ArrayRef], hashes: &mut [u64]) -> Result<()> {
        create_hashes(keys, &HASH_STATE, hashes)?;
        for h in hashes.iter_mut() {
            // The reserved key must stay unreachable; the collision this
            // creates is resolved by verification.
            if *h == u64::UNMATCHABLE {
                *h = u64::UNMATCHABLE - 1;
            }
        }
        if self.null_equality == NullEquality::NullEqualsNothing {
            for key in keys {
                if let Some(nulls) = key.logical_nulls() {
                    for row in nulls.iter().enumerate().filter(|(_, v)| !v).map(|(i, _)| i) {
                        hashes[row] = u64::UNMATCHABLE;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Checks candidate pairs against the real key values; `keep[i]` is set to
/// false where pair `i` only collided on its hash.
pub fn verify_candidates(
    build_keys: &[ArrayRef],
    probe_keys: &[ArrayRef],
    build_rows: &[u32],
    probe_rows: &[u32],
    null_equality: NullEquality,
    keep: &mut [bool],
) -> Result<()> {
    let options = vec![Default::default(); build_keys.len()];
    let comparator = JoinKeyComparator::new(build_keys, probe_keys, &options, null_equality)?;
    for ((b, p), k) in build_rows.iter().zip(probe_rows).zip(keep.iter_mut()) {
        *k = *k && comparator.is_equal(*b as usize, *p as usize);
    }
    Ok(())
}

/// Key types whose values pack (when their range allows), and so can be
/// sorted into SQL order on the device: the integer-like types the packed
/// layout reads, and booleans.
pub fn is_packable_key_type(data_type: &DataType) -> bool {
    use DataType::*;
    matches!(
        data_type,
        Boolean
            | Int8
            | Int16
            | Int32
            | Int64
            | UInt8
            | UInt16
            | UInt32
            | UInt64
            | Date32
            | Date64
            | Time32(_)
            | Time64(_)
            | Timestamp(_, _)
            | Duration(_)
            | Decimal32(_, _)
            | Decimal64(_, _)
            | Decimal128(_, _)
    )
}

/// Key types the GPU join accepts: packable ones, and the rest, which are
/// hashed with DataFusion's hash and verified with its comparator.
pub fn is_supported_key_type(data_type: &DataType) -> bool {
    use DataType::*;
    match data_type {
        _ if is_packable_key_type(data_type) => true,
        Float16
        | Float32
        | Float64
        | Decimal256(_, _)
        | Utf8
        | LargeUtf8
        | Utf8View
        | Binary
        | LargeBinary
        | BinaryView
        | FixedSizeBinary(_) => true,
        Dictionary(key, value) => key.is_dictionary_key_type() && is_supported_key_type(value),
        _ => false,
    }
}

#[cfg(test)]
mod tests;
