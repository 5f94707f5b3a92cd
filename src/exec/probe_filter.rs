//! The dynamic filter a join plants in its probe side's scan.
//!
//! DataFusion's hash join hands the scan below its probe side a filter that
//! is `true` at planning and becomes, once the build side is in, the span
//! of its keys: a scan reading Parquet skips the row groups and files that
//! no build key can match. The GPU join plants the same filter where the
//! hash join would (its twin decides, see `GpuJoinExec`) and feeds it from
//! the spans it gathers anyway while collecting the build side, whether the
//! device or DataFusion's operator then joins it. A build side of one key
//! and few rows also pushes its keys themselves, as the hash join does
//! (`key IN (…)`, within `datafusion.optimizer.hash_join_inlist_pushdown_*`),
//! which a scan can check against row group statistics and bloom filters.
//! Where the scans filter rows as they decode them
//! (`datafusion.execution.parquet.pushdown_filters`), the hash join adds a
//! lookup into its hash table; the GPU join adds the set of each key
//! column's build values instead ([`KeySetExpr`]: integer, date, string
//! and binary keys, at most [`KEY_SET_MAX_KEYS`] build rows), so that such
//! a scan skips the rows no build row can match, as under DataFusion's
//! plan.
//!
//! With several build sides (`Partitioned` mode) the filter is the span of
//! them all, complete once each has reported; until then a partition does
//! not read its probe input, as the hash join does not, so that no probe
//! row is read before the filter could drop it.
//!
//! A GPU join below, through which the filter passes on its way to the
//! scans, applies it to its own input rows ([`super::filters_from_above`]):
//! it finds the filter among those fed ([`ProbeFilter::fed`]), waits for it
//! to complete, and also drops the rows whose key is none of the build
//! sides' ([`ProbeFilter::members_of`]; with several key columns, the rows
//! one of whose key values no build row holds in that column), where they
//! are at most [`MEMBERSHIP_MAX_KEYS`] rows in all.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, Weak};

use arrow::array::{Array, ArrayRef, RecordBatch};
use arrow::compute::concat;
use arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{NullEquality, Result};
use datafusion::config::{ConfigOptions, OptimizerOptions};
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, DynamicFilterPhysicalExpr, InListExpr, IsNullExpr, lit};
use datafusion::physical_expr::{PhysicalExpr, PhysicalExprRef};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::joins::HashJoinExec;
use tokio::sync::watch;

use super::key_set::KeySetExpr;
use super::twin::{build_sides, probe_keys};
use crate::algorithms::evaluate_keys;
use crate::keys::{KeyRanges, SpanBounds};

/// A join's dynamic filter and what its build sides have told of it.
#[derive(Debug)]
pub(crate) struct ProbeFilter {
    filter: Arc<DynamicFilterPhysicalExpr>,
    probe_keys: Vec<PhysicalExprRef>,
    probe_schema: SchemaRef,
    /// `key IS NULL` for the probe keys that can be NULL, where a NULL key
    /// still counts: a null-aware anti join, or NULLs that match NULLs.
    null_keys: Option<PhysicalExprRef>,
    reports: Mutex<Reports>,
    /// A GPU join below applies the filter to its rows ([`Self::feeding`]).
    applied_below: AtomicBool,
    /// Build rows collected so far, over every build side, where a join
    /// below applies the filter.
    collected: AtomicUsize,
    /// Set once more build rows are in than their keys could be listed for
    /// the joins below ([`MEMBERSHIP_MAX_KEYS`]), which then stop waiting.
    unlisted: watch::Sender<bool>,
    /// The build sides' keys, one array per key column, once all have
    /// reported, where they were kept (see `Reports::keys`) and the filter
    /// does not hold the set of every key column's values; a join below
    /// checks them where they are at most [`MEMBERSHIP_MAX_KEYS`] rows.
    members: OnceLock<Option<Vec<ArrayRef>>>,
}

