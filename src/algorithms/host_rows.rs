//! A side's rows on the host: the batches they came in, and the columns
//! the join moves to the backend assembled whole.
//!
//! Columns that stay on the host are never assembled: the rows the join
//! emits are taken from the batches they came in. A probe chunk of which
//! few rows match so moves and copies only its keys and the matched rows'
//! values, not every row's.

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use arrow::array::{Array, ArrayData, ArrayRef, UInt32Array, make_array, new_empty_array, new_null_array};
use arrow::buffer::MutableBuffer;
use arrow::compute::take;
use arrow::datatypes::{FieldRef, SchemaRef};
use arrow::record_batch::RecordBatch;
use datafusion::common::internal_err;
use datafusion::error::Result;
use rayon::prelude::*;

use crate::arrays::{
    concat_arrays, concat_record_batches, copy_values, copy_values_in_parallel, interleave_arrays, value_offsets,
};
use crate::backend::JoinBackend;
use crate::values::value_width;

/// A side's rows on the host (the build side, or a probe chunk). Cloned in
/// constant time: a build side is thousands of DataFusion's batches, whose
/// clones, and their drops, would each touch every batch.
#[derive(Clone)]
pub struct HostRows {
    /// The side's input schema.
    schema: SchemaRef,
    /// The batches the rows came in, in order; at least one.
    parts: Arc<[RecordBatch]>,
    /// The side's row at which each part starts, ascending.
    starts: Arc<[usize]>,
    /// The part that holds the first row of each block of
    /// `1 << BLOCK_SHIFT` rows: a row is located from its block's part in a
    /// step or two where parts are DataFusion's batches, not by a search.
    block_parts: Arc<[usize]>,
    rows: usize,
    /// Per column of the schema: the column whole, for the columns the
    /// join may move to the backend; the others are taken from `parts`.
    whole: Vec<Option<ArrayRef>>,
    /// Per column of the schema: its longest value among the parts (bytes
    /// of a string, values of a list), found when first asked.
    longest: Arc<[OnceLock<usize>]>,
}

impl HostRows {
    /// Rows that came in `parts`, with the columns in `whole` assembled.
    pub fn new(schema: SchemaRef, mut parts: Vec<RecordBatch>, whole: Vec<Option<ArrayRef>>) -> Self {
        if parts.is_empty() {
            parts.push(RecordBatch::new_empty(Arc::clone(&schema)));
        }
        let mut starts = Vec::with_capacity(parts.len());
        let mut rows = 0;
        for part in &parts {
            starts.push(rows);
            rows += part.num_rows();
        }
        let mut part = 0;
        let block_parts = (0..rows.div_ceil(1 << BLOCK_SHIFT))
            .map(|block| {
                part = part_from(&starts, part, block << BLOCK_SHIFT);
                part
            })
            .collect();
        let longest = schema.fields().iter().map(|_| OnceLock::new()).collect();
        Self { schema, parts: parts.into(), starts: starts.into(), block_parts, rows, whole, longest }
    }

    /// The same rows with exactly `columns` whole: those not whole yet
    /// assembled for `backend`.
    pub(crate) fn with_whole_columns<B: JoinBackend>(&self, backend: &B, columns: &[usize]) -> Result<Self> {
        let missing: Vec<usize> = columns.iter().copied().filter(|&i| self.whole_column(i).is_none()).collect();
        let mut whole = assemble_columns(backend, &self.schema, &self.parts, self.rows, &missing)?;
        for &i in columns {
            if let (Some(column @ None), Some(mine)) = (whole.get_mut(i), self.whole_column(i)) {
                *column = Some(Arc::clone(mine));
            }
        }
        Ok(Self { whole, ..self.clone() })
    }

    /// The same rows with `columns` whole as well, concatenated on the host
    /// for the host's own reads: rows taken many times over from a whole
    /// column cost a lookup each, from the parts a search and a copy each.
    pub(crate) fn with_host_columns(&self, columns: &[usize]) -> Result<Self> {
        let mut whole = self.whole.clone();
        for &i in columns {
            if self.whole_column(i).is_some() || self.parts.len() == 1 {
                continue;
            }
            let arrays: Vec<&dyn Array> = self.parts.iter().map(|p| p.column(i).as_ref()).collect();
            match whole.get_mut(i) {
                Some(column) => *column = Some(concat_arrays(&arrays)?),
                None => return internal_err!("column {i} of a side of {} columns made whole", whole.len()),
            }
        }
        Ok(Self { whole, ..self.clone() })
    }

