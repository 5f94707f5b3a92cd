//! The dynamic filters of GPU joins above, applied to this join's input
//! rows (`gpu_join.filters_from_above`): a tree of GPU joins cut down to the
//! rows its top can match.
//!
//! A GPU join plants its dynamic filter in its probe side. Where that side
//! holds another GPU join, the filter passes through it on its way to the
//! scans, routed by its twin to the input whose columns the filter reads,
//! as the hash join routes a parent's filters. A scan can only skip row
//! groups and files with it; the join it passes through applies it to every
//! row it reads from that input. It waits until the join above has its build
//! sides in, so that the filter is complete, then drops the rows that none of
//! them can match: those whose key is none of theirs
//! ([`ProbeFilter::members_of`]) and those outside the filter's spans. In
//! TPC-H Q18 at SF 100 the semi join's 6,400 order keys cut `customer ⋈
//! orders` from 150 million orders to 6,400, and the `⋈ lineitem` above it
//! from 600 million output rows to 44,800.
//!
//! A filter that drops fewer than a quarter of the first [`SAMPLE_ROWS`]
//! rows that the join's partitions read from an input is no longer applied
//! to that input ([`Sample`]): its cost, a key looked up in a set for every
//! row, then buys little. In TPC-H Q8 at SF 100 the list of a million
//! suppliers above matched every one of `lineitem`'s 600 million rows, and
//! checking them made the query a fifth slower than without the filters.
//!
//! It waits only while such a list of keys may come of the filter
//! ([`ProbeFilter::worth_waiting_for`]): waiting for a build side of millions
//! of rows, whose spans alone cut little, ran each join's collection after the
//! one's above it (TPC-H Q8 at SF 100, 1.4 times DataFusion's time). Only
//! filters a running GPU join feeds are waited for ([`ProbeFilter::fed`]): they
//! complete once that join's build sides are in, none of which reads this
//! join's output. Other dynamic filters are checked as they stand when each
//! batch comes, never waited for: a `TopK`'s completes only once its input,
//! which holds this join, ends; a hash join above has its build side in, and
//! its filter complete, before it reads the rows below. In TPC-DS Q80 the
//! filters of the joins with `date_dim`, `item` and `promotion` above the GPU
//! join of `store_sales` with `store_returns` reached only the scan, which
//! cannot skip with them, and the join took all 288 M rows. A partition whose
//! join goes to DataFusion's operator joins its probe rows unchecked: the hash
//! join's probe of a build side that small costs about what the check does.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use arrow::array::RecordBatch;
use arrow::compute::filter_record_batch;
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::cast::as_boolean_array;
use datafusion::common::{DataFusionError, Result};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, DynamicFilterPhysicalExpr};
use datafusion::physical_expr::{PhysicalExpr, PhysicalExprRef};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::filter_pushdown::{ChildFilterPushdownResult, FilterPushdownPhase, PushedDown};
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::metrics::{Count, Time};
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt, TryStreamExt};
use tokio::sync::OnceCell;

use super::as_dynamic_filter;
use super::probe_filter::ProbeFilter;
use crate::algorithms::choice::PlanStatistics;

/// The dynamic filters from above that reach a node's inputs, each with
/// the index of its input among the node's children and in that input's
/// columns: routed by a join's twin, or passed through to the one input of
/// a [`super::FilteredFromAboveExec`].
#[derive(Debug, Clone, Default)]
pub(crate) struct FiltersFromAbove {
    filters: Vec<(usize, Arc<DynamicFilterPhysicalExpr>)>,
}

impl FiltersFromAbove {
    /// The dynamic filters among `parent_filters` and the input each is
    /// routed to, as `twin` routes them.
    pub fn routed(
        twin: &HashJoinExec,
        parent_filters: &[ChildFilterPushdownResult],
        config: &ConfigOptions,
    ) -> Result<Self> {
        let dynamic: Vec<Arc<dyn PhysicalExpr>> = parent_filters
            .iter()
            .filter(|parent| as_dynamic_filter(Arc::clone(&parent.filter)).is_some())
            .map(|parent| Arc::clone(&parent.filter))
            .collect();
        if dynamic.is_empty() {
            return Ok(Self::default());
        }
        // The `Pre` phase routes the parent's filters and plants none.
        let routed = twin.gather_filters_for_pushdown(FilterPushdownPhase::Pre, dynamic, config)?;
        let filters = routed
            .parent_filters()
            .into_iter()
            .enumerate()
            .flat_map(|(input, filters)| {
                filters
                    .into_iter()
                    .filter(|filter| matches!(filter.discriminant, PushedDown::Yes))
                    .filter_map(move |filter| as_dynamic_filter(filter.predicate).map(|filter| (input, filter)))
            })
            .collect();
        Ok(Self { filters })
    }

    /// The dynamic filters among `parent_filters`, for a node whose one
    /// input has its columns.
    pub fn passed_through(parent_filters: &[ChildFilterPushdownResult]) -> Self {
        let dynamic = parent_filters.iter().filter_map(|parent| as_dynamic_filter(Arc::clone(&parent.filter)));
        Self { filters: dynamic.map(|filter| (0, filter)).collect() }
    }