/// The most build rows whose keys a join below checks its rows' keys
/// against, besides the spans: enough for the build sides that cut a
/// join tree down (TPC-H Q18's 6,400 orders at SF 100), few enough that
/// the set of them costs little to hold and to build (8 MiB of 8-byte
/// keys).
pub(crate) const MEMBERSHIP_MAX_KEYS: usize = 1 << 20;

/// The most build rows whose key values a scan that filters rows as it
/// decodes them checks its rows against: enough for the filtered
/// dimensions of a star join at scale factor 100 (TPC-H Q9's 1.1 million
/// green parts), few enough that the sets cost little beside the build
/// side itself (32 MiB of hashed 8-byte values at most).
pub(crate) const KEY_SET_MAX_KEYS: usize = 1 << 22;

/// The filters GPU joins of running plans feed, by expression id, with
/// what their build sides reported: where a join below finds the filters
/// it may wait for ([`ProbeFilter::fed`]).
static FED: LazyLock<Mutex<HashMap<u64, Weak<ProbeFilter>>>> = LazyLock::new(Mutex::default);

#[derive(Debug)]
struct Reports {
    /// Build sides still to report.
    waiting: usize,
    /// The spans of the build sides reported so far, `None` while none had
    /// a row.
    ranges: Option<KeyRanges>,
    /// The keys of the build sides reported so far, each side's one array
    /// per key column; `None` once they are more than
    /// [`MEMBERSHIP_MAX_KEYS`] rows ([`KEY_SET_MAX_KEYS`] where the scans
    /// filter rows) or one had none listed.
    keys: Option<Vec<Vec<ArrayRef>>>,
    /// Every build side so far had few enough rows for the hash join to
    /// list its keys in the filter.
    listable: bool,
    /// The scans filter rows as they decode them: where the keys are not
    /// listed, the filter holds the sets of their values.
    key_sets: bool,
    /// A build side was lost before its spans were known: the filter stays
    /// as it is.
    lost: bool,
}

impl ProbeFilter {
    /// The filter `filter` of the join `twin` describes.
    pub fn new(filter: Arc<DynamicFilterPhysicalExpr>, twin: &HashJoinExec) -> Result<Self> {
        let probe_schema = twin.right().schema();
        let probe_keys = probe_keys(twin);
        let null_keys = match twin.null_aware || twin.null_equality() == NullEquality::NullEqualsNull {
            true => any_null(&probe_keys, &probe_schema)?,
            false => None,
        };
        let reports = Mutex::new(Reports {
            waiting: build_sides(twin),
            ranges: None,
            keys: Some(vec![]),
            listable: true,
            key_sets: false,
            lost: false,
        });
        Ok(Self {
            filter,
            probe_keys,
            probe_schema,
            null_keys,
            reports,
            applied_below: AtomicBool::new(false),
            collected: AtomicUsize::new(0),
            unlisted: watch::Sender::new(false),
            members: OnceLock::new(),
        })
    }

    /// Records that the join feeds the filter in a running plan, and
    /// whether a GPU join below applies it to its rows, which may then wait
    /// for it and check their keys against the build sides'.
    pub fn feeding(self: &Arc<Self>, applied_below: bool) {
        self.applied_below.store(applied_below, Ordering::Relaxed);
        if !applied_below {
            return;
        }
        let (Some(id), Ok(mut fed)) = (self.filter.expression_id(), FED.lock()) else {
            return;
        };
        fed.retain(|_, filter| filter.strong_count() > 0);
        fed.insert(id, Arc::downgrade(self));
    }

    /// The GPU join's filter that `filter` is (or a copy of, in another
    /// plan's columns), where a running join feeds it: one that completes
    /// once that join's build sides are in.
    pub fn fed(filter: &DynamicFilterPhysicalExpr) -> Option<Arc<Self>> {
        let id = filter.expression_id()?;
        FED.lock().ok()?.get(&id)?.upgrade()
    }

    /// Counts build rows as they are collected: once more are in than
    /// [`MEMBERSHIP_MAX_KEYS`], the joins below stop waiting for the filter.
    pub fn collecting(&self, rows: usize) {
        if self.applied_below.load(Ordering::Relaxed)
            && self.collected.fetch_add(rows, Ordering::Relaxed) + rows > MEMBERSHIP_MAX_KEYS
        {
            self.unlisted.send_replace(true);
        }
    }

