//! A partition's output stream, which its task may hand over.
//!
//! A partition's join runs in a task of its own and sends its output
//! through a channel. Where the build side goes to DataFusion's operator,
//! the task has nothing of its own left to do: it hands that operator's
//! stream over, and the partition's consumer then reads it directly, as it
//! would under DataFusion's plan, instead of each batch crossing from the
//! task to the consumer.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::error::Result;
use datafusion::execution::RecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream};
use futures::{FutureExt, Stream, StreamExt};
use tokio::sync::oneshot;

use super::fallback::datafusion_compute;
use super::inputs::PartitionInputs;
use super::output::{OutputSender, output_slices, shared_slices};

/// The end of the hand-over the task keeps.
pub(super) type Handover = oneshot::Sender<SendableRecordBatchStream>;

/// DataFusion's operator's output for the partition: handed over to the
/// partition's consumer, which reads it as it would under DataFusion's
/// plan; sent through the channel where the join has a `fetch` to count.
/// Its batches leave as they come where the join is the one DataFusion
/// planned (cut to `batch_size`), and otherwise in compacted slices of
/// `batch_size` (see `GpuJoinExec::reshaped`). `build`, the build side
/// and its memory reservation, lives as long as the stream.
/// The time DataFusion's operator spent in the partition is added to the
/// join's own `elapsed_compute` once its stream ends, so that the join's
/// time counts the work it handed over.
pub(super) async fn hand_over(
    join: DataFusionJoin,
    build: impl Send + 'static,
    inputs: &PartitionInputs,
    handover: Handover,
    output: &mut OutputSender<'_>,
) -> Result<()> {
    let DataFusionJoin { mut batches, plan } = join;
    let (compute, partition) = (inputs.metrics.baseline.elapsed_compute().clone(), inputs.partition);
    if inputs.fetch.is_some() {
        let mut wanted = true;
        while let (true, Some(batch)) = (wanted, batches.next().await) {
            wanted = output.send(batch?).await?;
        }
        compute.add_duration(datafusion_compute(&plan, partition));
        return Ok(());
    }
    let baseline = inputs.metrics.baseline.clone();
    let schema = batches.schema();
    let ended = futures::stream::once(async move {
        compute.add_duration(datafusion_compute(&plan, partition));
        None
    })
    .filter_map(futures::future::ready);
    let batches = batches.chain(ended);
    let (batch_size, as_planned) = (inputs.output_limits().batch_rows, inputs.as_planned);
    // DataFusion's operator may emit more than `batch_size` rows at once (a
    // left join's unmatched build rows).
    let handed = batches.flat_map(move |batch| {
        let _build = &build;
        let slices = match batch {
            Ok(batch) if as_planned => shared_slices(&batch, batch_size, &baseline).collect(),
            Ok(batch) => output_slices(&batch, batch_size, usize::MAX, &baseline).collect(),
            Err(e) => vec![Err(e)],
        };
        futures::stream::iter(slices)
    });
    // The consumer has gone (the query was cancelled): nothing to hand on.
    let _ = handover.send(Box::pin(RecordBatchStreamAdapter::new(schema, handed)));
    Ok(())
}

/// A partition of DataFusion's operator: its output, and its plan.
pub(super) struct DataFusionJoin {
    pub batches: SendableRecordBatchStream,
    pub plan: Arc<dyn ExecutionPlan>,
}

/// What the task sends, until it hands a stream over; then that stream.
pub(super) struct HandedOver {
    schema: SchemaRef,
    sent: SendableRecordBatchStream,
    sent_ended: bool,
    /// `None` once the task has handed a stream over or finished without.
    handover: Option<oneshot::Receiver<SendableRecordBatchStream>>,
    direct: Option<SendableRecordBatchStream>,
}

impl HandedOver {
    /// `sent`, the task's channel, and `handed`, the other end of the
    /// task's hand-over.
    pub fn new(sent: SendableRecordBatchStream, handed: oneshot::Receiver<SendableRecordBatchStream>) -> Self {
        Self { schema: sent.schema(), sent, sent_ended: false, handover: Some(handed), direct: None }
    }

    /// Takes the stream handed over, if it has come; `Pending` while the
    /// task may still hand one over.
    fn poll_handover(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(handover) = self.handover.as_mut() else {
            return Poll::Ready(());
        };
        match handover.poll_unpin(cx) {
            Poll::Ready(Ok(stream)) => self.direct = Some(stream),
            Poll::Ready(Err(_)) => {}
            Poll::Pending => return Poll::Pending,
        }
        self.handover = None;
        Poll::Ready(())
    }
}

impl Stream for HandedOver {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            let handover = this.poll_handover(cx);
            if let Some(direct) = this.direct.as_mut() {
                return direct.poll_next_unpin(cx);
            }
            match (this.sent_ended, handover) {
                // Once the task has ended, a stream it handed over (before
                // it ended) has come.
                (true, handover) => return handover.map(|()| None),
                (false, _) => match this.sent.poll_next_unpin(cx) {
                    Poll::Ready(None) => this.sent_ended = true,
                    other => return other,
                },
            }
        }
    }
}

impl RecordBatchStream for HandedOver {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::Int32Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_plan::stream::{RecordBatchReceiverStreamBuilder, RecordBatchStreamAdapter};
    use futures::stream;

    use super::*;

    fn batch(value: i32) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int32, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int32Array::from(vec![value]))]).unwrap()
    }

    /// The values a partition's consumer reads when its task sends
    /// `sent` and then, where given, hands `handed` over.
    async fn read(sent: Vec<i32>, handed: Option<Vec<i32>>) -> Vec<i32> {
        let schema = batch(0).schema();
        let mut builder = RecordBatchReceiverStreamBuilder::new(Arc::clone(&schema), 2);
        let tx = builder.tx();
        let (handover, receiver): (Handover, _) = oneshot::channel();
        builder.spawn(async move {
            for value in sent {
                tx.send(Ok(batch(value))).await.ok();
            }
            if let Some(values) = handed {
                let batches = stream::iter(values.into_iter().map(|v| Ok(batch(v))));
                handover.send(Box::pin(RecordBatchStreamAdapter::new(schema, batches))).ok();
            }
            Ok(())
        });
        let stream = HandedOver::new(builder.build(), receiver);
        let batches: Vec<RecordBatch> = stream.map(|b| b.unwrap()).collect().await;
        batches.iter().map(|b| b.column(0).as_any().downcast_ref::<Int32Array>().unwrap().value(0)).collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_consumer_reads_what_is_sent_or_handed_over_and_then_ends() {
        assert_eq!(read(vec![1, 2, 3], None).await, vec![1, 2, 3]);
        assert_eq!(read(vec![], Some(vec![4, 5])).await, vec![4, 5]);
        assert_eq!(read(vec![], Some(vec![])).await, Vec::<i32>::new());
        assert_eq!(read(vec![], None).await, Vec::<i32>::new());
    }
}
