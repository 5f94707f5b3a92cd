//! DataFusion's aggregation of a chunk of rows, grouped on a backend.
//!
//! DataFusion evaluates the grouping and argument expressions on the host,
//! batch by batch; the keys become exact normalised keys, as a join's
//! packed keys, strings and bytes by their codes in the chunk
//! (`string_codes`), with NULLs coded as values (a NULL is a group of its own),
//! encoded straight into the memory their upload reads, the arguments
//! copied there from the batches they came in, and the backend groups them
//! and folds each aggregate's state ([`JoinBackend::group_rows`]). Nothing
//! is concatenated first. What comes back is the rows DataFusion's
//! aggregation would emit: the grouping columns, taken from one row of
//! each group in its batch, then each
//! aggregate's state fields. A partial aggregation folds rows into states,
//! which the final aggregation above merges; a final one (and one that
//! reduces partial states to fewer) merges states: counts are summed, sums
//! summed, minima and maxima kept. Where a final aggregation's value is its
//! state (`count`, `sum`, `min`, `max`), its merged states are its output.
//! A chunk whose keys do not pack into 64 bits has no exact key; it is
//! left to DataFusion's aggregation, as is every aggregation that
//! [`AggregateNotOnGpu`] names.

use std::fmt;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayData, ArrayRef, BooleanArray, BooleanBufferBuilder, RecordBatch, RecordBatchOptions, UInt32Array,
    make_array,
};
use arrow::buffer::{BooleanBuffer, NullBuffer};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::NullEquality;
use datafusion::error::Result;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateInputMode, AggregateOutputMode};
use datafusion::physical_plan::metrics::Time;

use super::host_rows::{HostRows, TakenRows};
use super::staged_keys::{KeyedVector, StagedKeys, evaluate_keys, upload_keys};
use super::string_codes::{is_coded_type, with_codes};
use crate::backend::{IntegerWidth, JoinBackend, Reduction};
use crate::keys::{KeyEncoder, KeyExactness, KeyRanges, is_packable_key_type};

/// Why an aggregation stays on DataFusion's operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AggregateNotOnGpu {
    /// Rows in, final values out (a single-phase aggregation).
    SinglePhase,
    /// No grouping columns (one group, which DataFusion folds as fast).
    NoGrouping,
    /// `GROUPING SETS`, `ROLLUP` or `CUBE`.
    GroupingSets,
    /// It emits its groups in its input's order, or keeps a limit of groups.
    Ordered,
    /// A dynamic filter of its own, which DataFusion's operator feeds.
    DynamicFilter,
    /// A grouping column of a type that does not pack into integers.
    GroupType(DataType),
    /// An aggregate the backend does not fold (name, and why).
    Aggregate(String, &'static str),
}

impl fmt::Display for AggregateNotOnGpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AggregateNotOnGpu::SinglePhase => {
                write!(
                    f,
                    "rows in and final values out (a single phase), whose two phases would not keep its partitions"
                )
            }
            AggregateNotOnGpu::NoGrouping => write!(f, "no grouping columns"),
            AggregateNotOnGpu::GroupingSets => write!(f, "grouping sets"),
            AggregateNotOnGpu::Ordered => write!(f, "groups in input order or a limit of groups"),
            AggregateNotOnGpu::DynamicFilter => write!(f, "a dynamic filter of its own"),
            AggregateNotOnGpu::GroupType(t) => write!(f, "grouping column of type {t}"),
            AggregateNotOnGpu::Aggregate(name, why) => write!(f, "aggregate {name}: {why}"),
        }
    }
}

/// Where a state column's values come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Whether argument `i` is null: a count of its values (of every row
    /// where it holds no NULL).
    Validity(usize),
    /// Argument `i`'s values.
    Values(usize),
}

/// One column of the partial aggregation's output after the groups.
#[derive(Debug, Clone)]
struct StateColumn {
    reduction: Reduction,
    source: Source,
    data_type: DataType,
    /// The next state column's NULLs are this one's too: an average's
    /// count is NULL where its sum is, as DataFusion's partial state has
    /// it, whose final aggregation reads a count that is not NULL as a
    /// group with values.
    nulls_of_next: bool,
}

