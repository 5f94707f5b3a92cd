//! `key IN (the build sides' keys)` as a predicate a scan evaluates row by
//! row.
//!
//! DataFusion's hash join puts a lookup into its hash table in the dynamic
//! filter, which a Parquet scan that filters while it decodes
//! (`datafusion.execution.parquet.pushdown_filters`) applies to each row,
//! skipping the other columns of the rows no build key matches. The GPU
//! join builds no hash table on the host; where a scan evaluates the filter
//! row by row, it gives the scan the set of one key column's build values
//! instead: for integer and date keys a bitmap over their span where they
//! are dense, a hash set otherwise; for strings and binary values a hash
//! set of their bytes. Other keys keep the span alone.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch};
use arrow::buffer::BooleanBuffer;
use arrow::compute::cast;
use arrow::datatypes::{DataType, Int64Type, Schema};
use datafusion::common::Result;
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::{PhysicalExpr, PhysicalExprRef};

/// The span of values one bit per value is kept for, at most, in bits per
/// distinct value: at 32 the bitmap takes no more than the hash set's
/// 8-byte values, and a lookup is one load.
const BITMAP_BITS_PER_VALUE: u64 = 32;

/// `key IN (values)`, where `values` are the build sides' values of one key
/// column: `true` where a build row may match, `false` where none can, NULL
/// for a NULL key, as `IN` gives.
#[derive(Debug, Clone)]
pub(crate) struct KeySetExpr {
    key: PhysicalExprRef,
    values: Arc<Values>,
}

/// A key column's distinct build values.
#[derive(Debug)]
enum Values {
    Integers(Integers),
    /// Strings and binary values, as bytes.
    Bytes(hashbrown::HashSet<Box<[u8]>>),
}

/// Integer and date values, as `i64`.
#[derive(Debug)]
enum Integers {
    /// Bit `v - low` is set for each value `v`.
    Bitmap {
        low: i64,
        bits: Vec<u64>,
        count: usize,
    },
    Hashed(hashbrown::HashSet<i64>),
}

/// The most bytes of string values a set holds: beyond it the build side's
/// strings stay unchecked, as other keys' values do.
const SET_MAX_BYTES: usize = 64 << 20;

impl KeySetExpr {
    /// `key IN (values)` for the build values `values` of the key column
    /// whose probe value is `key`; `None` for keys of other types than
    /// integers, dates, strings and binary values, and for strings of more
    /// than [`SET_MAX_BYTES`] in all.
    pub fn try_new(key: PhysicalExprRef, values: &ArrayRef) -> Option<Self> {
        let values = match as_i64(values) {
            Some(integers) => Values::Integers(Integers::of(integers.as_primitive::<Int64Type>())),
            None => Values::Bytes(byte_set(values)?),
        };
        Some(Self { key, values: Arc::new(values) })
    }
}

impl Integers {
    fn of(values: &Int64Array) -> Self {
        let present = || values.iter().flatten();
        let (Some(low), Some(high)) = (present().min(), present().max()) else {
            return Integers::Hashed(hashbrown::HashSet::new());
        };
        let span = high.abs_diff(low).saturating_add(1);
        match span <= BITMAP_BITS_PER_VALUE.saturating_mul(values.len() as u64) {
            true => {
                let mut bits = vec![0u64; span.div_ceil(64) as usize];
                for value in present() {
                    let bit = value.abs_diff(low);
                    bits[(bit / 64) as usize] |= 1 << (bit % 64);
                }
                let count = bits.iter().map(|word| word.count_ones() as usize).sum();
                Integers::Bitmap { low, bits, count }
            }
            false => Integers::Hashed(present().collect()),
        }
    }

    fn contains(&self, value: i64) -> bool {
        match self {
            Integers::Bitmap { low, bits, .. } => {
                value >= *low && {
                    let bit = value.abs_diff(*low);
                    bits.get((bit / 64) as usize).is_some_and(|word| word & (1 << (bit % 64)) != 0)
                }
            }
            Integers::Hashed(set) => set.contains(&value),
        }
    }

    /// `true` for each key among the values, NULL for a NULL key; `None`
    /// for keys of a type with no integer value.
    fn found(&self, keys: &ArrayRef) -> Option<BooleanArray> {
        let keys = as_i64(keys)?;
        let keys = keys.as_primitive::<Int64Type>();
        let values = keys.values();
        let found = BooleanBuffer::collect_bool(keys.len(), |row| self.contains(values[row]));
        Some(BooleanArray::new(found, keys.nulls().cloned()))
    }
}

impl Values {
    fn len(&self) -> usize {
        match self {
            Values::Integers(Integers::Bitmap { count, .. }) => *count,
            Values::Integers(Integers::Hashed(set)) => set.len(),
            Values::Bytes(set) => set.len(),
        }
    }

