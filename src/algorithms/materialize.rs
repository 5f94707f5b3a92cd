//! Materialize phase: output columns gathered from positions.

use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, RecordBatchOptions, new_null_array};
use arrow::datatypes::DataType;
use arrow::record_batch::RecordBatch;
use datafusion::common::internal_err;
use datafusion::error::Result;

use super::JoinDefinition;
use super::OutputColumn;
use super::host_rows::{HostRows, TakenRows};
use super::semantics::{OutputRows, SideRows};
use super::side::{ColumnPlacement, SideView};
use crate::arrays::{concat_arrays, owned_if_shared, owned_rows};
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

/// The output of a probe chunk whose rows are each probe row once, in
/// order ([`super::semantics::each_probe_row_once`]): the build side's
/// columns gathered and downloaded whole, and the probe side's as they
/// came. A batch the chunk came in of at least half `batch_rows` rows is an
/// output batch with its own probe columns, not copied; smaller ones are
/// joined up to that size, so that a probe input of small batches does not
/// become as many small output batches.
pub(crate) fn probe_rows_passed_through<B: JoinBackend>(
    backend: &B,
    definition: &JoinDefinition,
    rows: &OutputRows<B>,
    build: &SideView<'_, B>,
    probe: &HostRows,
    batch_rows: usize,
) -> Result<Vec<RecordBatch>> {
    let schema = &definition.output_schema;
    let mut build_gather = SideGather::new(build, &rows.build);
    let build_columns = definition
        .output_columns
        .iter()
        .zip(schema.fields())
        .map(|(column, field)| match column {
            OutputColumn::Build(i) => build_gather.column(backend, *i, field.data_type(), rows.len).map(Some),
            OutputColumn::Probe(_) => Ok(None),
            OutputColumn::Mark => internal_err!("a mark column among probe rows passed through"),
        })
        .collect::<Result<Vec<_>>>()?;
    let parts: Vec<&RecordBatch> = probe.parts().iter().filter(|part| part.num_rows() > 0).collect();
    let (mut start, mut first) = (0, 0);
    let mut batches = vec![];
    while first < parts.len() {
        let (mut end, mut len) = (first, 0);
        while end < parts.len() && len < batch_rows.div_ceil(2) {
            len += parts[end].num_rows();
            end += 1;
        }
        let group = &parts[first..end];
        let columns = definition
            .output_columns
            .iter()
            .zip(&build_columns)
            .map(|(column, built)| match (column, built) {
                // Over the slice's own rows: a slice of the whole column
                // would count the whole column's memory.
                (_, Some(built)) => owned_rows(&built.slice(start, len)),
                (OutputColumn::Probe(i), None) => match group {
                    [part] => owned_if_shared(part.column(*i)),
                    _ => concat_arrays(&group.iter().map(|part| part.column(*i).as_ref()).collect::<Vec<_>>()),
                },
                _ => internal_err!("an output column of neither side"),
            })
            .collect::<Result<Vec<_>>>()?;
        batches.push(RecordBatch::try_new_with_options(
            Arc::clone(schema),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(len)),
        )?);
        (start, first) = (start + len, end);
    }
    Ok(batches)
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