/// Where the time of grouping a chunk goes, part by part.
#[derive(Debug, Clone, Default)]
pub struct GroupingTimers {
    /// On the host and the bus: keys evaluated, coded, packed and
    /// uploaded, arguments evaluated and uploaded.
    pub prepare: Time,
    /// On the device: rows grouped and states folded, then downloaded.
    pub group: Time,
    /// On the host: the grouping columns taken, the output built.
    pub output: Time,
}

/// An aggregation as the backend runs it.
#[derive(Debug)]
pub struct Grouping {
    group_by: Vec<Arc<dyn PhysicalExpr>>,
    arguments: Vec<Arc<dyn PhysicalExpr>>,
    states: Vec<StateColumn>,
    schema: SchemaRef,
    input_schema: SchemaRef,
    /// Whether it emits each group once per partition (a final
    /// aggregation), rather than once per chunk (a partial one).
    final_groups: bool,
}

impl Grouping {
    /// `aggregate` as the backend runs it, or why it cannot.
    pub fn of(aggregate: &AggregateExec) -> Result<std::result::Result<Self, AggregateNotOnGpu>> {
        let (groups, mode) = (aggregate.group_expr(), aggregate.mode());
        let merging = mode.input_mode() == AggregateInputMode::Partial;
        let final_groups = mode.output_mode() == AggregateOutputMode::Final;
        let refusal = if final_groups && !merging {
            Some(AggregateNotOnGpu::SinglePhase)
        } else if groups.expr().is_empty() {
            Some(AggregateNotOnGpu::NoGrouping)
        } else if !groups.is_single() {
            Some(AggregateNotOnGpu::GroupingSets)
        } else if aggregate.limit_options().is_some() || aggregate.properties().output_ordering().is_some() {
            Some(AggregateNotOnGpu::Ordered)
        } else if !aggregate.dynamic_expressions_produced().is_empty() {
            Some(AggregateNotOnGpu::DynamicFilter)
        } else {
            None
        };
        if let Some(refusal) = refusal {
            return Ok(Err(refusal));
        }
        // The rows it reads: in a final aggregation the partial states,
        // which `input_schema` (the first phase's input) does not describe.
        let input = aggregate.input().schema();
        for (expr, _) in groups.expr() {
            let data_type = expr.data_type(&input)?;
            if !is_packable_key_type(&data_type) && !is_coded_type(&data_type) {
                return Ok(Err(AggregateNotOnGpu::GroupType(data_type)));
            }
        }
        let mut grouping = Self {
            group_by: groups.expr().iter().map(|(expr, _)| Arc::clone(expr)).collect(),
            arguments: vec![],
            states: vec![],
            schema: aggregate.schema(),
            input_schema: Arc::clone(&input),
            final_groups,
        };
        // A merging aggregation's input holds the grouping columns, then
        // each aggregate's state fields in turn.
        let mut state_column = groups.expr().len();
        for (function, filter) in aggregate.aggr_expr().iter().zip(aggregate.filter_expr()) {
            let added = match merging {
                false => grouping.add(function, filter.is_some(), &input)?,
                true => grouping.add_merged(function, state_column)?,
            };
            state_column += function.state_fields()?.len();
            if let Err(why) = added {
                return Ok(Err(AggregateNotOnGpu::Aggregate(function.name().to_string(), why)));
            }
        }
        Ok(Ok(grouping))
    }

