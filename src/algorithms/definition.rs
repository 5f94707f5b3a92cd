use arrow::compute::SortOptions;
use arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::{JoinSide, JoinType, NullEquality};
use datafusion::physical_expr::{LexOrdering, PhysicalExprRef};
use datafusion::physical_plan::joins::utils::{ColumnIndex, JoinFilter};

use super::pair_filter::PairFilter;
use crate::config::{AlgorithmChoice, MaterializationChoice, ProbeOrderChoice};
use crate::keys::{KeyExactness, RawKeys};

/// Probe chunks of up to this many rows keep probe order under
/// `gpu_join.keep_probe_order = auto`.
pub const SMALL_PROBE_CHUNK_ROWS: usize = 1 << 16;

/// Where an output column comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputColumn {
    /// Column `i` of the build (left) side.
    Build(usize),
    /// Column `i` of the probe (right) side.
    Probe(usize),
    /// The mark column of a mark join.
    Mark,
}

/// The order a join's output leaves in when it replaces a sort-merge join
/// whose order the plan relies on: the build side's key order, pairs of
/// one build row in probe order. Such a join is sort-merge on the device,
/// with the build side gathered from its sorted relation, and its probe
/// side is one chunk per partition.
#[derive(Debug, Clone)]
pub struct KeyOrder {
    /// The SQL order of each key column.
    pub sort_options: Vec<SortOptions>,
    /// The ordering the output satisfies, for DataFusion's operator to sort
    /// by when it joins instead.
    pub output_ordering: LexOrdering,
    /// The probe input has an order of its own, which pairs of one build
    /// row keep.
    pub probe_ordered: bool,
}

/// Everything about a join that does not change between executions: the
/// operator builds one from its plan node and hands it to the algorithms.
#[derive(Debug, Clone)]
pub struct JoinDefinition {
    pub join_type: JoinType,
    pub build_keys: Vec<PhysicalExprRef>,
    pub probe_keys: Vec<PhysicalExprRef>,
    pub null_equality: NullEquality,
    /// `NOT IN` semantics for a single-key `LeftAnti` join.
    pub null_aware: bool,
    pub filter: Option<JoinFilter>,
    /// The filter as column comparisons that the backend evaluates, where
    /// it is one and `gpu_join.filter_on_backend` is set.
    pub pair_filter: Option<PairFilter>,
    /// The operator's output schema (after the embedded projection).
    pub output_schema: SchemaRef,
    pub output_columns: Vec<OutputColumn>,
    /// The plan relies on probe-side matches leaving in probe row order
    /// (HashJoinExec's promise for Inner, Right, RightSemi, RightAnti and
    /// RightMark joins over an ordered probe input).
    pub probe_order_required: bool,
    /// When probe order is kept although the plan does not rely on it.
    pub keep_probe_order: ProbeOrderChoice,
    pub algorithm: AlgorithmChoice,
    pub materialization: MaterializationChoice,
    /// Output rows per probe row from which a probe chunk's output columns
    /// are uploaded rather than taken on the host
    /// (`gpu_join.probe_device_gather_ratio`).
    pub probe_device_gather_ratio: f64,
    /// The inputs' sizes as planned, for choosing the strategy.
    pub planned: PlannedSizes,
    /// Set when the output must leave in key order.
    pub key_order: Option<KeyOrder>,
}

impl JoinDefinition {
    /// Whether the build side's one key column is of a type whose values
    /// may go up as their raw bits, their span gathered on the way
    /// ([`RawKeys`]), so that nothing need gather the span before; not
    /// where the keys must sort into an order that the span decides.
    pub(crate) fn build_keys_may_go_up_raw(&self, build_schema: &Schema) -> bool {
        match self.build_keys.as_slice() {
            [key] => {
                self.key_order.is_none() && key.data_type(build_schema).is_ok_and(|t| RawKeys::of_type(&t).is_some())
            }
            _ => false,
        }
    }

    /// Output columns from the join's column indices (after projection).
    pub fn output_columns_from(column_indices: &[ColumnIndex]) -> Vec<OutputColumn> {
        column_indices
            .iter()
            .map(|c| match c.side {
                JoinSide::Left => OutputColumn::Build(c.index),
                JoinSide::Right => OutputColumn::Probe(c.index),
                JoinSide::None => OutputColumn::Mark,
            })
            .collect()
    }

    /// Whether the matches of a probe chunk of `rows` rows leave in probe
    /// row order; never where the output leaves in key order instead.
    pub(crate) fn keeps_probe_order(&self, rows: usize) -> bool {
        self.key_order.is_none()
            && (self.probe_order_required
                || match self.keep_probe_order {
                    ProbeOrderChoice::Always => true,
                    ProbeOrderChoice::Auto => rows <= SMALL_PROBE_CHUNK_ROWS,
                    ProbeOrderChoice::Required => false,
                })
    }

    /// Whether the pairs of a chunk of which some probe columns are taken
    /// on the host (strings always are) are put in probe row order first
    /// (`already_ordered`: the chunk keeps probe order anyway): the host
    /// then reads each probe batch front to back rather than at random,
    /// and ordering the pairs costs the device a sort of what it already
    /// holds. Not under `required`, which asks for no reordering the plan
    /// does not need.
    pub(crate) fn orders_host_takes(&self, already_ordered: bool) -> bool {
        !already_ordered && self.key_order.is_none() && self.keep_probe_order != ProbeOrderChoice::Required
    }