    /// Column `index`, of a type `backend` holds, in backend memory: the
    /// column whole where it was assembled; else copied from the parts
    /// straight into the memory its transfer reads, where its values lie
    /// end to end and none is null, or concatenated first.
    pub(crate) fn upload_column<B: JoinBackend>(&self, backend: &B, index: usize) -> Result<B::Column> {
        if let Some(column) = self.whole_column(index) {
            return backend.upload_column(column);
        }
        if let [part] = &self.parts[..] {
            return backend.upload_column(part.column(index));
        }
        let arrays: Vec<&dyn Array> = self.parts.iter().map(|p| p.column(index).as_ref()).collect();
        match end_to_end_width(&arrays) {
            Some(width) => {
                let fill = |first, out: &mut [u8]| copy_values(&arrays, &self.starts, width, first, out);
                backend.upload_values(self.field(index)?.data_type(), self.rows, &fill, &arrays)
            }
            None => backend.upload_column(&concat_arrays(&arrays)?),
        }
    }

    /// Rows that are one batch, every column whole.
    pub fn whole(batch: RecordBatch) -> Self {
        let whole = batch.columns().iter().cloned().map(Some).collect();
        Self::new(batch.schema(), vec![batch], whole)
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub(crate) fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    pub(crate) fn parts(&self) -> &[RecordBatch] {
        &self.parts
    }

    /// Column `index` whole, where it was assembled for the backend.
    pub(crate) fn whole_column(&self, index: usize) -> Option<&ArrayRef> {
        self.whole.get(index).and_then(Option::as_ref)
    }

    /// Every column of the rows as one batch, for the paths that hand the
    /// rows on (retries, DataFusion's operator); a copy unless the rows are
    /// one batch.
    pub fn whole_batch(&self) -> Result<RecordBatch> {
        match &self.parts[..] {
            [batch] => Ok(batch.clone()),
            parts => concat_record_batches(&self.schema, parts, true),
        }
    }

    /// The longest value of column `index` (bytes of a string or binary,
    /// values of a list or map) among the side's rows; 0 for columns of
    /// other types, which hold no values behind offsets.
    pub(crate) fn longest_value(&self, index: usize) -> usize {
        let Some(longest) = self.longest.get(index) else {
            return 0;
        };
        *longest.get_or_init(|| {
            self.parts
                .par_iter()
                .filter_map(|part| value_offsets(part.column(index).as_ref()))
                .map(|offsets| offsets.windows(2).map(|w| (w[1] - w[0]) as usize).max().unwrap_or(0))
                .max()
                .unwrap_or(0)
        })
    }

    /// The schema's field of column `index`.
    fn field(&self, index: usize) -> Result<&FieldRef> {
        match self.schema.fields().get(index) {
            Some(field) => Ok(field),
            None => internal_err!("column {index} taken of a side of {} columns", self.schema.fields().len()),
        }
    }

    /// `(part, row within the part)` of each of `rows` (each below
    /// `self.rows`); null rows (outer-join padding) lie in a one-row null
    /// array after the parts.
    fn locate(&self, rows: &UInt32Array) -> Vec<(usize, usize)> {
        let padding = self.parts.len();
        rows.iter()
            .map(|row| match row {
                None => (padding, 0),
                Some(row) => {
                    let row = row as usize;
                    let from = self.block_parts.get(row >> BLOCK_SHIFT).copied().unwrap_or(0);
                    let part = part_from(&self.starts, from, row);
                    (part, row - self.starts[part])
                }
            })
            .collect()
    }
}

/// Rows per block of [`HostRows`]'s part lookup.
const BLOCK_SHIFT: u32 = 10;

/// The part that holds `row`, searched forward from part `from`, which
/// starts at or before it: the last part starting at or before the row
/// (empty parts starting at the same row come before it).
fn part_from(starts: &[usize], mut from: usize, row: usize) -> usize {
    while starts.get(from + 1).is_some_and(|&next| next <= row) {
        from += 1;
    }
    from
}

/// Columns of a [`HostRows`] taken at the same rows.
pub(crate) struct TakenRows<'a> {
    host: &'a HostRows,
    /// Null where the output row has no row of this side.
    rows: UInt32Array,
    /// Where the rows lie in the parts: found when a column that is not
    /// whole is first taken.
    located: Option<Vec<(usize, usize)>>,
}

impl<'a> TakenRows<'a> {
    pub fn new(host: &'a HostRows, rows: UInt32Array) -> Result<Self> {
        if let Some(row) = rows.iter().flatten().find(|&row| row as usize >= host.rows) {
            return internal_err!("row {row} taken of {} host rows", host.rows);
        }
        Ok(Self { host, rows, located: None })
    }

