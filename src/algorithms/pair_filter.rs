//! Join filters that the backend evaluates on the candidate pairs where they
//! lie: comparisons of two columns of integer, date or time types joined by
//! AND, such as TPC-H Q21's `l3.l_suppkey <> l1.l_suppkey` and the
//! warehouse checks of TPC-DS Q16, Q94 and Q95. Their pairs then need not
//! come to the host. Any other filter is evaluated on the host by
//! DataFusion's own expression.

use datafusion::common::JoinSide;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_expr::expressions::{BinaryExpr, Column};
use datafusion::physical_plan::joins::utils::{ColumnIndex, JoinFilter};

use crate::backend::{Comparison, compared_integer};

/// One comparison of a filter: a column of either side against another.
#[derive(Debug, Clone)]
pub struct ColumnComparison {
    pub left: ColumnIndex,
    pub op: Comparison,
    pub right: ColumnIndex,
}

/// A join filter as comparisons that must all hold.
#[derive(Debug, Clone)]
pub struct PairFilter {
    comparisons: Vec<ColumnComparison>,
}

impl PairFilter {
    /// The filter as comparisons, when it is nothing else: NULL makes a
    /// comparison false and a false conjunct the whole filter false, as
    /// the expression's NULL counts as false.
    pub fn of(filter: &JoinFilter) -> Option<Self> {
        let mut comparisons = vec![];
        collect(filter.expression(), filter, &mut comparisons).then_some(Self { comparisons })
    }

    pub fn comparisons(&self) -> &[ColumnComparison] {
        &self.comparisons
    }

    /// Columns of `side` that some comparison reads, ascending.
    pub(crate) fn columns(&self, side: JoinSide) -> Vec<usize> {
        let mut columns: Vec<usize> = self
            .comparisons
            .iter()
            .flat_map(|c| [&c.left, &c.right])
            .filter(|column| column.side == side)
            .map(|column| column.index)
            .collect();
        columns.sort_unstable();
        columns.dedup();
        columns
    }
}

/// Adds the comparisons of `expression` to `out`; false when it is not a
/// conjunction of comparisons the backend makes.
fn collect(expression: &PhysicalExprRef, filter: &JoinFilter, out: &mut Vec<ColumnComparison>) -> bool {
    let Some(binary) = expression.downcast_ref::<BinaryExpr>() else {
        return false;
    };
    let op = match binary.op() {
        Operator::And => return collect(binary.left(), filter, out) && collect(binary.right(), filter, out),
        Operator::Eq => Comparison::Eq,
        Operator::NotEq => Comparison::NotEq,
        Operator::Lt => Comparison::Lt,
        Operator::LtEq => Comparison::LtEq,
        Operator::Gt => Comparison::Gt,
        Operator::GtEq => Comparison::GtEq,
        _ => return false,
    };
    let (Some(left), Some(right)) = (column_of(binary.left(), filter), column_of(binary.right(), filter)) else {
        return false;
    };
    let schema = filter.schema();
    let (left_type, right_type) = (schema.field(left.0).data_type(), schema.field(right.0).data_type());
    if left_type != right_type || compared_integer(left_type).is_none() {
        return false;
    }
    out.push(ColumnComparison { left: left.1, op, right: right.1 });
    true
}

/// The filter's column that `expression` is, by its place in the filter's
/// schema and in its side.
fn column_of(expression: &PhysicalExprRef, filter: &JoinFilter) -> Option<(usize, ColumnIndex)> {
    let column = expression.downcast_ref::<Column>()?;
    let index = filter.column_indices().get(column.index())?;
    let on_a_side = matches!(index.side, JoinSide::Left | JoinSide::Right);
    (on_a_side && column.index() < filter.schema().fields().len()).then(|| (column.index(), index.clone()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_expr::expressions::lit;

    use super::*;

    fn filter(expression: PhysicalExprRef, types: [DataType; 3]) -> JoinFilter {
        let [a, b, c] = types;
        let schema =
            Arc::new(Schema::new(vec![Field::new("a", a, true), Field::new("b", b, true), Field::new("c", c, true)]));
        let indices = vec![
            ColumnIndex { index: 2, side: JoinSide::Left },
            ColumnIndex { index: 0, side: JoinSide::Right },
            ColumnIndex { index: 1, side: JoinSide::Right },
        ];
        JoinFilter::new(expression, indices, schema)
    }

    fn column(name: &str, index: usize) -> PhysicalExprRef {
        Arc::new(Column::new(name, index))
    }

    fn binary(left: PhysicalExprRef, op: Operator, right: PhysicalExprRef) -> PhysicalExprRef {
        Arc::new(BinaryExpr::new(left, op, right))
    }

    /// Conjunctions of column comparisons of one integer-like type are
    /// taken apart, with each column's side and place in it; arithmetic,
    /// literals, OR, floats and strings, and columns of two types are not.
    #[test]
    fn conjunctions_of_column_comparisons_are_taken_apart() {
        let ints = [DataType::Int64, DataType::Int64, DataType::Int64];
        let not_equal = binary(column("a", 0), Operator::NotEq, column("b", 1));
        let both =
            binary(Arc::clone(&not_equal), Operator::And, binary(column("c", 2), Operator::LtEq, column("a", 0)));
        let taken = PairFilter::of(&filter(both, ints.clone())).expect("two comparisons");
        let shape: Vec<_> = taken
            .comparisons()
            .iter()
            .map(|c| ((c.left.side, c.left.index), c.op, (c.right.side, c.right.index)))
            .collect();
        assert_eq!(
            shape,
            vec![
                ((JoinSide::Left, 2), Comparison::NotEq, (JoinSide::Right, 0)),
                ((JoinSide::Right, 1), Comparison::LtEq, (JoinSide::Left, 2)),
            ]
        );
        assert_eq!((taken.columns(JoinSide::Left), taken.columns(JoinSide::Right)), (vec![2], vec![0, 1]));
        let dates = [DataType::Date32, DataType::Date32, DataType::Utf8];
        assert!(PairFilter::of(&filter(binary(column("a", 0), Operator::Lt, column("b", 1)), dates)).is_some());

        let plus_five = binary(column("b", 1), Operator::Plus, lit(5i64));
        let others = [
            (binary(column("a", 0), Operator::Lt, plus_five), ints.clone()),
            (binary(column("a", 0), Operator::Lt, lit(5i64)), ints.clone()),
            (binary(Arc::clone(&not_equal), Operator::Or, Arc::clone(&not_equal)), ints.clone()),
            (Arc::clone(&not_equal), [DataType::Float64, DataType::Float64, DataType::Int64]),
            (Arc::clone(&not_equal), [DataType::Utf8, DataType::Utf8, DataType::Int64]),
            (Arc::clone(&not_equal), [DataType::Int32, DataType::Int64, DataType::Int64]),
        ];
        for (expression, types) in others {
            let shown = expression.to_string();
            assert!(PairFilter::of(&filter(expression, types)).is_none(), "{shown}");
        }
    }
}