    /// Adds an aggregate's state columns, folded from its argument's
    /// values, or says why the backend cannot fold it.
    fn add(
        &mut self,
        function: &AggregateFunctionExpr,
        filtered: bool,
        input: &arrow::datatypes::Schema,
    ) -> Result<std::result::Result<(), &'static str>> {
        let name = function.fun().name();
        if function.is_distinct() || filtered || !function.order_bys().is_empty() {
            return Ok(Err("DISTINCT, FILTER or ORDER BY"));
        }
        let (arguments, states) = (function.expressions(), function.state_fields()?);
        let [argument] = arguments.as_slice() else {
            return Ok(Err("not one argument"));
        };
        let argument_type = argument.data_type(input)?;
        let state_types: Vec<&DataType> = states.iter().map(|field| field.data_type()).collect();
        let index = self.arguments.len();
        let columns = match (name, state_types.as_slice()) {
            ("count", [DataType::Int64]) => vec![(Reduction::Count, Source::Validity(index))],
            ("sum", [state]) => match summed(&argument_type, state) {
                Some(width) => vec![(Reduction::Sum(width), Source::Values(index))],
                None => return Ok(Err("a sum of this type")),
            },
            ("min" | "max", [state]) if *state == &argument_type => match ordered(&argument_type) {
                Some(width) if name == "min" => vec![(Reduction::Min(width), Source::Values(index))],
                Some(width) => vec![(Reduction::Max(width), Source::Values(index))],
                None => return Ok(Err("a minimum or maximum of this type")),
            },
            ("avg", [DataType::UInt64, sum]) => match summed(&argument_type, sum) {
                Some(width) => {
                    vec![(Reduction::Count, Source::Validity(index)), (Reduction::Sum(width), Source::Values(index))]
                }
                None => return Ok(Err("an average of this type")),
            },
            _ => return Ok(Err("not count, sum, min, max or avg")),
        };
        self.arguments.push(Arc::clone(argument));
        self.push_states(name, columns, &state_types);
        Ok(Ok(()))
    }

    /// Adds an aggregate's state columns, merged from its states in the
    /// input from column `first` on, or says why the backend cannot merge
    /// them.
    fn add_merged(
        &mut self,
        function: &AggregateFunctionExpr,
        first: usize,
    ) -> Result<std::result::Result<(), &'static str>> {
        let name = function.fun().name();
        if function.is_distinct() || !function.order_bys().is_empty() {
            return Ok(Err("DISTINCT or ORDER BY"));
        }
        let states = function.state_fields()?;
        let state_types: Vec<&DataType> = states.iter().map(|field| field.data_type()).collect();
        if self.final_groups && (state_types.len() != 1 || state_types[0] != function.field().data_type()) {
            return Ok(Err("a final value that is not its state"));
        }
        let index = self.arguments.len();
        let columns = match (name, state_types.as_slice()) {
            ("count", [DataType::Int64]) => vec![(Reduction::Sum(IntegerWidth::Eight), Source::Values(index))],
            ("sum", [state]) => match summed(state, state) {
                Some(width) => vec![(Reduction::Sum(width), Source::Values(index))],
                None => return Ok(Err("a sum of this type")),
            },
            ("min" | "max", [state]) => match ordered(state) {
                Some(width) if name == "min" => vec![(Reduction::Min(width), Source::Values(index))],
                Some(width) => vec![(Reduction::Max(width), Source::Values(index))],
                None => return Ok(Err("a minimum or maximum of this type")),
            },
            ("avg", [DataType::UInt64, sum]) => match summed(sum, sum) {
                Some(width) => vec![
                    (Reduction::Sum(IntegerWidth::Eight), Source::Values(index)),
                    (Reduction::Sum(width), Source::Values(index + 1)),
                ],
                None => return Ok(Err("an average of this type")),
            },
            _ => return Ok(Err("not count, sum, min, max or avg")),
        };
        for (i, field) in states.iter().enumerate() {
            self.arguments.push(Arc::new(Column::new(field.name(), first + i)));
        }
        self.push_states(name, columns, &state_types);
        Ok(Ok(()))
    }

    fn push_states(&mut self, name: &str, columns: Vec<(Reduction, Source)>, state_types: &[&DataType]) {
        for (i, ((reduction, source), data_type)) in columns.into_iter().zip(state_types).enumerate() {
            let nulls_of_next = name == "avg" && i == 0;
            self.states.push(StateColumn { reduction, source, data_type: (*data_type).clone(), nulls_of_next });
        }
    }

    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Whether each group leaves once per partition, after every row of
    /// it is merged, rather than once per chunk of rows.
    pub fn final_groups(&self) -> bool {
        self.final_groups
    }

    /// `groups`, which this grouping made, as rows of its input, to be
    /// merged again with more: a final aggregation's output columns are
    /// its input's, as [`Grouping::of`] checks.
    pub fn as_input(&self, groups: &RecordBatch) -> Result<RecordBatch> {
        Ok(RecordBatch::try_new(Arc::clone(&self.input_schema), groups.columns().to_vec())?)
    }

    /// Whether the grouping keys of `batches` group on the backend: they
    /// pack, and can take at least `min_key_values` values. Only the host
    /// looks at them.
    pub fn keys_group_on_backend(&self, batches: &[RecordBatch], min_key_values: usize) -> Result<bool> {
        Ok(self.packed_keys(batches, min_key_values)?.is_some())
    }

    /// The grouping keys of `batches`, their codes and the encoder that
    /// packs them; `None` where they do not pack or can take fewer than
    /// `min_key_values` values (few groups, which the CPU folds for less
    /// than their rows' way to the device).
    fn packed_keys(&self, batches: &[RecordBatch], min_key_values: usize) -> Result<Option<PackedKeys>> {
        let keys = StagedKeys::evaluate(&self.group_by, batches)?;
        let Some(coded) = with_codes(&keys.pieces)? else {
            return Ok(None);
        };
        let encoder = KeyEncoder::for_key_ranges(&KeyRanges::of_pieces(&coded), NullEquality::NullEqualsNull)?;
        if encoder.exactness() != KeyExactness::Exact {
            return Ok(None);
        }
        if encoder.code_count().is_some_and(|values| (values as usize) < min_key_values) {
            return Ok(None);
        }
        Ok(Some(PackedKeys { keys, coded, encoder }))
    }

    /// The partial aggregation of `batches` on `backend`: one row per
    /// group; `None`, for DataFusion's operator, where the keys do not
    /// group on the backend ([`Grouping::keys_group_on_backend`]). Each
    /// part is timed in `timers`.
    pub fn group<B: JoinBackend>(
        &self,
        backend: &B,
        batches: &[RecordBatch],
        min_key_values: usize,
        timers: &GroupingTimers,
    ) -> Result<Option<RecordBatch>> {
        let prepare = timers.prepare.timer();
        let Some(PackedKeys { keys, coded, encoder }) = self.packed_keys(batches, min_key_values)? else {
            return Ok(None);
        };
        let codes = StagedKeys::of_pieces(coded, batches);
        let arguments = batches.iter().map(|batch| evaluate_keys(&self.arguments, batch)).collect::<Result<_>>()?;
        let arguments = in_their_batches(arguments, batches)?;
        let uploaded = upload_keys(backend, &encoder, &codes)?;
        let columns = self.upload_arguments(backend, &arguments)?;
        prepare.done();
        let grouped = timers.group.timer();
        let reductions: Vec<_> = self.states.iter().zip(&columns).map(|(s, c)| (s.reduction, c.as_ref())).collect();
        let groups = match uploaded {
            KeyedVector::U32(codes) => backend.group_rows(&codes, &reductions)?,
            KeyedVector::U64(codes) => backend.group_rows(&codes, &reductions)?,
        };
        grouped.done();
        let _output = timers.output.timer();
        // The grouping columns of a row of each group, taken from the
        // batches the rows came in.
        let rows = UInt32Array::from(groups.rows.clone());
        let key_rows = in_their_batches(keys.pieces, batches)?;
        let mut taken = TakenRows::new(&key_rows, rows.clone())?;
        let mut columns = (0..self.group_by.len()).map(|i| taken.column(i)).collect::<Result<Vec<_>>>()?;
        for (i, (state, reduced)) in self.states.iter().zip(&groups.reduced).enumerate() {
            let nulls = match state.nulls_of_next {
                true => groups.reduced.get(i + 1).and_then(|next| next.nulls.clone()),
                false => reduced.nulls.clone(),
            };
            let data = ArrayData::builder(state.data_type.clone())
                .len(rows.len())
                .add_buffer(reduced.values.clone())
                .nulls(nulls)
                .build()?;
            columns.push(make_array(data));
        }
        Ok(Some(RecordBatch::try_new(Arc::clone(&self.schema), columns)?))
    }

    /// The column each state folds, uploaded: an argument's values, or its
    /// validity for a count of its values; `None` for a count of rows
    /// whose argument holds no NULL.
    fn upload_arguments<B: JoinBackend>(&self, backend: &B, arguments: &HostRows) -> Result<Vec<Option<B::Column>>> {
        self.states
            .iter()
            .map(|state| match state.source {
                Source::Validity(i) => {
                    let pieces: Vec<&dyn Array> =
                        arguments.parts().iter().map(|part| part.column(i).as_ref()).collect();
                    if pieces.iter().all(|piece| piece.logical_null_count() == 0) {
                        return Ok(None);
                    }
                    // Only the pieces' validity, end to end: none of their values.
                    let mut valid = BooleanBufferBuilder::new(arguments.rows());
                    for piece in pieces {
                        match piece.logical_nulls() {
                            Some(nulls) => valid.append_buffer(nulls.inner()),
                            None => valid.append_n(piece.len(), true),
                        }
                    }
                    let nulls = NullBuffer::new(valid.finish());
                    let flags = BooleanArray::new(BooleanBuffer::new_set(nulls.len()), Some(nulls));
                    backend.upload_column(&(Arc::new(flags) as ArrayRef)).map(Some)
                }
                Source::Values(i) => arguments.upload_column(backend, i).map(Some),
            })
            .collect()
    }
}