    /// Column `index` at the rows, null where a row is null.
    pub fn column(&mut self, index: usize) -> Result<ArrayRef> {
        self.column_in(index, 0..self.rows.len())
    }

    /// Column `index` at the rows `within` of those taken.
    pub fn column_in(&mut self, index: usize, within: Range<usize>) -> Result<ArrayRef> {
        let host = self.host;
        let rows = self.rows.slice(within.start, within.len());
        if let Some(column) = host.whole_column(index) {
            return Ok(take(column.as_ref(), &rows, None)?);
        }
        if let [part] = &host.parts[..] {
            return Ok(take(part.column(index).as_ref(), &rows, None)?);
        }
        let field = host.field(index)?;
        let located = self.located.get_or_insert_with(|| host.locate(&self.rows));
        let padding = (rows.null_count() > 0).then(|| new_null_array(field.data_type(), 1));
        let mut arrays: Vec<&dyn Array> = host.parts.iter().map(|p| p.column(index).as_ref()).collect();
        arrays.extend(padding.as_deref());
        interleave_arrays(&arrays, &located[within])
    }

    /// The length of column `index`'s value at each row taken (bytes of a
    /// string, values of a list), 0 where a row is null or the column
    /// holds no values behind offsets.
    pub fn value_lengths(&mut self, index: usize) -> Vec<usize> {
        let host = self.host;
        let length = |array: &ArrayRef, row: usize| {
            value_offsets(array.as_ref()).map_or(0, |offsets| (offsets[row + 1] - offsets[row]) as usize)
        };
        if let Some(column) = host.whole_column(index) {
            return self.rows.iter().map(|row| row.map_or(0, |row| length(column, row as usize))).collect();
        }
        let located = self.located.get_or_insert_with(|| host.locate(&self.rows));
        let padding = host.parts.len();
        located
            .iter()
            .map(|&(part, row)| match part == padding {
                true => 0,
                false => length(host.parts[part].column(index), row),
            })
            .collect()
    }
}

/// Per column of `schema`: the column whole where it is in `columns`,
/// concatenated in parallel unless `batches` are one batch.
pub fn assemble_columns<B: JoinBackend>(
    backend: &B,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    rows: usize,
    columns: &[usize],
) -> Result<Vec<Option<ArrayRef>>> {
    (0..schema.fields().len())
        .into_par_iter()
        .map(|i| {
            if !columns.contains(&i) {
                return Ok(None);
            }
            match batches {
                [] => Ok(Some(new_empty_array(schema.field(i).data_type()))),
                [batch] => Ok(Some(Arc::clone(batch.column(i)))),
                _ => {
                    let arrays: Vec<&dyn Array> = batches.iter().map(|b| b.column(i).as_ref()).collect();
                    concat_column(backend, &arrays, rows).map(Some)
                }
            }
        })
        .collect()
}

/// One column of a chunk: columns whose values lie end to end, none null,
/// are copied into place piece by piece in parallel, into the backend's
/// transfer memory when it has some; others are concatenated by
/// [`concat_arrays`].
fn concat_column<B: JoinBackend>(backend: &B, arrays: &[&dyn Array], rows: usize) -> Result<ArrayRef> {
    let (Some(width), Some(first)) = (end_to_end_width(arrays), arrays.first()) else {
        return concat_arrays(arrays);
    };
    let bytes = rows * width;
    if let Some(buffer) = backend.joined_in_place(arrays, width) {
        // Consecutive batches of a table kept in the backend's transfer
        // memory: already end to end where they lie.
        let data = ArrayData::builder(first.data_type().clone()).len(rows).add_buffer(buffer).build()?;
        return Ok(make_array(data));
    }
    let mut memory = backend.transfer_memory(bytes);
    let mut fresh = MutableBuffer::new(0);
    let target = match memory.as_mut() {
        Some(memory) => memory.bytes_mut(bytes)?,
        None => {
            fresh = MutableBuffer::from_len_zeroed(bytes);
            fresh.as_slice_mut()
        }
    };
    copy_values_in_parallel(arrays, width, target)?;
    let buffer = match memory {
        Some(memory) => memory.into_buffer(bytes)?,
        None => fresh.into(),
    };
    let data = ArrayData::builder(first.data_type().clone()).len(rows).add_buffer(buffer).build()?;
    Ok(make_array(data))
}

