//! Materialize phase: output columns gathered from positions.

use std::ops::Range;
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
use crate::backend::{Admitted, JoinBackend, positions_to_indices};

/// How output batches are cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputLimits {
    /// Rows per output batch the session asks for (`batch_size`), which
    /// probe rows passed through are grouped up to.
    pub batch_rows: usize,
    /// The most values one output array holds behind 32-bit offsets
    /// ([`crate::values::MAX_ARRAY_VALUES`] but in tests).
    pub array_values: usize,
}

/// Builds the output batches: device-held columns are gathered on the
/// backend and downloaded, and the rows of the columns taken on the host
/// found; then `admission` is let go, the job's device work being over, and
/// the columns on the host are taken from original rows. Rows are cut into
/// batches only where a column taken on the host would hold more than
/// `array_values` values behind its 32-bit offsets in one array (strings of
/// more than 2 GiB, say): one batch otherwise.
pub(crate) fn output_batches<B: JoinBackend>(
    backend: &B,
    definition: &JoinDefinition,
    rows: &OutputRows<B>,
    build: &SideView<'_, B>,
    probe: Option<&SideView<'_, B>>,
    array_values: usize,
    admission: &mut Admitted,
) -> Result<Vec<RecordBatch>> {
    let schema = &definition.output_schema;
    if rows.len == 0 {
        return Ok(vec![]);
    }
    let mut build_gather = SideGather::new(build, &rows.build);
    let mut probe_gather = probe.map(|view| SideGather::new(view, &rows.probe));
    let downloaded = download_then_let_go(backend, definition, &mut build_gather, probe_gather.as_mut(), admission)?;
    let mut lengths = vec![];
    for column in &definition.output_columns {
        let found = match column {
            OutputColumn::Build(i) => build_gather.value_lengths(*i, rows.len, array_values)?,
            OutputColumn::Probe(i) => match probe_gather.as_mut() {
                Some(gather) => gather.value_lengths(*i, rows.len, array_values)?,
                None => None,
            },
            OutputColumn::Mark => None,
        };
        lengths.extend(found);
    }
    let windows = windows_within(&lengths, rows.len, array_values);
    let columns = definition
        .output_columns
        .iter()
        .zip(schema.fields())
        .zip(downloaded)
        .map(|((column, field), downloaded)| match column {
            OutputColumn::Build(i) => build_gather.columns(*i, field.data_type(), rows.len, &windows, downloaded),
            OutputColumn::Probe(i) => match probe_gather.as_mut() {
                Some(gather) => gather.columns(*i, field.data_type(), rows.len, &windows, downloaded),
                None => Ok(windows.iter().map(|w| new_null_array(field.data_type(), w.len())).collect()),
            },
            OutputColumn::Mark => match &rows.mark {
                Some(mark) => Ok(windows
                    .iter()
                    .map(|w| Arc::new(BooleanArray::from(mark[w.clone()].to_vec())) as ArrayRef)
                    .collect()),
                None => internal_err!("mark column requested from rows without marks"),
            },
        })
        .collect::<Result<Vec<Vec<ArrayRef>>>>()?;
    let batches = (0..windows.len()).map(|w| {
        let window_columns = columns.iter().map(|column| Arc::clone(&column[w])).collect();
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(schema),
            window_columns,
            &RecordBatchOptions::new().with_row_count(Some(windows[w].len())),
        )?)
    });
    batches.collect()
}

/// Consecutive windows of `rows` rows, as few as may be, in each of which
/// every column of `lengths` (one length per row) sums to at most `limit`;
/// a row longer than `limit` is a window of its own.
fn windows_within(lengths: &[Vec<usize>], rows: usize, limit: usize) -> Vec<Range<usize>> {
    if lengths.is_empty() {
        return std::iter::once(0..rows).collect();
    }
    let (mut windows, mut start, mut sums) = (vec![], 0, vec![0usize; lengths.len()]);
    for row in 0..rows {
        let over = lengths.iter().zip(&sums).any(|(column, sum)| sum + column[row] > limit);
        if over && row > start {
            windows.push(start..row);
            start = row;
            sums.iter_mut().for_each(|sum| *sum = 0);
        }
        for (sum, column) in sums.iter_mut().zip(lengths) {
            *sum += column[row];
        }
    }
    windows.push(start..rows);
    windows
}

