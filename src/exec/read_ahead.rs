//! The probe input read while the build side is collected.
//!
//! A hash join that opens its probe input only once the build side is
//! collected runs the two scans one after the other; DataFusion's does (its
//! hash repartitions start their inputs when first polled). The probe scan
//! does not depend on the build side, so each partition of the GPU join
//! can read ahead, up to `gpu_join.probe_read_ahead_rows`, while it waits.
//! It does so in `CollectLeft` mode, and only while the build side may
//! still go to DataFusion's operator (fewer than `gpu_join.min_build_rows`
//! rows in so far): that evened TPC-H Q19, whose join goes there. In
//! `Partitioned` mode the probe input is a hash repartition of every probe
//! partition, and reading it ahead slowed the build sides' scan in Q12;
//! a larger build side goes to the device, which
//! waits for its collection. Nor where the probe input is a scan of
//! batches already in memory: reading them costs nothing that the wait
//! could hide, and reading them ahead took cores from the build side's
//! inputs (TPC-DS Q16).
//!
//! The rows read ahead go on to whatever joins the partition: the device
//! pipeline, or DataFusion's operator, which reads them through
//! [`StreamSlots`] instead of opening the probe input a second time.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::common::internal_datafusion_err;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, stream};

/// What `waiting` gives, and the probe input with the rows read while it
/// ran first. Reading stops at `limit_rows` rows, once `worth_it` says no,
/// at the first error (which is handed on in its place), or when
/// `reservation` cannot grow; what was read stays accounted in it until
/// handed on.
pub(super) async fn read_ahead_while<T>(
    probe: BoxStream<'static, Result<RecordBatch>>,
    waiting: impl Future<Output = T>,
    limit_rows: usize,
    worth_it: impl Fn() -> bool,
    reservation: MemoryReservation,
) -> (T, BoxStream<'static, Result<RecordBatch>>) {
    let mut probe = probe.fuse();
    let mut ahead = vec![];
    let (mut rows, mut reading) = (0, limit_rows > 0);
    let mut waiting = std::pin::pin!(waiting);
    let done = loop {
        tokio::select! {
            biased;
            done = &mut waiting => break done,
            next = probe.next(), if reading && worth_it() => match next {
                Some(Ok(batch)) => {
                    rows += batch.num_rows();
                    // A batch the pool refuses is already read: it is kept
                    // unaccounted, and reading stops. Counted whole, as the
                    // build side's collection and DataFusion's own buffers
                    // count one: a scan's batches are rarely slices, and
                    // counting a slice's own rows costs a copy of each
                    // column's description.
                    reading = reservation.try_grow(batch.get_array_memory_size()).is_ok() && rows < limit_rows;
                    ahead.push(Ok(batch));
                }
                Some(Err(e)) => {
                    ahead.push(Err(e));
                    reading = false;
                }
                None => reading = false,
            },
        }
    };
    (done, handed_on_first(ahead, probe, reservation))
}

/// `ahead`, read from `probe` and accounted in `reservation`, handed on
/// before the rest of `probe`, each batch freed from the reservation as it
/// goes.
pub(super) fn handed_on_first(
    ahead: Vec<Result<RecordBatch>>,
    probe: impl Stream<Item = Result<RecordBatch>> + Send + 'static,
    reservation: MemoryReservation,
) -> BoxStream<'static, Result<RecordBatch>> {
    let ahead = stream::iter(ahead).map(move |batch| {
        if let Ok(batch) = &batch {
            reservation.shrink(batch.get_array_memory_size().min(reservation.size()));
        }
        batch
    });
    ahead.chain(probe).boxed()
}

/// Whether reading `probe` ahead can hide work of its own behind the build
/// side's collection: not where it is a scan of batches held in memory.
/// Reading all of `catalog_sales` ahead took 2 ms from the scans that TPC-DS
/// Q16's semi join waits for as its build side, and gave nothing back;
/// a filter or a join above such a scan is work.
pub(super) fn worth_reading_ahead(probe: &Arc<dyn ExecutionPlan>) -> bool {
    !probe.downcast_ref::<DataSourceExec>().is_some_and(|scan| scan.data_source().is::<MemorySourceConfig>())
}

/// An input of DataFusion's operator that a stream already begun feeds:
/// one slot per partition, filled with the stream that partition reads,
/// once. The probe input of DataFusion's join where the GPU join leaves it
/// the whole probe side (filled by each partition with the probe stream it
/// has begun reading), and the rest of an aggregation's input.
#[derive(Debug)]
pub(super) struct StreamSlots {
    schema: SchemaRef,
    slots: Vec<Arc<StreamSlot>>,
}