    pub fn len(&self) -> usize {
        self.filters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.filters.is_empty()
    }

    /// Whether `filter`, in any plan's columns, is among these.
    pub fn holds(&self, filter: &DynamicFilterPhysicalExpr) -> bool {
        let id = filter.expression_id();
        id.is_some() && self.filters.iter().any(|(_, known)| known.expression_id() == id)
    }

    /// These filters and those of `other` that are not among them.
    pub fn with(&self, other: Self) -> Self {
        let mut filters = self.filters.clone();
        for (input, filter) in other.filters {
            if !self.holds(&filter) {
                filters.push((input, filter));
            }
        }
        Self { filters }
    }

    /// The filters, for the joins above to find them read.
    pub fn expressions(&self) -> impl Iterator<Item = Arc<dyn PhysicalExpr>> + '_ {
        self.filters.iter().map(|(_, filter)| Arc::clone(filter) as Arc<dyn PhysicalExpr>)
    }

    /// How many filters go to each input of a join, for `EXPLAIN`.
    pub fn text(&self) -> String {
        let count = |wanted| self.filters.iter().filter(|(input, _)| *input == wanted).count();
        format!("build: {}, probe: {}", count(0), count(1))
    }

    /// What the rows read from `input`, the node's child of index `index`, go
    /// through: the filters routed to it, each with the running GPU join that
    /// feeds it, if one does; none where the plan bounds `input` below
    /// `min_rows` rows (`gpu_join.min_rows`). Rows that few cost less to take
    /// whole than the wait for the build sides above costs the query: in TPC-DS
    /// Q15 at SF 100, 2 M customers waiting for a million addresses made the
    /// query 2.4 times DataFusion's time, and the addresses cut none of them.
    pub fn reduction(
        &self,
        index: usize,
        input: &Arc<dyn ExecutionPlan>,
        min_rows: usize,
    ) -> Option<Arc<RowReduction>> {
        if PlanStatistics::default().row_bound(input).is_some_and(|rows| rows < min_rows) {
            return None;
        }
        let filters: Vec<_> = self
            .filters
            .iter()
            .filter(|(routed, _)| *routed == index)
            .map(|(_, filter)| (Arc::clone(filter), ProbeFilter::fed(filter)))
            .collect();
        (!filters.is_empty()).then(|| {
            let (schema, predicate, sample) = (input.schema(), OnceCell::new(), Sample::default());
            Arc::new(RowReduction { filters, schema, predicate, sample, settled: AtomicBool::new(false) })
        })
    }
}

/// The rows of one input that the joins above can match.
#[derive(Debug)]
pub(crate) struct RowReduction {
    /// Each filter, in the input's columns, and the GPU join feeding it,
    /// if one does.
    filters: Vec<(Arc<DynamicFilterPhysicalExpr>, Option<Arc<ProbeFilter>>)>,
    schema: SchemaRef,
    /// The filters as complete, and the build sides' keys they check.
    predicate: OnceCell<Option<PhysicalExprRef>>,
    /// How much the predicate drops of the first rows, over every partition.
    sample: Sample,
    /// Set once every filter no GPU join feeds is complete.
    settled: AtomicBool,
}

/// Rows read from an input before the reduction judges whether it pays.
const SAMPLE_ROWS: usize = 1 << 20;

/// Whether a reduction drops enough of the rows it reads to go on: at
/// least one in [`LEAST_DROPPED_SHARE`] of the first [`SAMPLE_ROWS`].
#[derive(Debug, Default)]
struct Sample {
    read: AtomicUsize,
    dropped: AtomicUsize,
    /// Set once the sample is read: whether the reduction goes on.
    verdict: OnceLock<bool>,
}

/// One in this many sampled rows must be dropped for a reduction to go on.
const LEAST_DROPPED_SHARE: usize = 4;

impl Sample {
    /// Whether rows are still worth checking: until the sample is read, and
    /// after it where it showed the reduction pays.
    fn applies(&self) -> bool {
        self.verdict.get().copied().unwrap_or(true)
    }

    /// Counts `read` rows checked, of which `dropped` did not pass.
    fn record(&self, read: usize, dropped: usize) {
        if self.verdict.get().is_some() {
            return;
        }
        let total = self.read.fetch_add(read, Ordering::Relaxed) + read;
        let dropped = self.dropped.fetch_add(dropped, Ordering::Relaxed) + dropped;
        if total >= SAMPLE_ROWS {
            let pays = dropped.saturating_mul(LEAST_DROPPED_SHARE) >= total;
            if self.verdict.set(pays).is_ok() && !pays {
                log::debug!("gpu_join: filters from above dropped {dropped} of {total} rows; no longer applied");
            }
        }
    }
}