    /// `true` for each key among the values, NULL for a NULL key; `None`
    /// for keys of a type the values cannot be compared with.
    fn found(&self, keys: &ArrayRef) -> Option<BooleanArray> {
        match self {
            Values::Integers(integers) => integers.found(keys),
            Values::Bytes(set) => Some(bytes_of(keys)?.map(|key| key.map(|key| set.contains(key))).collect()),
        }
    }
}

/// The distinct values of a string or binary array; `None` for other
/// types and past [`SET_MAX_BYTES`].
fn byte_set(values: &ArrayRef) -> Option<hashbrown::HashSet<Box<[u8]>>> {
    let mut set = hashbrown::HashSet::new();
    let mut bytes = 0;
    for value in bytes_of(values)?.flatten() {
        if !set.contains(value) {
            bytes += value.len();
            if bytes > SET_MAX_BYTES {
                return None;
            }
            set.insert(Box::from(value));
        }
    }
    Some(set)
}

/// The values of a string or binary array as bytes; `None` for other types.
fn bytes_of(array: &ArrayRef) -> Option<Box<dyn Iterator<Item = Option<&[u8]>> + '_>> {
    Some(match array.data_type() {
        DataType::Utf8 => Box::new(array.as_string::<i32>().iter().map(|value| value.map(str::as_bytes))),
        DataType::LargeUtf8 => Box::new(array.as_string::<i64>().iter().map(|value| value.map(str::as_bytes))),
        DataType::Utf8View => Box::new(array.as_string_view().iter().map(|value| value.map(str::as_bytes))),
        DataType::Binary => Box::new(array.as_binary::<i32>().iter()),
        DataType::LargeBinary => Box::new(array.as_binary::<i64>().iter()),
        DataType::BinaryView => Box::new(array.as_binary_view().iter()),
        _ => return None,
    })
}

/// The values of an integer or date array as `Int64`, which holds each of
/// them exactly; `None` for other types.
fn as_i64(array: &ArrayRef) -> Option<ArrayRef> {
    match array.data_type() {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::Date64 => cast(array, &DataType::Int64).ok(),
        DataType::Date32 => cast(&cast(array, &DataType::Int32).ok()?, &DataType::Int64).ok(),
        _ => None,
    }
}

impl PhysicalExpr for KeySetExpr {
    fn data_type(&self, _schema: &Schema) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn nullable(&self, schema: &Schema) -> Result<bool> {
        self.key.nullable(schema)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        let keys = self.key.evaluate(batch)?.into_array(batch.num_rows())?;
        // A key of a type the set was not made for (the scan's file may
        // hold the column as another type) is not ruled out.
        let found = self.values.found(&keys).unwrap_or_else(|| BooleanArray::from(vec![true; keys.len()]));
        Ok(ColumnarValue::Array(Arc::new(found)))
    }

    fn children(&self) -> Vec<&PhysicalExprRef> {
        vec![&self.key]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<PhysicalExprRef>) -> Result<PhysicalExprRef> {
        let [key] = <[PhysicalExprRef; 1]>::try_from(children).map_err(|children| {
            datafusion::error::DataFusionError::Internal(format!(
                "a build key set takes one key expression, not {}",
                children.len()
            ))
        })?;
        Ok(Arc::new(Self { key, values: Arc::clone(&self.values) }))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.key.fmt_sql(f)?;
        write!(f, " IN ({} build keys)", self.values.len())
    }
}

impl fmt::Display for KeySetExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} IN ({} build keys)", self.key, self.values.len())
    }
}

/// Equal where the key is and the values are the same set, compared by
/// reference: each join's build sides make a set of their own.
impl PartialEq for KeySetExpr {
    fn eq(&self, other: &Self) -> bool {
        self.key.eq(&other.key) && Arc::ptr_eq(&self.values, &other.values)
    }
}

impl Eq for KeySetExpr {}

