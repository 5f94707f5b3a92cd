//! DataFusion's statistics of the plans the rule weighs.
//!
//! Each join the rule weighs asks about both its inputs, and every input
//! above a table holds that table, so each node's statistics are computed
//! once per plan. Those of an in-memory table are a pass over every array
//! of every batch, which misses the CPU's caches at each array and was most
//! of the rule's time in planning. They are computed one table partition
//! per core instead, with DataFusion's own function, and merged as
//! DataFusion merges partitions: the same numbers, and half the rule's time
//! over TPC-DS at scale factor 10 on the H100's host.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use datafusion::common::Statistics;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::common::compute_record_batch_statistics;
use datafusion::physical_plan::execution_plan::CardinalityEffect;
use datafusion::physical_plan::statistics::{ChildStats, StatisticsArgs};
use datafusion::physical_plan::union::{InterleaveExec, UnionExec};
use rayon::prelude::*;

/// Below this many batches an in-memory table's pass is short, and is made
/// on the planning thread, leaving the other cores' work alone.
const PARALLEL_STATISTICS_BATCHES: usize = 256;

/// A node by its address, and one of its partitions (`None`: all), as
/// DataFusion's `StatisticsContext` keys what it has computed.
type NodePartition = (usize, Option<usize>);

/// DataFusion's statistics of whole plans (every partition), each node's
/// computed once however many of the plans asked about hold it.
#[derive(Default)]
pub struct PlanStatistics {
    known: RefCell<HashMap<NodePartition, Arc<Statistics>>>,
    /// The plans asked about, kept alive while their statistics are known:
    /// a dropped node would free its address for another.
    asked: RefCell<Vec<Arc<dyn ExecutionPlan>>>,
}