impl RowReduction {
    /// The predicate a row must pass, once every filter a GPU join feeds
    /// is complete; `None` where none bounds anything. Another operator's
    /// filter (a hash join's, a `TopK`'s) is not waited for: it is checked
    /// as it stands when each batch comes. A hash join above has its build
    /// side in before it reads the rows below, so its filter mostly is.
    pub async fn predicate(&self) -> Result<Option<PhysicalExprRef>> {
        self.predicate
            .get_or_try_init(|| async {
                let mut parts: Vec<PhysicalExprRef> = vec![];
                for (filter, source) in &self.filters {
                    match source {
                        Some(source) if source.worth_waiting_for().await => {
                            parts.push(filter.current()?);
                            let key: Vec<PhysicalExprRef> = filter.children().into_iter().cloned().collect();
                            parts.extend(source.members_of(&key, &self.schema));
                        }
                        Some(_) => {}
                        None => parts.push(Arc::clone(filter) as PhysicalExprRef),
                    }
                }
                let predicate =
                    parts.into_iter().reduce(|left, right| Arc::new(BinaryExpr::new(left, Operator::And, right)) as _);
                // A filter that is not a predicate over this input's rows
                // would be DataFusion's routing gone wrong: the rows are
                // then joined as they come, as without it.
                Ok(predicate.filter(|predicate| predicate.data_type(&self.schema).ok() == Some(DataType::Boolean)))
            })
            .await
            .cloned()
    }

    /// Whether every filter no GPU join feeds is complete. Until then the
    /// sample does not judge: a row such a filter lets through before it
    /// is complete tells nothing of what the complete filter drops.
    fn settled(&self) -> bool {
        if self.settled.load(Ordering::Relaxed) {
            return true;
        }
        let mut unfed = self.filters.iter().filter(|(_, source)| source.is_none());
        let settled = unfed.all(|(filter, _)| filter.wait_complete().now_or_never().is_some());
        if settled {
            self.settled.store(true, Ordering::Relaxed);
        }
        settled
    }

    /// `batches` with only the rows that pass, and how many did not; the
    /// time spent checking them counted in `compute`.
    pub async fn reduce(&self, batches: Vec<RecordBatch>, compute: &Time) -> Result<(Vec<RecordBatch>, usize)> {
        let Some(predicate) = self.predicate().await? else {
            return Ok((batches, 0));
        };
        let _compute = compute.timer();
        let mut dropped = 0;
        let mut kept = Vec::with_capacity(batches.len());
        for batch in batches {
            let (passed, not_passed) = self.passing(&predicate, batch)?;
            dropped += not_passed;
            if passed.num_rows() > 0 {
                kept.push(passed);
            }
        }
        Ok((kept, dropped))
    }

    /// `batch`'s rows that pass `predicate`, and how many did not; all of
    /// them once the sample shows that checking does not pay.
    fn passing(&self, predicate: &PhysicalExprRef, batch: RecordBatch) -> Result<(RecordBatch, usize)> {
        if !self.sample.applies() {
            return Ok((batch, 0));
        }
        let passes = predicate.evaluate(&batch)?.into_array(batch.num_rows())?;
        let passed = filter_record_batch(&batch, as_boolean_array(&passes)?)?;
        let dropped = batch.num_rows() - passed.num_rows();
        if self.settled() {
            self.sample.record(batch.num_rows(), dropped);
        }
        Ok((passed, dropped))
    }
}

/// `input` with only the rows that pass `reduction`, read once its filters
/// are complete; the others counted in `dropped`, the time checking them in
/// `compute`.
pub(crate) fn reduced<'a>(
    input: BoxStream<'a, Result<RecordBatch>>,
    reduction: Option<Arc<RowReduction>>,
    dropped: Count,
    compute: Time,
) -> BoxStream<'a, Result<RecordBatch>> {
    let Some(reduction) = reduction else {
        return input;
    };
    let filtered = async move {
        let predicate = reduction.predicate().await?;
        let batches = input.map(move |batch| match (&predicate, batch) {
            (Some(predicate), Ok(batch)) => {
                let _compute = compute.timer();
                let (passed, not_passed) = reduction.passing(predicate, batch)?;
                dropped.add(not_passed);
                Ok(passed)
            }
            (_, batch) => batch,
        });
        Ok::<_, DataFusionError>(batches.try_filter(|batch| futures::future::ready(batch.num_rows() > 0)))
    };
    futures::stream::once(filtered).try_flatten().boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reduction_that_drops_too_few_of_its_first_rows_stops() {
        let sample = Sample::default();
        sample.record(SAMPLE_ROWS / 2, SAMPLE_ROWS / 16);
        assert!(sample.applies(), "judged before the sample was read");
        sample.record(SAMPLE_ROWS / 2, 0);
        assert!(!sample.applies(), "1 in 16 rows dropped is too few");
        sample.record(SAMPLE_ROWS, SAMPLE_ROWS);
        assert!(!sample.applies(), "the verdict is kept");
    }

    #[test]
    fn a_reduction_that_drops_enough_goes_on() {
        let sample = Sample::default();
        sample.record(SAMPLE_ROWS, SAMPLE_ROWS / LEAST_DROPPED_SHARE);
        assert!(sample.applies());
        sample.record(SAMPLE_ROWS * 8, 0);
        assert!(sample.applies(), "the verdict is kept");
    }
}