/// Bytes per value of `arrays` where their values lie end to end in one
/// buffer and none is null: they are then copied as bytes.
fn end_to_end_width(arrays: &[&dyn Array]) -> Option<usize> {
    let width = value_width(arrays.first()?.data_type())?;
    arrays.iter().all(|a| a.null_count() == 0).then_some(width)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringViewArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use crate::backend::cpu::CpuBackend;

    fn batch(schema: &SchemaRef, values: std::ops::Range<i64>) -> RecordBatch {
        let names: StringViewArray = values.clone().map(|v| Some(format!("name of row number {v}"))).collect();
        let numbers: Int64Array = values.map(|v| (v % 3 != 0).then_some(v)).collect();
        RecordBatch::try_new(Arc::clone(schema), vec![Arc::new(numbers), Arc::new(names)]).unwrap()
    }

    #[test]
    fn rows_taken_from_parts_equal_rows_taken_from_the_whole() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("n", DataType::Int64, true),
            Field::new("s", DataType::Utf8View, false),
        ]));
        // Empty parts among them, which start where the next one does.
        let parts = vec![batch(&schema, 0..5), batch(&schema, 5..5), batch(&schema, 5..17), batch(&schema, 17..40)];
        let rows = HostRows::new(Arc::clone(&schema), parts, vec![None, None]);
        let whole = HostRows::whole(rows.whole_batch().unwrap());
        let picks = UInt32Array::from(vec![Some(39), None, Some(0), Some(5), Some(16), Some(17), Some(4), None]);
        let (mut from_parts, mut from_whole) =
            (TakenRows::new(&rows, picks.clone()).unwrap(), TakenRows::new(&whole, picks).unwrap());
        for column in 0..2 {
            let expected = from_whole.column(column).unwrap();
            assert_eq!(from_parts.column(column).unwrap().as_ref(), expected.as_ref());
            assert_eq!(expected.null_count(), 2 + usize::from(column == 0) * 2);
        }
        let backend = CpuBackend::open(&(), Arc::default()).unwrap();
        let first_whole = rows.with_whole_columns(&backend, &[0]).unwrap();
        assert_eq!(first_whole.whole_column(0).unwrap().as_ref(), whole.whole_column(0).unwrap().as_ref());
        assert!(first_whole.whole_column(1).is_none());
        assert!(whole.with_whole_columns(&backend, &[1]).unwrap().whole_column(0).is_none());
        for side in [&rows, &whole] {
            let error = TakenRows::new(side, UInt32Array::from(vec![40])).err().unwrap().to_string();
            assert!(error.contains("row 40 taken of 40 host rows"), "{error}");
        }
    }

    /// Columns uploaded from their parts, copied piece by piece at any byte
    /// offset, equal the columns concatenated: parts that are slices, empty
    /// parts, and columns with nulls or of strings, which are concatenated.
    #[test]
    fn columns_uploaded_from_parts_equal_the_columns_concatenated() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("n", DataType::Int64, true),
            Field::new("s", DataType::Utf8View, false),
        ]));
        let whole_numbers = |values: std::ops::Range<i64>| {
            let names: StringViewArray = values.clone().map(|v| Some(format!("{v}"))).collect();
            let numbers = Int64Array::from_iter_values(values);
            RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(numbers), Arc::new(names)]).unwrap()
        };
        let without_nulls = vec![
            whole_numbers(0..10).slice(3, 7),
            whole_numbers(10..10),
            whole_numbers(10..25),
            whole_numbers(25..40).slice(0, 9),
        ];
        let with_nulls = vec![batch(&schema, 0..7), batch(&schema, 7..30)];
        let backend = CpuBackend::open(&(), Arc::default()).unwrap();
        for parts in [without_nulls, with_nulls] {
            let rows = HostRows::new(Arc::clone(&schema), parts, vec![None, None]);
            let whole = rows.whole_batch().unwrap();
            for column in 0..2 {
                let uploaded = backend.download_column(&rows.upload_column(&backend, column).unwrap()).unwrap();
                assert_eq!(uploaded.as_ref(), whole.column(column).as_ref());
            }
        }
        let parts = [whole_numbers(0..10).slice(3, 7), whole_numbers(10..10), whole_numbers(10..25)];
        let arrays: Vec<&dyn Array> = parts.iter().map(|p| p.column(0).as_ref()).collect();
        let expected: Vec<u8> = (3..25i64).flat_map(i64::to_le_bytes).collect();
        for (first, len) in [(0, 176), (3, 17), (55, 1), (56, 120), (100, 76)] {
            let mut out = vec![0; len];
            copy_values(&arrays, &[0, 7, 7], 8, first, &mut out).unwrap();
            assert_eq!(out, expected[first..first + len], "bytes {first}..{}", first + len);
        }
        let mut beyond = vec![0; 9];
        assert!(copy_values(&arrays, &[0, 7, 7], 8, 170, &mut beyond).is_err());
    }
}
