//! Grouping columns of strings (or bytes) as dense integer codes, so that a
//! chunk whose groups are named partly by strings still packs its keys into
//! integers.
//!
//! Codes are given over one whole chunk, the same bytes the same code in
//! every batch of it: groups never leave a chunk by their codes (their
//! grouping columns are taken from the rows they came in), so codes need
//! agree only within the chunk. A NULL stays NULL, which packing codes as a
//! value of its own. The codes of a column take as many bits as its distinct
//! values need; a chunk whose string columns alone need more bits than a
//! packed key holds is not coded further, and is left to DataFusion.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, UInt32Array};
use arrow::buffer::{NullBuffer, ScalarBuffer};
use arrow::datatypes::DataType;
use datafusion::common::{HashMap, internal_err};
use datafusion::error::Result;

/// Bits of all the codes of a chunk beyond which its keys cannot pack.
const MAX_CODE_BITS: u32 = 63;

/// Whether a grouping column of `data_type` is grouped by its codes.
pub(super) fn is_coded_type(data_type: &DataType) -> bool {
    use DataType::*;
    matches!(data_type, Utf8 | LargeUtf8 | Utf8View | Binary | LargeBinary | BinaryView)
}

/// `pieces` (each batch's grouping columns, in the same order) with every
/// column of strings or bytes replaced by its codes; `None` where the codes
/// need more bits than a packed key holds.
pub(super) fn with_codes(pieces: &[Vec<ArrayRef>]) -> Result<Option<Vec<Vec<ArrayRef>>>> {
    let mut coded: Vec<Vec<ArrayRef>> = pieces.to_vec();
    let Some(first) = pieces.first() else {
        return Ok(Some(coded));
    };
    let mut bits = 0;
    for (column, array) in first.iter().enumerate() {
        if !is_coded_type(array.data_type()) {
            continue;
        }
        let mut codes = Codes::default();
        for (piece, out) in pieces.iter().zip(&mut coded) {
            out[column] = codes.of(piece[column].as_ref())?;
        }
        // One more code than the distinct values, for a NULL's.
        bits += u32::BITS - (codes.distinct() as u32).leading_zeros();
        if bits > MAX_CODE_BITS {
            return Ok(None);
        }
    }
    Ok(Some(coded))
}

/// The codes of one column's distinct values, in the order first met.
#[derive(Default)]
struct Codes {
    of_bytes: HashMap<Box<[u8]>, u32>,
    /// Those of a view column's values short enough to lie in their view,
    /// looked up by the view itself.
    of_views: HashMap<u128, u32>,
}

impl Codes {
    fn distinct(&self) -> usize {
        self.of_bytes.len() + self.of_views.len()
    }

    /// `array`'s codes, its NULLs kept.
    fn of(&mut self, array: &dyn Array) -> Result<ArrayRef> {
        let mut codes = Vec::with_capacity(array.len());
        match array.data_type() {
            DataType::Utf8 => self.extend(&mut codes, array.as_string::<i32>().iter().map(|v| v.map(str::as_bytes))),
            DataType::LargeUtf8 => {
                self.extend(&mut codes, array.as_string::<i64>().iter().map(|v| v.map(str::as_bytes)))
            }
            DataType::Utf8View => {
                let views = array.as_string_view();
                self.extend_views(&mut codes, views.views(), views.nulls(), |i| views.value(i).as_bytes())
            }
            DataType::Binary => self.extend(&mut codes, array.as_binary::<i32>().iter()),
            DataType::LargeBinary => self.extend(&mut codes, array.as_binary::<i64>().iter()),
            DataType::BinaryView => {
                let views = array.as_binary_view();
                self.extend_views(&mut codes, views.views(), views.nulls(), |i| views.value(i))
            }
            other => return internal_err!("grouping column of type {other} has no codes"),
        }
        let nulls = array.logical_nulls();
        Ok(Arc::new(UInt32Array::new(ScalarBuffer::from(codes), nulls)))
    }