    /// Build-side columns the output needs, ascending, without repeats.
    pub(crate) fn build_output_columns(&self) -> Vec<usize> {
        self.side_columns(|c| match c {
            OutputColumn::Build(i) => Some(i),
            _ => None,
        })
    }

    /// Probe-side columns the output needs, ascending, without repeats.
    pub(crate) fn probe_output_columns(&self) -> Vec<usize> {
        self.side_columns(|c| match c {
            OutputColumn::Probe(i) => Some(i),
            _ => None,
        })
    }

    /// Columns of a side the join reads on the host besides its keys: those
    /// of the output and those the filter reads there, ascending, without
    /// repeats.
    pub fn read_columns(&self, side: JoinSide) -> Vec<usize> {
        let mut columns = match side {
            JoinSide::Left => self.build_output_columns(),
            _ => self.probe_output_columns(),
        };
        columns.extend(self.filter_columns(side));
        columns.sort_unstable();
        columns.dedup();
        columns
    }

    /// Columns of a side the filter reads on the host: none where the
    /// backend compares them.
    pub(crate) fn filter_columns(&self, side: JoinSide) -> Vec<usize> {
        let indices = match (&self.filter, &self.pair_filter) {
            (Some(filter), None) => filter.column_indices(),
            _ => &[],
        };
        indices.iter().filter(|c| c.side == side).map(|c| c.index).collect()
    }

    /// Columns of a side the backend compares for the filter, ascending.
    pub(crate) fn pair_filter_columns(&self, side: JoinSide) -> Vec<usize> {
        self.pair_filter.as_ref().map_or(vec![], |filter| filter.columns(side))
    }

    fn side_columns(&self, pick: impl Fn(OutputColumn) -> Option<usize>) -> Vec<usize> {
        let mut columns: Vec<usize> = self.output_columns.iter().filter_map(|c| pick(*c)).collect();
        columns.sort_unstable();
        columns.dedup();
        columns
    }

    /// Whether every probe row gives at least one output row (outer joins
    /// that keep the probe side, mark joins that mark it).
    pub(crate) fn emits_every_probe_row(&self) -> bool {
        matches!(self.join_type, JoinType::Right | JoinType::Full | JoinType::RightMark)
    }

    /// Whether a probe chunk needs only to know which rows have a match,
    /// so that no pairs are made: semi, anti and mark joins without a join
    /// filter, whose keys match exactly as encoded (hashed keys are
    /// verified pair by pair).
    pub(crate) fn needs_no_pairs(&self, exactness: KeyExactness) -> bool {
        let flags_only = matches!(
            self.join_type,
            JoinType::LeftSemi
                | JoinType::LeftAnti
                | JoinType::LeftMark
                | JoinType::RightSemi
                | JoinType::RightAnti
                | JoinType::RightMark
        );
        flags_only && self.filter.is_none() && exactness == KeyExactness::Exact
    }

    /// Whether the probe rows with a match are flagged per chunk: the
    /// joins that emit probe rows by whether they matched.
    pub(crate) fn flags_probe_rows(&self) -> bool {
        matches!(self.join_type, JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark)
    }

    /// Whether build rows must be tracked across probe chunks: joins that
    /// emit build rows once the probe side is exhausted.
    pub(crate) fn tracks_visited_build_rows(&self) -> bool {
        matches!(
            self.join_type,
            JoinType::Left | JoinType::Full | JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark
        )
    }

    /// Whether each probe chunk's output depends only on the chunk and the
    /// build side, so that chunks may be joined anywhere, in any pieces.
    pub(crate) fn probe_chunks_join_independently(&self) -> bool {
        !self.tracks_visited_build_rows() && !self.null_aware && self.key_order.is_none()
    }

    /// Whether a build side too large for the device may be joined in
    /// passes, each probe row with the pass that holds its key: probe
    /// chunks join independently and no one relies on their order.
    pub(crate) fn splits_into_passes(&self) -> bool {
        self.probe_chunks_join_independently() && !self.probe_order_required
    }

    /// Whether the filter reads columns of the given side.
    pub(crate) fn filter_reads(&self, side: JoinSide) -> bool {
        self.filter.as_ref().is_some_and(|f| f.column_indices().iter().any(|c| c.side == side))
    }
}

/// What DataFusion's statistics say of a join's inputs when it is planned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlannedSizes {
    pub probe_rows: Option<usize>,
    /// Least and greatest probe key, for one integer key column.
    pub probe_key_range: Option<(i64, i64)>,
    /// Build sides the join collects: one, or one per partition in
    /// `Partitioned` mode, each meeting its share of the probe side.
    pub build_sides: usize,
}

impl PlannedSizes {
    /// Probe rows one build side meets.
    pub fn probe_rows_per_build_side(&self) -> Option<usize> {
        Some(self.probe_rows? / self.build_sides.max(1))
    }

    /// The whole join's build plus probe rows, estimated from one build side
    /// of `build_rows` rows as collected; `None` when the probe side's size
    /// is unknown.
    pub fn join_rows(&self, build_rows: usize) -> Option<usize> {
        let per_side = build_rows.saturating_add(self.probe_rows_per_build_side()?);
        Some(per_side.saturating_mul(self.build_sides.max(1)))
    }
}