impl StreamSlots {
    pub fn new(schema: SchemaRef, partitions: usize) -> Self {
        let slots = (0..partitions)
            .map(|_| Arc::new(StreamSlot { schema: Arc::clone(&schema), stream: None.into() }))
            .collect();
        Self { schema, slots }
    }

    /// A plan whose partition `p` yields what was put in slot `p`, once.
    pub fn plan(&self) -> Result<Arc<dyn ExecutionPlan>> {
        let partitions = self.slots.iter().map(|slot| Arc::clone(slot) as Arc<dyn PartitionStream>).collect();
        Ok(Arc::new(StreamingTableExec::try_new(Arc::clone(&self.schema), partitions, None, vec![], false, None)?))
    }

    /// Puts partition `partition`'s input in its slot.
    pub fn put(&self, partition: usize, probe: BoxStream<'static, Result<RecordBatch>>) -> Result<()> {
        let slot = self
            .slots
            .get(partition)
            .ok_or_else(|| internal_datafusion_err!("GPU join: no stream slot for partition {partition}"))?;
        let stream = RecordBatchStreamAdapter::new(Arc::clone(&self.schema), probe);
        *slot.lock()? = Some(Box::pin(stream));
        Ok(())
    }
}

/// DataFusion's join over stream slots: its partition `p` joins what was
/// last put in slot `p`.
#[derive(Debug)]
pub(super) struct SlotJoin {
    join: Arc<dyn ExecutionPlan>,
    probe: StreamSlots,
}

impl SlotJoin {
    /// The join `join_over` builds over the plan of `partitions` probe
    /// slots of `schema`.
    pub fn new(
        schema: SchemaRef,
        partitions: usize,
        join_over: impl FnOnce(Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>>,
    ) -> Result<Self> {
        let probe = StreamSlots::new(schema, partitions);
        let join = join_over(probe.plan()?)?;
        Ok(Self { join, probe })
    }

    /// DataFusion's join, for its metrics.
    pub fn plan(&self) -> &Arc<dyn ExecutionPlan> {
        &self.join
    }

    /// Partition `partition` of the join, joining `probe`.
    pub fn execute(
        &self,
        partition: usize,
        probe: BoxStream<'static, Result<RecordBatch>>,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        self.probe.put(partition, probe)?;
        self.join.execute(partition, context)
    }
}

struct StreamSlot {
    schema: SchemaRef,
    stream: Mutex<Option<SendableRecordBatchStream>>,
}

impl StreamSlot {
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Option<SendableRecordBatchStream>>> {
        self.stream.lock().map_err(|_| internal_datafusion_err!("GPU join: stream slot lock poisoned"))
    }
}

impl fmt::Debug for StreamSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamSlot").finish_non_exhaustive()
    }
}

impl PartitionStream for StreamSlot {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _context: Arc<TaskContext>) -> SendableRecordBatchStream {
        let taken = self.lock().map(|mut stream| stream.take());
        match taken {
            Ok(Some(stream)) => stream,
            Ok(None) => error_stream(&self.schema, internal_datafusion_err!("GPU join: a stream slot read twice")),
            Err(e) => error_stream(&self.schema, e),
        }
    }
}