    fn extend<'a>(&mut self, codes: &mut Vec<u32>, values: impl Iterator<Item = Option<&'a [u8]>>) {
        // A NULL's slot holds any code: the null buffer marks it.
        codes.extend(values.map(|value| value.map_or(0, |bytes| self.of_bytes(bytes))));
    }

    /// The codes of a view column's values: those of up to 12 bytes by
    /// their view, its bytes past the value cleared (writers need not
    /// clear them), the longer ones by their bytes (`value(i)`). A NULL's
    /// view is never read: writers need not make it a value's.
    fn extend_views<'a>(
        &mut self,
        codes: &mut Vec<u32>,
        views: &[u128],
        nulls: Option<&NullBuffer>,
        value: impl Fn(usize) -> &'a [u8],
    ) {
        for (i, view) in views.iter().enumerate() {
            let length = *view as u32;
            let code = if nulls.is_some_and(|nulls| nulls.is_null(i)) {
                0
            } else if length <= 12 {
                let next = self.distinct() as u32;
                *self.of_views.entry(*view & (u128::MAX >> (96 - 8 * length))).or_insert(next)
            } else {
                self.of_bytes(value(i))
            };
            codes.push(code);
        }
    }

    fn of_bytes(&mut self, bytes: &[u8]) -> u32 {
        if let Some(code) = self.of_bytes.get(bytes) {
            return *code;
        }
        let code = self.distinct() as u32;
        self.of_bytes.insert(bytes.into(), code);
        code
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int32Array, StringArray, StringViewArray};

    #[test]
    fn the_same_strings_get_the_same_codes_across_batches_and_nulls_stay_null() -> Result<()> {
        let first: Vec<ArrayRef> = vec![
            Arc::new(Int32Array::from(vec![1, 2, 3])),
            Arc::new(StringViewArray::from(vec![Some("a"), None, Some("bb")])),
        ];
        let second: Vec<ArrayRef> =
            vec![Arc::new(Int32Array::from(vec![4, 5])), Arc::new(StringViewArray::from(vec![Some("bb"), Some("a")]))];
        // Values past 12 bytes lie outside their views.
        let long = "a value longer than a view";
        let third: Vec<ArrayRef> = vec![
            Arc::new(Int32Array::from(vec![6, 7, 8])),
            Arc::new(StringViewArray::from(vec![Some(long), None, Some("a")])),
        ];
        let Some(coded) = with_codes(&[first.clone(), second, third])? else {
            return internal_err!("two distinct strings must be coded");
        };
        assert!(Arc::ptr_eq(&coded[0][0], &first[0]), "integer columns pass as they are");
        let codes = |piece: usize| coded[piece][1].as_primitive::<arrow::datatypes::UInt32Type>().clone();
        let (a, b) = (codes(0), codes(1));
        assert!(a.is_null(1));
        assert_eq!(a.value(0), b.value(1), "\"a\" in both batches");
        assert_eq!(a.value(2), b.value(0), "\"bb\" in both batches");
        assert_ne!(a.value(0), a.value(2));
        let c = codes(2);
        assert_eq!((c.is_null(1), c.value(2)), (true, a.value(0)));
        assert!(![a.value(0), a.value(2)].contains(&c.value(0)), "the long value has a code of its own");
        Ok(())
    }

    #[test]
    fn codes_that_cannot_pack_are_refused() -> Result<()> {
        // Three columns of 2^21 distinct values need 66 bits with their NULL codes.
        let distinct = 1 << 21;
        let column = || Arc::new(StringArray::from_iter_values((0..distinct).map(|i| format!("{i}")))) as ArrayRef;
        assert!(with_codes(&[vec![column(), column()]])?.is_some());
        assert!(with_codes(&[vec![column(), column(), column()]])?.is_none());
        Ok(())
    }
}