impl PlanStatistics {
    /// `plan`'s statistics; `None` where DataFusion cannot give them.
    pub fn of(&self, plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<Statistics>> {
        self.asked.borrow_mut().push(Arc::clone(plan));
        self.compute(plan, None).ok()
    }

    /// What DataFusion's `StatisticsContext::compute` gives for `plan`'s
    /// `partition` (`None`: all), children first, as each node asks for
    /// them; a whole in-memory table's computed in parallel. The walk is
    /// the context's own, made here because its cache cannot be handed a
    /// table's statistics computed elsewhere.
    fn compute(&self, plan: &Arc<dyn ExecutionPlan>, partition: Option<usize>) -> Result<Arc<Statistics>> {
        let key = (Arc::as_ptr(plan) as *const () as usize, partition);
        if let Some(known) = self.known.borrow().get(&key) {
            return Ok(Arc::clone(known));
        }
        let statistics = match (in_memory_table(plan), partition) {
            (Some(table), None) if table_batches(table) >= PARALLEL_STATISTICS_BATCHES => {
                Arc::new(table_statistics(table)?)
            }
            _ => {
                let requests = plan.child_stats_requests(partition);
                let inputs = plan
                    .children()
                    .into_iter()
                    .zip(requests)
                    .map(|(child, request)| match request {
                        ChildStats::At(partition) => self.compute(child, partition),
                        ChildStats::Skip => Ok(Arc::new(Statistics::new_unknown(&child.schema()))),
                    })
                    .collect::<Result<Vec<_>>>()?;
                plan.statistics_from_inputs(&inputs, &StatisticsArgs::new().with_partition(partition))?
            }
        };
        self.known.borrow_mut().insert(key, Arc::clone(&statistics));
        Ok(statistics)
    }

    /// The most rows `plan` can give, where that is known: a table's rows
    /// (a filter pushed into its scan only drops rows), carried up through
    /// the operators DataFusion says give at most one row per row read
    /// (filters, projections, repartitions, sorts, aggregates, limits) and
    /// added up through unions. `None` above a join or anything else that
    /// can make more rows than it reads: there statistics are a guess, even
    /// where marked exact. The guess for an equi-join without distinct
    /// counts is the smaller input's rows, which puts a fact table joined
    /// with a dimension at the dimension's size.
    pub fn row_bound(&self, plan: &Arc<dyn ExecutionPlan>) -> Option<usize> {
        let children = plan.children();
        if children.is_empty() {
            return self.of(plan)?.num_rows.get_value().copied();
        }
        if plan.is::<UnionExec>() || plan.is::<InterleaveExec>() {
            return children.iter().try_fold(0usize, |rows, input| Some(rows.saturating_add(self.row_bound(input)?)));
        }
        // DataFusion counts an aggregate as giving at most a row per row
        // read, but over grouping sets (ROLLUP, CUBE) each row read is
        // grouped once per set.
        let per_row_read = plan.downcast_ref::<AggregateExec>().map_or(1, |a| a.group_expr().groups().len().max(1));
        match (plan.cardinality_effect(), children.as_slice()) {
            (CardinalityEffect::Equal | CardinalityEffect::LowerEqual, [input]) => {
                Some(self.row_bound(input)?.saturating_mul(per_row_read))
            }
            _ => None,
        }
    }
}

fn in_memory_table(plan: &Arc<dyn ExecutionPlan>) -> Option<&MemorySourceConfig> {
    plan.downcast_ref::<DataSourceExec>()?.data_source().downcast_ref::<MemorySourceConfig>()
}

fn table_batches(table: &MemorySourceConfig) -> usize {
    table.partitions().iter().map(Vec::len).sum()
}

/// A whole in-memory table's statistics, one partition per core, merged.
fn table_statistics(table: &MemorySourceConfig) -> Result<Statistics> {
    let (schema, projection) = (table.original_schema(), table.projection());
    let partitions: Vec<Statistics> = table
        .partitions()
        .par_iter()
        .map(|batches| compute_record_batch_statistics(std::slice::from_ref(batches), &schema, projection.clone()))
        .collect();
    let projected = match projection {
        Some(columns) => Arc::new(schema.project(columns)?),
        None => schema,
    };
    Statistics::try_merge_iter(&partitions, &projected)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::record_batch::RecordBatch;
    use datafusion::datasource::MemTable;
    use datafusion::physical_plan::statistics::StatisticsContext;
    use datafusion::prelude::{SessionConfig, SessionContext};

    use super::*;

    /// A table of `partitions` partitions of `batches` batches each, of
    /// keys with a null every seventh row and a value column.
    fn table(partitions: usize, batches: usize, rows: usize) -> MemTable {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("v", DataType::Int64, false),
        ]));
        let batch = |first: usize| {
            let keys = Int64Array::from_iter((first..first + rows).map(|i| (i % 7 != 0).then_some((i % 1000) as i64)));
            let values = Int64Array::from_iter_values((first..first + rows).map(|i| i as i64));
            RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(keys), Arc::new(values)]).unwrap()
        };
        let data = (0..partitions).map(|p| (0..batches).map(|b| batch((p * batches + b) * rows)).collect()).collect();
        MemTable::try_new(schema, data).unwrap()
    }

    fn nodes(plan: &Arc<dyn ExecutionPlan>) -> Vec<Arc<dyn ExecutionPlan>> {
        let mut all = vec![Arc::clone(plan)];
        for child in plan.children() {
            all.extend(nodes(child));
        }
        all
    }

    /// Every node of a plan over a table large enough to be counted in
    /// parallel and one that is not: the statistics are DataFusion's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn statistics_are_datafusions_own() {
        let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(4));
        ctx.register_table("big", Arc::new(table(4, PARALLEL_STATISTICS_BATCHES / 2, 50))).unwrap();
        ctx.register_table("small", Arc::new(table(2, 3, 40))).unwrap();
        let sql = "select big.v, small.v from big join small on big.k = small.k where big.v % 3 = 1";
        let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
        let ours = PlanStatistics::default();
        let nodes = nodes(&plan);
        assert!(
            nodes
                .iter()
                .any(|node| in_memory_table(node).is_some_and(|t| table_batches(t) >= PARALLEL_STATISTICS_BATCHES))
        );
        for node in nodes {
            let theirs = StatisticsContext::new().compute(node.as_ref(), &StatisticsArgs::new()).unwrap();
            assert_eq!(ours.of(&node).as_deref(), Some(theirs.as_ref()), "{}", node.name());
        }
    }
}