    /// Whether a join below that applies the filter is to wait for it:
    /// returns `true` once the filter is complete, `false` at once where
    /// the build sides' keys can never be listed (NULLs that match) and
    /// as soon as more build rows are in than could be. Spans alone cut
    /// little where a list does not; the scans have them anyway, and the
    /// join below does not wait for the build sides above, which would run
    /// one join's collection after another's.
    pub async fn worth_waiting_for(&self) -> bool {
        if !self.keys_may_be_listed() {
            return false;
        }
        let mut unlisted = self.unlisted.subscribe();
        tokio::select! {
            biased;
            () = self.complete() => true,
            _ = unlisted.wait_for(|unlisted| *unlisted) => false,
        }
    }

    /// Whether the build sides' keys can be listed for the joins below:
    /// keys whose NULLs match nothing.
    fn keys_may_be_listed(&self) -> bool {
        self.null_keys.is_none()
    }

    /// Once complete: `key IN (…)` over every build side's keys, for the
    /// rows of a join below whose key, in that join's columns, is `key`
    /// (the filter's own keys, remapped); with several key columns, such a
    /// list for each column, which every row the build sides can match
    /// passes. `None` where the keys are more than
    /// [`MEMBERSHIP_MAX_KEYS`] rows, where a NULL key can match, or where
    /// they are not known.
    pub fn members_of(&self, key: &[PhysicalExprRef], schema: &Schema) -> Option<PhysicalExprRef> {
        if !self.keys_may_be_listed() {
            return None;
        }
        let members = self.members.get()?.as_ref()?;
        if members.len() != key.len() || rows_of(members) > MEMBERSHIP_MAX_KEYS {
            return None;
        }
        let lists = key.iter().zip(members).map(|(key, members)| match KeySetExpr::try_new(Arc::clone(key), members) {
            Some(set) => Some(Arc::new(set) as PhysicalExprRef),
            None => {
                let list = InListExpr::try_new_from_array(Arc::clone(key), Arc::clone(members), false, schema).ok()?;
                Some(Arc::new(list) as PhysicalExprRef)
            }
        });
        lists.collect::<Option<Vec<_>>>()?.into_iter().reduce(and)
    }

    pub fn filter(&self) -> &Arc<DynamicFilterPhysicalExpr> {
        &self.filter
    }