impl Hash for KeySetExpr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key.hash(state);
        Arc::as_ptr(&self.values).hash(state);
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{
        BinaryArray, Date32Array, Float64Array, Int32Array, Int64Array, LargeStringArray, StringArray, StringViewArray,
        UInt32Array,
    };
    use arrow::datatypes::Field;
    use datafusion::physical_expr::expressions::Column;

    use super::*;

    fn passing(expr: &KeySetExpr, probe: ArrayRef) -> Result<Vec<Option<bool>>> {
        let schema = Arc::new(Schema::new(vec![Field::new("k", probe.data_type().clone(), true)]));
        let batch = RecordBatch::try_new(schema, vec![probe])?;
        let passes = expr.evaluate(&batch)?.into_array(batch.num_rows())?;
        Ok(passes.as_boolean().iter().collect())
    }

    fn key() -> PhysicalExprRef {
        Arc::new(Column::new("k", 0))
    }

    /// Dense values (a bitmap) and sparse ones (a hash set), negative ones
    /// and the extremes of `i64` among them: exactly the build values pass,
    /// NULL stays NULL, and a NULL build value matches nothing.
    #[test]
    fn exactly_the_build_values_pass() -> Result<()> {
        let dense: ArrayRef = Arc::new(Int64Array::from(vec![Some(-3), Some(0), None, Some(5), Some(5), Some(64)]));
        let sparse: ArrayRef = Arc::new(Int64Array::from(vec![Some(i64::MIN), Some(-3), Some(5), Some(i64::MAX)]));
        let probe: ArrayRef =
            Arc::new(Int64Array::from(vec![Some(-3), Some(-4), None, Some(5), Some(64), Some(65), Some(i64::MAX)]));
        let dense_set = KeySetExpr::try_new(key(), &dense).expect("integers have a set");
        assert!(
            matches!(*dense_set.values, Values::Integers(Integers::Bitmap { count: 4, .. })),
            "{:?}",
            dense_set.values
        );
        let expected = [Some(true), Some(false), None, Some(true), Some(true), Some(false), Some(false)];
        assert_eq!(passing(&dense_set, Arc::clone(&probe))?, expected);
        let sparse_set = KeySetExpr::try_new(key(), &sparse).expect("integers have a set");
        assert!(matches!(*sparse_set.values, Values::Integers(Integers::Hashed(_))), "{:?}", sparse_set.values);
        let expected = [Some(true), Some(false), None, Some(true), Some(false), Some(false), Some(true)];
        assert_eq!(passing(&sparse_set, probe)?, expected);
        assert_eq!(sparse_set.to_string(), "k@0 IN (4 build keys)");
        Ok(())
    }

    /// Narrower integers and dates are compared by value, whatever type the
    /// probe column comes in; a probe column of a type with no set passes.
    #[test]
    fn integers_of_any_width_and_dates_compare_by_value() -> Result<()> {
        let build: ArrayRef = Arc::new(Int32Array::from(vec![7, 1 << 20]));
        let set = KeySetExpr::try_new(key(), &build).expect("integers have a set");
        let wider: ArrayRef = Arc::new(Int64Array::from(vec![7, 8, 1 << 20]));
        assert_eq!(passing(&set, wider)?, [Some(true), Some(false), Some(true)]);
        let unsigned: ArrayRef = Arc::new(UInt32Array::from(vec![7, 9]));
        assert_eq!(passing(&set, unsigned)?, [Some(true), Some(false)]);
        let days: ArrayRef = Arc::new(Date32Array::from(vec![19_000, 19_005]));
        let dates = KeySetExpr::try_new(key(), &days).expect("dates have a set");
        assert_eq!(passing(&dates, Arc::new(Date32Array::from(vec![19_005, 19_001])))?, [Some(true), Some(false)]);
        let floats: ArrayRef = Arc::new(Float64Array::from(vec![7.0]));
        assert!(KeySetExpr::try_new(key(), &floats).is_none(), "floats have no set");
        assert_eq!(passing(&set, floats)?, [Some(true)]);
        Ok(())
    }

    /// Strings and binary values compare by their bytes, whichever of
    /// Arrow's layouts each side comes in; integers against strings rule
    /// nothing out.
    #[test]
    fn strings_compare_by_their_bytes_in_any_layout() -> Result<()> {
        let build: ArrayRef = Arc::new(StringArray::from(vec![Some("ALGERIA"), None, Some(""), Some("ALGERIA")]));
        let set = KeySetExpr::try_new(key(), &build).expect("strings have a set");
        assert_eq!(set.to_string(), "k@0 IN (2 build keys)");
        let views: ArrayRef = Arc::new(StringViewArray::from(vec![Some("ALGERIA"), Some("algeria"), None, Some("")]));
        assert_eq!(passing(&set, views)?, [Some(true), Some(false), None, Some(true)]);
        let large: ArrayRef = Arc::new(LargeStringArray::from(vec!["BRAZIL", "ALGERIA"]));
        assert_eq!(passing(&set, large)?, [Some(false), Some(true)]);
        let binary: ArrayRef = Arc::new(BinaryArray::from(vec![b"ALGERIA".as_slice()]));
        assert_eq!(passing(&set, binary)?, [Some(true)]);
        assert_eq!(passing(&set, Arc::new(Int64Array::from(vec![1])))?, [Some(true)]);
        Ok(())
    }

    /// Strings beyond the set's bytes have no set, rather than one that
    /// outgrows its bound.
    #[test]
    fn strings_past_the_bound_have_no_set() {
        let long = "x".repeat(1 << 20);
        let build: ArrayRef = Arc::new(StringArray::from_iter_values((0..65).map(|i| format!("{i}{long}"))));
        assert!(KeySetExpr::try_new(key(), &build).is_none(), "65 MiB of strings got a set");
    }

    /// No build value: nothing passes but NULL, which stays NULL.
    #[test]
    fn an_empty_set_passes_nothing() -> Result<()> {
        let build: ArrayRef = Arc::new(Int64Array::from(vec![None::<i64>]));
        let set = KeySetExpr::try_new(key(), &build).expect("integers have a set");
        assert_eq!(passing(&set, Arc::new(Int64Array::from(vec![Some(1), None])))?, [Some(false), None]);
        Ok(())
    }
}