fn error_stream(schema: &SchemaRef, error: datafusion::error::DataFusionError) -> SendableRecordBatchStream {
    Box::pin(RecordBatchStreamAdapter::new(Arc::clone(schema), stream::once(async { Err(error) })))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use arrow::array::{Array, Int64Array};
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::common::exec_datafusion_err;
    use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryConsumer, MemoryPool};
    use datafusion::physical_expr::expressions::lit;
    use datafusion::physical_plan::filter::FilterExec;
    use tokio::sync::oneshot;

    use super::*;

    fn batch(first: i64, rows: i64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from_iter_values(first..first + rows))]).unwrap()
    }

    fn keys(batches: &[RecordBatch]) -> Vec<i64> {
        let column = |b: &RecordBatch| b.column(0).as_any().downcast_ref::<Int64Array>().unwrap().values().to_vec();
        batches.iter().flat_map(column).collect()
    }

    /// Ten batches of ten rows, of keys 0 to 99, whose reading is counted.
    fn probe(read: Arc<AtomicUsize>) -> BoxStream<'static, Result<RecordBatch>> {
        stream::iter((0..10).map(move |i| {
            read.fetch_add(1, Ordering::SeqCst);
            Ok(batch(i * 10, 10))
        }))
        .boxed()
    }

    /// Reads ahead until the wait ends, holding what it read in the pool,
    /// while fewer than `worth_it_batches` were read; returns the probe
    /// input, what the pool held then, and how many batches had been read.
    async fn read_while_waiting(
        probe: impl FnOnce(Arc<AtomicUsize>) -> BoxStream<'static, Result<RecordBatch>>,
        limit_rows: usize,
        worth_it_batches: usize,
        pool: &Arc<dyn MemoryPool>,
    ) -> (BoxStream<'static, Result<RecordBatch>>, usize, usize) {
        let read = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&read);
        let worth_it = move || counted.load(Ordering::SeqCst) < worth_it_batches;
        let reservation = MemoryConsumer::new("ahead").register(pool);
        let (tx, rx) = oneshot::channel();
        // The wait ends only once the reading has begun and stopped by
        // itself, so what is read ahead does not depend on timing.
        let watched = Arc::clone(&read);
        let waiter = tokio::spawn(async move {
            let mut last = usize::MAX;
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                let now = watched.load(Ordering::SeqCst);
                if now == last && now > 0 {
                    break;
                }
                last = now;
            }
            tx.send(7).unwrap();
        });
        let waiting = async { rx.await.unwrap() };
        let (waited, rest) =
            read_ahead_while(probe(Arc::clone(&read)), waiting, limit_rows, worth_it, reservation).await;
        waiter.await.unwrap();
        assert_eq!(waited, 7);
        (rest, pool.reserved(), read.load(Ordering::SeqCst))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rows_read_ahead_come_first_and_in_order_and_are_freed_as_handed_on() {
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 30));
        let (rest, held, read) = read_while_waiting(probe, 35, usize::MAX, &pool).await;
        // Reading stops at the batch that reaches the limit.
        assert_eq!(read, 4);
        assert_eq!(held, 4 * batch(0, 10).get_array_memory_size());
        let batches: Vec<RecordBatch> = rest.map(|b| b.unwrap()).collect().await;
        assert_eq!(keys(&batches), (0..100).collect::<Vec<_>>());
        assert_eq!(pool.reserved(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reading_ahead_stops_once_it_is_no_longer_worth_it() {
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 30));
        let (rest, held, read) = read_while_waiting(probe, usize::MAX, 2, &pool).await;
        assert_eq!((read, held), (2, 2 * batch(0, 10).get_array_memory_size()));
        let batches: Vec<RecordBatch> = rest.map(|b| b.unwrap()).collect().await;
        assert_eq!(keys(&batches), (0..100).collect::<Vec<_>>());
        assert_eq!(pool.reserved(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reading_ahead_stops_where_the_pool_refuses() {
        let one_batch = batch(0, 10).get_array_memory_size();
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(one_batch * 2));
        let (rest, held, read) = read_while_waiting(probe, usize::MAX, usize::MAX, &pool).await;
        // The third batch is read but refused: kept, unaccounted.
        assert_eq!((read, held), (3, one_batch * 2));
        let batches: Vec<RecordBatch> = rest.map(|b| b.unwrap()).collect().await;
        assert_eq!(keys(&batches), (0..100).collect::<Vec<_>>());
        assert_eq!(pool.reserved(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_error_read_ahead_is_handed_on_in_its_place() {
        let failing = |read: Arc<AtomicUsize>| {
            stream::iter((0..3).map(move |i| {
                read.fetch_add(1, Ordering::SeqCst);
                match i {
                    1 => Err(exec_datafusion_err!("scan failed")),
                    _ => Ok(batch(i * 10, 10)),
                }
            }))
            .boxed()
        };
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 30));
        let (rest, _, read) = read_while_waiting(failing, usize::MAX, usize::MAX, &pool).await;
        // Reading stops at the error; the rest is read after it.
        assert_eq!(read, 2);
        let handed: Vec<Result<RecordBatch>> = rest.collect().await;
        assert_eq!(handed.len(), 3);
        assert!(handed[1].as_ref().is_err_and(|e| e.to_string().contains("scan failed")));
        assert_eq!(
            keys(&[handed[0].as_ref().unwrap().clone(), handed[2].as_ref().unwrap().clone()]),
            (0..10).chain(20..30).collect::<Vec<_>>()
        );
        assert_eq!(pool.reserved(), 0);
    }

    #[test]
    fn only_a_probe_input_with_work_of_its_own_is_read_ahead() {
        let batch = batch(0, 10);
        let schema = batch.schema();
        let in_memory = MemorySourceConfig::try_new_exec(&[vec![batch]], Arc::clone(&schema), None).unwrap();
        assert!(!worth_reading_ahead(&(Arc::clone(&in_memory) as Arc<dyn ExecutionPlan>)));
        let filtered = FilterExec::try_new(lit(true), in_memory).unwrap();
        assert!(worth_reading_ahead(&(Arc::new(filtered) as Arc<dyn ExecutionPlan>)));
        let streamed = StreamSlots::new(schema, 1).plan().unwrap();
        assert!(worth_reading_ahead(&streamed));
    }
}