    /// Whether a plan below the join (its probe side) reads the filter; if
    /// none does, the join neither feeds nor waits for it.
    pub fn read_in(&self, probe: &Arc<dyn ExecutionPlan>) -> Result<bool> {
        let Some(id) = self.filter.expression_id() else {
            return Ok(false);
        };
        let mut found = false;
        probe.apply(|node| {
            node.apply_expressions(&mut |root| {
                root.apply(|expr| {
                    if expr.expression_id() == Some(id) {
                        found = true;
                        return Ok(TreeNodeRecursion::Stop);
                    }
                    Ok(TreeNodeRecursion::Continue)
                })
            })?;
            Ok(if found { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
        })?;
        Ok(found)
    }

    /// A build side's report, sent once its spans are known; dropped
    /// unsent, it tells the filter that they never will be.
    pub fn report(self: &Arc<Self>) -> SpanReport {
        SpanReport(Some(Arc::clone(self)))
    }

    /// Returns once every build side has reported (the filter is then
    /// complete).
    pub async fn complete(&self) {
        self.filter.wait_complete().await
    }

    fn arrive(&self, report: Option<BuildReport<'_>>) {
        let finished = {
            let Ok(mut reports) = self.reports.lock() else {
                return self.filter.mark_complete();
            };
            match report {
                Some(BuildReport { ranges, keys, key_sets }) => {
                    reports.ranges = KeyRanges::merge_known(reports.ranges.take(), ranges.cloned());
                    reports.listable &= keys.as_ref().is_some_and(|keys| keys.listable);
                    reports.key_sets |= key_sets;
                    let most = if reports.key_sets { KEY_SET_MAX_KEYS } else { MEMBERSHIP_MAX_KEYS };
                    reports.keys = match (reports.keys.take(), keys) {
                        (Some(mut before), Some(keys))
                            if before.iter().chain(&keys.columns).map(|columns| rows_of(columns)).sum::<usize>()
                                <= most =>
                        {
                            before.extend(keys.columns);
                            Some(before)
                        }
                        _ => None,
                    };
                }
                None => reports.lost = true,
            }
            reports.waiting = reports.waiting.saturating_sub(1);
            (reports.waiting == 0).then(|| {
                (!reports.lost)
                    .then(|| (reports.ranges.clone(), reports.keys.take(), reports.listable, reports.key_sets))
            })
        };
        let Some(known) = finished else {
            return;
        };
        let (ranges, keys, listable, key_sets) = match known {
            Some(known) => known,
            None => {
                let _ = self.members.set(None);
                return self.filter.mark_complete();
            }
        };
        // No piece: no build row, which the spans already rule out.
        let keys = keys.and_then(|pieces| concat_columns(&pieces));
        let (members, every_column_set) = match keys.as_ref() {
            None => (None, false),
            Some(keys) => match listable.then(|| self.key_list(keys)).flatten() {
                Some(list) => (Some(list), false),
                None if key_sets => self.key_sets(keys),
                None => (None, false),
            },
        };
        let predicate = self.predicate(ranges.as_ref(), members);
        // Set before the filter completes: the joins below read it once it
        // has. Where the filter holds the set of every key column's values,
        // they check the filter alone rather than the same keys twice.
        let _ = self.members.set(if every_column_set { None } else { keys });
        if let Some(predicate) = predicate
            && let Err(e) = self.filter.update(predicate)
        {
            log::warn!("gpu_join: the probe side's dynamic filter was left as it was: {e}");
        }
        self.filter.mark_complete();
    }

    /// The probe rows the build sides, of these spans and whose keys are
    /// `members` where known, can match: `None` when neither bounds a key.
    /// No build row at all matches nothing.
    fn predicate(&self, ranges: Option<&KeyRanges>, members: Option<PhysicalExprRef>) -> Option<PhysicalExprRef> {
        let Some(ranges) = ranges else {
            return Some(lit(false));
        };
        let key_types = self.probe_keys.iter().map(|key| key.data_type(&self.probe_schema));
        let key_types = key_types.collect::<Result<Vec<DataType>>>().ok()?;
        let within =
            ranges.bounds(&key_types).into_iter().zip(&self.probe_keys).filter_map(|(bounds, key)| match bounds {
                SpanBounds::Unknown => None,
                SpanBounds::NoValue => Some(lit(false)),
                SpanBounds::Between(lo, hi) => Some(and(
                    binary(Arc::clone(key), Operator::GtEq, lit(lo)),
                    binary(Arc::clone(key), Operator::LtEq, lit(hi)),
                )),
            });
        let within = within.chain(members).reduce(and)?;
        Some(match &self.null_keys {
            Some(null_keys) => binary(Arc::clone(null_keys), Operator::Or, within),
            None => within,
        })
    }

    /// `key IN (…)` over the build sides' keys: only for one key column
    /// (the hash join lists several as structs, which this does not), and
    /// not where the probe key's type differs from the list's.
    fn key_list(&self, keys: &[ArrayRef]) -> Option<PhysicalExprRef> {
        let ([probe_key], [keys]) = (self.probe_keys.as_slice(), keys) else {
            return None;
        };
        let list =
            InListExpr::try_new_from_array(Arc::clone(probe_key), Arc::clone(keys), false, &self.probe_schema).ok()?;
        Some(Arc::new(list))
    }

    /// The set of each key column's build values, each probe key checked
    /// against its column's: every row a build row matches passes. `None`
    /// where no key column is of a type with a set; and whether every one
    /// is.
    fn key_sets(&self, keys: &[ArrayRef]) -> (Option<PhysicalExprRef>, bool) {
        let sets: Vec<PhysicalExprRef> = self
            .probe_keys
            .iter()
            .zip(keys)
            .filter_map(|(probe_key, values)| {
                KeySetExpr::try_new(Arc::clone(probe_key), values).map(|set| Arc::new(set) as PhysicalExprRef)
            })
            .collect();
        let every_column = sets.len() == self.probe_keys.len();
        (sets.into_iter().reduce(and), every_column)
    }
}

/// What a build side tells the filter.
struct BuildReport<'a> {
    /// Its spans, `None` when it has no row.
    ranges: Option<&'a KeyRanges>,
    /// Its keys, where they are few enough to list or to check
    /// ([`MEMBERSHIP_MAX_KEYS`], [`KEY_SET_MAX_KEYS`]).
    keys: Option<BuildKeys>,
    /// The scans filter rows as they decode them.
    key_sets: bool,
}

/// A build side's keys, each key column gathered into one array (none
/// without rows).
struct BuildKeys {
    columns: Option<Vec<ArrayRef>>,
    /// Few enough rows for the hash join to list them.
    listable: bool,
}

/// A build side's part in the filter; see [`ProbeFilter::report`].
pub(crate) struct SpanReport(Option<Arc<ProbeFilter>>);

impl SpanReport {
    /// The build side's spans (`None` when it has no row) and its keys,
    /// where the hash join would list them (`options`), a join below checks
    /// them, or the scans filter rows as they decode them.
    pub fn send(
        mut self,
        ranges: Option<&KeyRanges>,
        batches: &[RecordBatch],
        build_keys: &[PhysicalExprRef],
        options: &ConfigOptions,
    ) {
        if let Some(filter) = self.0.take() {
            let key_sets = options.execution.parquet.pushdown_filters;
            let mut most = options.optimizer.hash_join_inlist_pushdown_max_distinct_values;
            if filter.applied_below.load(Ordering::Relaxed) {
                most = most.max(MEMBERSHIP_MAX_KEYS);
            }
            if key_sets {
                most = most.max(KEY_SET_MAX_KEYS);
            }
            let keys = listed_keys(batches, build_keys, most, &options.optimizer);
            filter.arrive(Some(BuildReport { ranges, keys, key_sets }));
        }
    }
}

/// A build side's keys, each key column gathered into one array, where
/// they are no more than `most` rows; listable where they are no more than
/// the hash join lists (`hash_join_inlist_pushdown_max_distinct_values`,
/// counted here before duplicates go, and `…_max_size` bytes).
fn listed_keys(
    batches: &[RecordBatch],
    build_keys: &[PhysicalExprRef],
    most: usize,
    options: &OptimizerOptions,
) -> Option<BuildKeys> {
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    if build_keys.is_empty() || rows > most {
        return None;
    }
    let pieces = batches.iter().map(|batch| evaluate_keys(build_keys, batch)).collect::<Result<Vec<_>>>().ok()?;
    let columns = match pieces.is_empty() {
        true => None,
        false => Some(concat_columns(&pieces)?),
    };
    // Measured once gathered: the pieces may be slices of larger arrays
    // (an aggregation's output, say), whose whole buffers they would count.
    let bytes: usize = columns.iter().flatten().map(|keys| keys.get_array_memory_size()).sum();
    let listable = rows <= options.hash_join_inlist_pushdown_max_distinct_values
        && bytes <= options.hash_join_inlist_pushdown_max_size;
    Some(BuildKeys { columns, listable })
}

/// Rows of a piece of keys, one array per key column.
fn rows_of(columns: &[ArrayRef]) -> usize {
    columns.first().map_or(0, |column| column.len())
}

/// Pieces of keys, each one array per key column, gathered into one array
/// per key column; `None` for no piece.
fn concat_columns(pieces: &[Vec<ArrayRef>]) -> Option<Vec<ArrayRef>> {
    let columns = pieces.first()?.len();
    (0..columns)
        .map(|column| {
            let parts: Vec<&dyn Array> =
                pieces.iter().filter_map(|piece| piece.get(column)).map(|a| a.as_ref()).collect();
            concat(&parts).ok()
        })
        .collect()
}

impl Drop for SpanReport {
    fn drop(&mut self) {
        if let Some(filter) = self.0.take() {
            filter.arrive(None);
        }
    }
}

fn binary(left: PhysicalExprRef, op: Operator, right: PhysicalExprRef) -> PhysicalExprRef {
    Arc::new(BinaryExpr::new(left, op, right))
}

fn and(left: PhysicalExprRef, right: PhysicalExprRef) -> PhysicalExprRef {
    binary(left, Operator::And, right)
}

/// `key IS NULL OR …` over the keys that can be NULL; `None` if none can.
fn any_null(keys: &[PhysicalExprRef], schema: &Schema) -> Result<Option<PhysicalExprRef>> {
    let mut any = None;
    for key in keys {
        if key.nullable(schema)? {
            let is_null: PhysicalExprRef = Arc::new(IsNullExpr::new(Arc::clone(key)));
            any = Some(match any {
                Some(before) => binary(before, Operator::Or, is_null),
                None => is_null,
            });
        }
    }
    Ok(any)
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::Field;
    use datafusion::common::{JoinType, NullEquality};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::physical_expr::expressions::Column;
    use datafusion::physical_plan::joins::PartitionMode;

    use super::*;

    /// A filter over the probe keys of a `CollectLeft` inner join on the
    /// `Int64` columns `names`, and the join's twin.
    fn filter_of_a_join_on(names: &[&str]) -> Result<(Arc<ProbeFilter>, Arc<DynamicFilterPhysicalExpr>)> {
        let schema = keys_schema(names);
        let side = || MemorySourceConfig::try_new_exec(&[vec![]], Arc::clone(&schema), None);
        let keys: Vec<PhysicalExprRef> =
            names.iter().enumerate().map(|(i, name)| Arc::new(Column::new(name, i)) as PhysicalExprRef).collect();
        let twin = HashJoinExec::try_new(
            side()?,
            side()?,
            keys.iter().map(|key| (Arc::clone(key), Arc::clone(key))).collect(),
            None,
            &JoinType::Inner,
            None,
            PartitionMode::CollectLeft,
            NullEquality::NullEqualsNothing,
            false,
        )?;
        let filter = Arc::new(DynamicFilterPhysicalExpr::new(keys, lit(true)));
        Ok((Arc::new(ProbeFilter::new(Arc::clone(&filter), &twin)?), filter))
    }

    fn filter_of_a_join() -> Result<(Arc<ProbeFilter>, Arc<DynamicFilterPhysicalExpr>)> {
        filter_of_a_join_on(&["k"])
    }

    fn keys_schema(names: &[&str]) -> SchemaRef {
        Arc::new(Schema::new(names.iter().map(|name| Field::new(*name, DataType::Int64, false)).collect::<Vec<_>>()))
    }

    /// Rows of `Int64` columns `names`, one `Vec` per column.
    fn key_rows(names: &[&str], columns: Vec<Vec<i64>>) -> Result<RecordBatch> {
        let arrays = columns.into_iter().map(|values| Arc::new(arrow::array::Int64Array::from(values)) as ArrayRef);
        Ok(RecordBatch::try_new(keys_schema(names), arrays.collect())?)
    }

    /// Which rows of `probe` `predicate` passes.
    fn passing(predicate: &PhysicalExprRef, probe: &RecordBatch) -> Result<Vec<Option<bool>>> {
        let passes = predicate.evaluate(probe)?.into_array(probe.num_rows())?;
        Ok(datafusion::common::cast::as_boolean_array(&passes)?.iter().collect())
    }

    /// A join below waits for the filter while the build side may still be
    /// few enough rows to list, and no longer once more are in.
    #[tokio::test]
    async fn joins_below_wait_only_while_the_build_keys_may_be_listed() -> Result<()> {
        let (source, filter) = filter_of_a_join()?;
        source.feeding(true);
        assert!(ProbeFilter::fed(&filter).is_some(), "the filter is not found among those fed");
        source.collecting(MEMBERSHIP_MAX_KEYS);
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), source.worth_waiting_for()).await;
        assert!(waiting.is_err(), "a join below stopped waiting while the keys could still be listed");
        source.collecting(1);
        assert!(!source.worth_waiting_for().await, "a join below waits for a build side too large to list");
        Ok(())
    }

    /// The keys reported are the set the join below checks its rows against.
    #[tokio::test]
    async fn the_keys_of_every_build_side_are_the_members() -> Result<()> {
        let (source, _) = filter_of_a_join()?;
        source.feeding(true);
        let build = key_rows(&["k"], vec![vec![3, 7]])?;
        let key: PhysicalExprRef = Arc::new(Column::new("k", 0));
        source.report().send(
            Some(&KeyRanges::of_piece(&[build.column(0).clone()])),
            &[build],
            &[Arc::clone(&key)],
            &ConfigOptions::default(),
        );
        assert!(source.worth_waiting_for().await, "a join below does not wait for a complete filter of two keys");
        let members = source.members_of(&[Arc::clone(&key)], &keys_schema(&["k"])).expect("the two keys are listed");
        let probe = key_rows(&["k"], vec![vec![1, 3, 5, 7]])?;
        assert_eq!(passing(&members, &probe)?, [Some(false), Some(true), Some(false), Some(true)]);
        Ok(())
    }

    /// Build keys too many to list: where the scans filter rows as they
    /// decode them, the filter checks each probe key against the set of the
    /// build values; otherwise it holds their span alone.
    #[tokio::test]
    async fn keys_too_many_to_list_are_checked_where_scans_filter_rows() -> Result<()> {
        let build = key_rows(&["k"], vec![(0..1000).step_by(2).collect()])?;
        let key: PhysicalExprRef = Arc::new(Column::new("k", 0));
        let probe = key_rows(&["k"], vec![vec![1, 2, 998, 1001]])?;
        for (pushdown, expected) in [(true, [false, true, true, false]), (false, [true, true, true, false])] {
            let (source, filter) = filter_of_a_join()?;
            let mut options = ConfigOptions::default();
            options.execution.parquet.pushdown_filters = pushdown;
            let ranges = KeyRanges::of_piece(&[build.column(0).clone()]);
            source.report().send(Some(&ranges), std::slice::from_ref(&build), &[Arc::clone(&key)], &options);
            let filter: PhysicalExprRef = filter;
            assert_eq!(passing(&filter, &probe)?, expected.map(Some), "pushdown_filters = {pushdown}");
        }
        Ok(())
    }

    /// With two key columns, each column is listed on its own: a row
    /// passes where each of its key values is some build row's in that
    /// column, as every row a build row matches does.
    #[tokio::test]
    async fn several_key_columns_are_listed_one_by_one() -> Result<()> {
        let names = ["a", "b"];
        let (source, _) = filter_of_a_join_on(&names)?;
        source.feeding(true);
        let keys: Vec<PhysicalExprRef> =
            names.iter().enumerate().map(|(i, name)| Arc::new(Column::new(name, i)) as PhysicalExprRef).collect();
        let build = key_rows(&names, vec![vec![1, 2], vec![10, 20]])?;
        let ranges = KeyRanges::of_piece(&[build.column(0).clone(), build.column(1).clone()]);
        source.report().send(Some(&ranges), &[build], &keys, &ConfigOptions::default());
        assert!(source.worth_waiting_for().await, "a join below does not wait for keys of two columns");
        let members = source.members_of(&keys, &keys_schema(&names)).expect("both columns are listed");
        let probe = key_rows(&names, vec![vec![1, 1, 3, 2], vec![10, 20, 10, 30]])?;
        assert_eq!(passing(&members, &probe)?, [Some(true), Some(true), Some(false), Some(false)]);
        assert!(source.members_of(&keys[..1], &keys_schema(&names)).is_none(), "one key of two has no list");
        Ok(())
    }
}
