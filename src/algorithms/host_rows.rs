//! A side's rows on the host: the batches they came in, and the columns
//! the join moves to the backend assembled whole.
//!
//! Columns that stay on the host are never assembled: the rows the join
//! emits are taken from the batches they came in. A probe chunk of which
//! few rows match so moves and copies only its keys and the matched rows'
//! values, not every row's.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, UInt32Array, new_null_array};
use arrow::compute::{interleave, take};
use arrow::datatypes::{FieldRef, SchemaRef};
use arrow::record_batch::RecordBatch;
use datafusion::common::internal_err;
use datafusion::error::Result;

use crate::arrays::concat_record_batches;

/// A side's rows on the host (the build side, or a probe chunk).
#[derive(Clone)]
pub struct HostRows {
    /// The side's input schema.
    schema: SchemaRef,
    /// The batches the rows came in, in order; at least one.
    parts: Vec<RecordBatch>,
    /// The side's row at which each part starts, ascending.
    starts: Vec<usize>,
    rows: usize,
    /// Per column of the schema: the column whole, for the columns the
    /// join may move to the backend; the others are taken from `parts`.
    whole: Vec<Option<ArrayRef>>,
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
        Self { schema, parts, starts, rows, whole }
    }

    /// Rows that are one batch, every column whole.
    pub fn whole(batch: RecordBatch) -> Self {
        let whole = batch.columns().iter().cloned().map(Some).collect();
        Self::new(batch.schema(), vec![batch], whole)
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns of the side's schema.
    pub(crate) fn columns(&self) -> usize {
        self.schema.fields().len()
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
        match self.parts.as_slice() {
            [batch] => Ok(batch.clone()),
            parts => concat_record_batches(&self.schema, parts),
        }
    }

    /// The schema's field of column `index`.
    fn field(&self, index: usize) -> Result<&FieldRef> {
        match self.schema.fields().get(index) {
            Some(field) => Ok(field),
            None => internal_err!("column {index} taken of a side of {} columns", self.schema.fields().len()),
        }
    }

    /// `(part, row within the part)` of each of `rows`; null rows
    /// (outer-join padding) lie in a one-row null array after the parts.
    fn locate(&self, rows: &UInt32Array) -> Vec<(usize, usize)> {
        let padding = self.parts.len();
        rows.iter()
            .map(|row| match row {
                None => (padding, 0),
                Some(row) => {
                    let row = row as usize;
                    // The last part starting at or before the row: empty
                    // parts that start at the same row come before it.
                    let part = self.starts.partition_point(|&start| start <= row) - 1;
                    (part, row - self.starts[part])
                }
            })
            .collect()
    }
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
        let host = self.host;
        if let Some(column) = host.whole_column(index) {
            return Ok(take(column.as_ref(), &self.rows, None)?);
        }
        if let [part] = host.parts.as_slice() {
            return Ok(take(part.column(index).as_ref(), &self.rows, None)?);
        }
        let field = host.field(index)?;
        let located = self.located.get_or_insert_with(|| host.locate(&self.rows));
        let padding = (self.rows.null_count() > 0).then(|| new_null_array(field.data_type(), 1));
        let mut arrays: Vec<&dyn Array> = host.parts.iter().map(|p| p.column(index).as_ref()).collect();
        arrays.extend(padding.as_deref());
        Ok(interleave(&arrays, located)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringViewArray};
    use arrow::datatypes::{DataType, Field, Schema};

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
        for side in [&rows, &whole] {
            let error = TakenRows::new(side, UInt32Array::from(vec![40])).err().unwrap().to_string();
            assert!(error.contains("row 40 taken of 40 host rows"), "{error}");
        }
    }
}