/// The output of a probe chunk whose rows are each probe row once, in
/// order ([`super::semantics::each_probe_row_once`]): the build side's
/// columns gathered and downloaded whole, `admission` let go, those on the
/// host taken batch by batch, and the probe side's as they came. A batch
/// the chunk came in of at least half `batch_rows` rows is an output batch
/// with its own probe columns, not copied; smaller ones are joined up to
/// that size, so that a probe input of small batches does not become as
/// many small output batches.
pub(crate) fn probe_rows_passed_through<B: JoinBackend>(
    backend: &B,
    definition: &JoinDefinition,
    rows: &OutputRows<B>,
    build: &SideView<'_, B>,
    probe: &HostRows,
    batch_rows: usize,
    admission: &mut Admitted,
) -> Result<Vec<RecordBatch>> {
    let schema = &definition.output_schema;
    let parts: Vec<&RecordBatch> = probe.parts().iter().filter(|part| part.num_rows() > 0).collect();
    // Each output batch: a group of the chunk's batches, and its rows.
    let (mut groups, mut windows, mut first, mut start) = (vec![], vec![], 0, 0);
    while first < parts.len() {
        let (mut end, mut len) = (first, 0);
        while end < parts.len() && len < batch_rows.div_ceil(2) {
            len += parts[end].num_rows();
            end += 1;
        }
        groups.push(&parts[first..end]);
        windows.push(start..start + len);
        (start, first) = (start + len, end);
    }
    let mut build_gather = SideGather::new(build, &rows.build);
    let downloaded = download_then_let_go(backend, definition, &mut build_gather, None, admission)?;
    let build_columns = definition
        .output_columns
        .iter()
        .zip(schema.fields())
        .zip(downloaded)
        .map(|((column, field), downloaded)| match column {
            OutputColumn::Build(i) => {
                build_gather.columns(*i, field.data_type(), rows.len, &windows, downloaded).map(Some)
            }
            OutputColumn::Probe(_) => Ok(None),
            OutputColumn::Mark => internal_err!("a mark column among probe rows passed through"),
        })
        .collect::<Result<Vec<_>>>()?;
    let mut batches = Vec::with_capacity(groups.len());
    for (g, (group, window)) in groups.iter().zip(&windows).enumerate() {
        let columns = definition
            .output_columns
            .iter()
            .zip(&build_columns)
            .map(|(column, built)| match (column, built) {
                (_, Some(built)) => Ok(Arc::clone(&built[g])),
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
            &RecordBatchOptions::new().with_row_count(Some(window.len())),
        )?);
    }
    Ok(batches)
}

