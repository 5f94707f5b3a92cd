//! One side of a join as the match and materialize phases see it.

use arrow::array::ArrayRef;
use arrow::datatypes::Schema;
use datafusion::common::internal_err;
use datafusion::error::Result;

use super::host_rows::HostRows;
use crate::backend::{JoinBackend, Space};

/// Where one column of a side is read from when the output is materialized.
pub(crate) enum ColumnPlacement<C> {
    /// Payload `i` of the transformed relation (GFTR).
    Transformed(usize),
    /// An untransformed copy in backend memory, gathered by row (GFUR).
    Device(C),
    /// The host rows, taken from row ids: types the backend does not hold,
    /// and columns the join keeps on the host.
    Host,
}

/// Where each column of a side is read from (`None` for unneeded columns),
/// indexed by column.
pub(crate) type Placements<C> = Vec<Option<ColumnPlacement<C>>>;

/// The needed columns of a side, placed and uploaded.
pub(crate) struct PlacedColumns<C> {
    pub placements: Placements<C>,
    /// Columns to carry through the transform, in payload order.
    pub to_transform: Vec<C>,
}

/// Decides where each needed column of a side lives and uploads it (see
/// [`upload_columns`]), placed for a side transformed in `space`.
pub(crate) fn place_columns<B: JoinBackend>(
    backend: &B,
    rows: &HostRows,
    columns: &[usize],
    to_backend: bool,
    space: Space,
) -> Result<PlacedColumns<B::Column>> {
    Ok(upload_columns(backend, rows, columns, to_backend)?.placed(space))
}

/// The needed columns of a side, uploaded or left on the host, before the
/// space the side is transformed in is known.
pub(crate) struct UploadedColumns<C> {
    /// Columns of the side's schema.
    width: usize,
    /// Each needed column, with its copy in backend memory if it has one.
    columns: Vec<(usize, Option<C>)>,
}

/// Uploads the needed columns of a side: with `to_backend`, those of types
/// the backend holds (see [`HostRows::upload_column`]); the others, and
/// every column without it, are taken on the host.
pub(crate) fn upload_columns<B: JoinBackend>(
    backend: &B,
    rows: &HostRows,
    columns: &[usize],
    to_backend: bool,
) -> Result<UploadedColumns<B::Column>> {
    let held = match to_backend {
        true => columns_held(backend, rows.schema(), columns),
        false => vec![],
    };
    let columns = columns
        .iter()
        .map(|&i| Ok((i, held.contains(&i).then(|| rows.upload_column(backend, i)).transpose()?)))
        .collect::<Result<_>>()?;
    Ok(UploadedColumns { width: rows.schema().fields().len(), columns })
}

impl<C> UploadedColumns<C> {
    /// Where each column is read from in a side transformed in `space`:
    /// uploaded columns are carried through the transform or gathered by
    /// row.
    pub fn placed(self, space: Space) -> PlacedColumns<C> {
        let mut placements: Placements<C> = (0..self.width).map(|_| None).collect();
        let mut to_transform = vec![];
        for (i, column) in self.columns {
            placements[i] = Some(match column {
                None => ColumnPlacement::Host,
                Some(column) if space == Space::Transformed => {
                    to_transform.push(column);
                    ColumnPlacement::Transformed(to_transform.len() - 1)
                }
                Some(column) => ColumnPlacement::Device(column),
            });
        }
        PlacedColumns { placements, to_transform }
    }
}

/// Those of `columns` whose type the backend holds: the columns a side
/// may upload rather than take on the host.
pub(crate) fn columns_held<B: JoinBackend>(backend: &B, schema: &Schema, columns: &[usize]) -> Vec<usize> {
    let held = |&i: &usize| schema.fields().get(i).is_some_and(|f| backend.holds_column(f.data_type()));
    columns.iter().copied().filter(held).collect()
}

/// Whether any needed column of a side is gathered on the host.
pub(crate) fn has_host_columns<C>(placements: &[Option<ColumnPlacement<C>>]) -> bool {
    placements.iter().any(|p| matches!(p, Some(ColumnPlacement::Host)))
}

pub(crate) struct SideView<'a, B: JoinBackend> {
    /// The side's rows on the host.
    pub rows: &'a HostRows,
    /// The key columns whole: always for the build side, for a probe chunk
    /// only where candidates are verified against them.
    pub keys: &'a [ArrayRef],
    pub space: Space,
    pub row_ids: Option<&'a B::Vector<u32>>,
    pub placements: &'a [Option<ColumnPlacement<B::Column>>],
    pub payloads: &'a [B::Column],
    /// The columns the backend compares for the filter, in original row
    /// order, with their indices.
    pub filter_columns: &'a [(usize, B::Column)],
}

impl<B: JoinBackend> SideView<'_, B> {
    /// The original rows of positions in this side's space, on the host.
    pub fn original_rows(&self, backend: &B, positions: &B::Vector<u32>) -> Result<Vec<u32>> {
        match self.original_rows_on_backend(backend, positions)? {
            Some(rows) => backend.download(&rows),
            None => backend.download(positions),
        }
    }

    /// The original rows of positions in this side's space, in backend
    /// memory; `None` where the positions are original rows.
    pub fn original_rows_on_backend(&self, backend: &B, positions: &B::Vector<u32>) -> Result<Option<B::Vector<u32>>> {
        match (self.space, self.row_ids) {
            (Space::Original, _) => Ok(None),
            (Space::Transformed, Some(row_ids)) => Ok(Some(backend.gather_positions(row_ids, positions)?)),
            (Space::Transformed, None) => {
                internal_err!("original rows asked for a side transformed without row ids")
            }
        }
    }

    /// Column `index` as the backend compares it for the filter.
    pub fn filter_column(&self, index: usize) -> Result<&B::Column> {
        match self.filter_columns.iter().find(|(i, _)| *i == index) {
            Some((_, column)) => Ok(column),
            None => internal_err!("the filter's column {index} was not uploaded"),
        }
    }
}

impl<C: Clone> PlacedColumns<C> {
    /// Column `index` in original row order, where it was uploaded: until
    /// the side is transformed, a column to carry through the transform is
    /// still in that order.
    fn original(&self, index: usize) -> Option<&C> {
        match self.placements.get(index)?.as_ref()? {
            ColumnPlacement::Device(column) => Some(column),
            ColumnPlacement::Transformed(payload) => self.to_transform.get(*payload),
            ColumnPlacement::Host => None,
        }
    }
}

/// The columns of a side the backend compares for the filter, in original
/// row order: those the output's placement uploaded shared, the others
/// uploaded.
pub(crate) fn filter_columns<B: JoinBackend>(
    backend: &B,
    rows: &HostRows,
    columns: &[usize],
    placed: &PlacedColumns<B::Column>,
) -> Result<Vec<(usize, B::Column)>> {
    let column = |i: usize| match placed.original(i) {
        Some(column) => Ok(column.clone()),
        None => rows.upload_column(backend, i),
    };
    columns.iter().map(|&i| Ok((i, column(i)?))).collect()
}
