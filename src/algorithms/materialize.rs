//! Materialize phase: output columns gathered from positions.

use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, RecordBatchOptions, new_null_array};
use arrow::datatypes::DataType;
use arrow::record_batch::RecordBatch;
use datafusion::common::internal_err;
use datafusion::error::Result;

use super::JoinDefinition;
use super::OutputColumn;
use super::host_rows::TakenRows;
use super::semantics::{OutputRows, SideRows};
use super::side::{ColumnPlacement, SideView};
use crate::backend::{JoinBackend, positions_to_indices};

/// Builds the output batch: device-held columns are gathered on the backend
/// and downloaded; the rest are taken on the host from original rows.
pub(crate) fn output_batch<B: JoinBackend>(
    backend: &B,
    definition: &JoinDefinition,
    rows: &OutputRows<B>,
    build: &SideView<'_, B>,
    probe: Option<&SideView<'_, B>>,
) -> Result<RecordBatch> {
    let schema = &definition.output_schema;
    if rows.len == 0 {
        return Ok(RecordBatch::new_empty(Arc::clone(schema)));
    }
    let mut build_gather = SideGather::new(build, &rows.build);
    let mut probe_gather = probe.map(|view| SideGather::new(view, &rows.probe));
    let columns = definition
        .output_columns
        .iter()
        .zip(schema.fields())
        .map(|(column, field)| match column {
            OutputColumn::Build(i) => build_gather.column(backend, *i, field.data_type(), rows.len),
            OutputColumn::Probe(i) => match probe_gather.as_mut() {
                Some(gather) => gather.column(backend, *i, field.data_type(), rows.len),
                None => Ok(new_null_array(field.data_type(), rows.len)),
            },
            OutputColumn::Mark => match &rows.mark {
                Some(mark) => Ok(Arc::new(BooleanArray::from(mark.clone())) as ArrayRef),
                None => internal_err!("mark column requested from rows without marks"),
            },
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new_with_options(
        Arc::clone(schema),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(rows.len)),
    )?)
}

/// Gathers the columns of one side, computing host row ids at most once.
struct SideGather<'a, 'v, B: JoinBackend> {
    view: &'a SideView<'v, B>,
    rows: &'a SideRows<B>,
    on_host: Option<TakenRows<'v>>,
}

impl<'a, 'v, B: JoinBackend> SideGather<'a, 'v, B> {
    fn new(view: &'a SideView<'v, B>, rows: &'a SideRows<B>) -> Self {
        Self { view, rows, on_host: None }
    }

    fn column(&mut self, backend: &B, index: usize, data_type: &DataType, len: usize) -> Result<ArrayRef> {
        let SideRows::Positions(positions, may_hold_nulls) = self.rows else {
            return Ok(new_null_array(data_type, len));
        };
        match self.view.placements.get(index).and_then(Option::as_ref) {
            Some(ColumnPlacement::Transformed(payload)) => match self.view.payloads.get(*payload) {
                Some(column) => backend.download_column(&backend.gather_column(column, positions, *may_hold_nulls)?),
                None => internal_err!("transformed payload {payload} is missing"),
            },
            Some(ColumnPlacement::Device(column)) => {
                backend.download_column(&backend.gather_column(column, positions, *may_hold_nulls)?)
            }
            Some(ColumnPlacement::Host) => {
                let on_host = match self.on_host.as_mut() {
                    Some(on_host) => on_host,
                    None => {
                        let rows = positions_to_indices(&self.view.original_rows(backend, positions)?);
                        self.on_host.insert(TakenRows::new(self.view.rows, rows)?)
                    }
                };
                on_host.column(index)
            }
            None => internal_err!("output column {index} was not placed"),
        }
    }
}