/// Each output column the device holds, gathered and downloaded whole, in
/// the output's order (`None` for the others), the host rows of the columns
/// taken on the host found; then `admission` let go, as only host work is
/// left.
fn download_then_let_go<B: JoinBackend>(
    backend: &B,
    definition: &JoinDefinition,
    build: &mut SideGather<'_, '_, B>,
    mut probe: Option<&mut SideGather<'_, '_, B>>,
    admission: &mut Admitted,
) -> Result<Vec<Option<ArrayRef>>> {
    let downloaded = definition
        .output_columns
        .iter()
        .map(|column| match (column, probe.as_deref_mut()) {
            (OutputColumn::Build(i), _) => build.download(backend, *i),
            (OutputColumn::Probe(i), Some(gather)) => gather.download(backend, *i),
            (OutputColumn::Probe(_), None) | (OutputColumn::Mark, _) => Ok(None),
        })
        .collect::<Result<Vec<_>>>()?;
    admission.let_go();
    Ok(downloaded)
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

    /// Column `index` gathered on the device and downloaded whole, where
    /// the device holds it; for a column taken on the host, the side's host
    /// rows found, so that only host work is left.
    fn download(&mut self, backend: &B, index: usize) -> Result<Option<ArrayRef>> {
        let SideRows::Positions(positions, may_hold_nulls) = self.rows else {
            return Ok(None);
        };
        let column = match self.view.placements.get(index).and_then(Option::as_ref) {
            Some(ColumnPlacement::Transformed(payload)) => match self.view.payloads.get(*payload) {
                Some(column) => column,
                None => return internal_err!("transformed payload {payload} is missing"),
            },
            Some(ColumnPlacement::Device(column)) => column,
            Some(ColumnPlacement::Host) => {
                self.host_rows(backend)?;
                return Ok(None);
            }
            None => return internal_err!("output column {index} was not placed"),
        };
        Ok(Some(backend.download_column(&backend.gather_column(column, positions, *may_hold_nulls)?)?))
    }

    /// Column `index` of the side at each of `windows` of the output rows,
    /// each over memory of its own: `downloaded` (see [`Self::download`])
    /// where the device held it, taken on the host otherwise.
    fn columns(
        &mut self,
        index: usize,
        data_type: &DataType,
        len: usize,
        windows: &[Range<usize>],
        downloaded: Option<ArrayRef>,
    ) -> Result<Vec<ArrayRef>> {
        let on_host = matches!(self.view.placements.get(index), Some(Some(ColumnPlacement::Host)));
        match (windows, on_host, downloaded) {
            ([window], _, Some(whole)) if window.len() == len => Ok(vec![whole]),
            ([window], _, None) if window.len() == len => Ok(vec![self.column(index, data_type, len)?]),
            (_, true, None) if matches!(self.rows, SideRows::Positions(..)) => {
                windows.iter().map(|w| self.taken_rows()?.column_in(index, w.clone())).collect()
            }
            // Each window over its own memory: a slice of the whole column
            // would count the whole column's memory.
            (_, _, downloaded) => {
                let whole = match downloaded {
                    Some(whole) => whole,
                    None => self.column(index, data_type, len)?,
                };
                windows.iter().map(|w| owned_rows(&whole.slice(w.start, w.len()))).collect()
            }
        }
    }

    /// The value length of column `index` at each output row, where it is
    /// taken on the host and its `len` values might hold more than `limit`
    /// values behind offsets in one array; `None` where they cannot.
    fn value_lengths(&mut self, index: usize, len: usize, limit: usize) -> Result<Option<Vec<usize>>> {
        let on_host = matches!(self.view.placements.get(index), Some(Some(ColumnPlacement::Host)));
        if !on_host || !matches!(self.rows, SideRows::Positions(..)) {
            return Ok(None);
        }
        if self.view.rows.longest_value(index).saturating_mul(len) <= limit {
            return Ok(None);
        }
        Ok(Some(self.taken_rows()?.value_lengths(index)))
    }

    /// The side's host rows at the output rows, found once, on the device
    /// where the side was transformed.
    fn host_rows(&mut self, backend: &B) -> Result<&mut TakenRows<'v>> {
        let SideRows::Positions(positions, _) = self.rows else {
            return internal_err!("host rows taken of a side without positions");
        };
        if self.on_host.is_none() {
            let rows = positions_to_indices(&self.view.original_rows(backend, positions)?);
            self.on_host = Some(TakenRows::new(self.view.rows, rows)?);
        }
        self.taken_rows()
    }

    /// The side's host rows at the output rows, found by [`Self::download`].
    fn taken_rows(&mut self) -> Result<&mut TakenRows<'v>> {
        match self.on_host.as_mut() {
            Some(on_host) => Ok(on_host),
            None => internal_err!("host rows taken before they were found"),
        }
    }

    /// Column `index` where the device did not hold it: taken on the host,
    /// or nulls where the side has no rows in the output.
    fn column(&mut self, index: usize, data_type: &DataType, len: usize) -> Result<ArrayRef> {
        let SideRows::Positions(..) = self.rows else {
            return Ok(new_null_array(data_type, len));
        };
        match self.view.placements.get(index).and_then(Option::as_ref) {
            Some(ColumnPlacement::Host) => self.taken_rows()?.column(index),
            Some(_) => internal_err!("output column {index} of the device was not downloaded"),
            None => internal_err!("output column {index} was not placed"),
        }
    }
}