/// A chunk's grouping keys as evaluated, with strings and bytes given
/// codes, and the encoder that packs them into one integer per row.
struct PackedKeys {
    keys: StagedKeys,
    coded: Vec<Vec<ArrayRef>>,
    encoder: KeyEncoder,
}

/// Columns evaluated on each of `batches`, `pieces`, as rows that go up,
/// and are taken, from the batches they came in, never concatenated.
fn in_their_batches(pieces: Vec<Vec<ArrayRef>>, batches: &[RecordBatch]) -> Result<HostRows> {
    let fields: Vec<Field> = match pieces.first() {
        Some(piece) => piece.iter().enumerate().map(|(i, a)| Field::new(format!("{i}"), a.data_type().clone(), true)),
        None => return Ok(HostRows::new(Arc::new(Schema::empty()), vec![], vec![])),
    }
    .collect();
    let schema = Arc::new(Schema::new(fields));
    let parts = pieces
        .into_iter()
        .zip(batches)
        .map(|(piece, batch)| {
            let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
            RecordBatch::try_new_with_options(Arc::clone(&schema), piece, &options)
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let whole = vec![None; schema.fields().len()];
    Ok(HostRows::new(schema, parts, whole))
}

/// The width of a sum of `argument` values kept as `state`, where the
/// backend sums them: 8-byte integers into their own type, decimals of 16
/// bytes into a decimal of the same scale.
fn summed(argument: &DataType, state: &DataType) -> Option<IntegerWidth> {
    match (argument, state) {
        (DataType::Int64, DataType::Int64) | (DataType::UInt64, DataType::UInt64) => Some(IntegerWidth::Eight),
        (DataType::Decimal128(_, scale), DataType::Decimal128(_, state_scale)) if scale == state_scale => {
            Some(IntegerWidth::Sixteen)
        }
        _ => None,
    }
}

/// The width of values whose order is their signed integers', where the
/// backend keeps their minimum and maximum: 16-byte decimals only up to 18
/// digits, which lie within 8 bytes.
fn ordered(data_type: &DataType) -> Option<IntegerWidth> {
    use DataType::*;
    match data_type {
        Int32 | Date32 | Time32(_) => Some(IntegerWidth::Four),
        Int64 | Date64 | Time64(_) | Timestamp(_, _) | Duration(_) | Decimal64(_, _) => Some(IntegerWidth::Eight),
        Decimal128(precision, _) if *precision <= 18 => Some(IntegerWidth::Sixteen),
        _ => None,
    }
}
