//! Tables kept in the backend's transfer memory (pinned memory on a GPU),
//! which a join reads where they lie.
//!
//! Every byte a join sends to the GPU is first copied from DataFusion's
//! batches into pinned memory: the copy engine reads pageable memory at a
//! fraction of the link's speed, and pinning the batches where they lie
//! costs about as much as the copy (docs/benchmarks.md). So each byte
//! crosses the host's memory three times (read from the batch, written to
//! pinned memory, read by the copy engine), and on a large join that, more
//! than the link, bounds the join. A table that is queried again and again
//! can pay the copy once: [`pin_partitions`] copies its fixed-width columns
//! into pinned memory, each column of a partition end to end in one block,
//! the batches slices of it. A join over such batches then sends a probe
//! chunk's keys, or a build side's columns, in one transfer per block
//! straight from the table, and codes the keys on the device.

use std::sync::Arc;

use arrow::array::{Array, ArrayData, ArrayRef, RecordBatch, make_array};
use datafusion::common::internal_datafusion_err;
use datafusion::error::Result;
use rayon::prelude::*;

use crate::arrays::copy_values_in_parallel;
use crate::backend::{BackendHandle, TransferMemory};
use crate::values::value_width;

impl BackendHandle {
    /// `partitions` with their fixed-width columns copied into this
    /// backend's transfer memory, where a join reads them as they lie
    /// ([`crate::GpuJoinContextExt::gpu_join_pin_batches`]); as they are on
    /// the CPU backend, whose memory is the host's.
    pub fn pin_partitions(&self, partitions: Vec<Vec<RecordBatch>>) -> Result<Vec<Vec<RecordBatch>>> {
        match self {
            BackendHandle::Cpu => Ok(partitions),
            BackendHandle::Cuda(device) => pin_partitions(partitions, &|bytes| device.keep_transfer_memory(bytes)),
        }
    }
}

/// `partitions` with the values of their fixed-width columns copied into
/// memory from `keep`, one block per column of a partition; other columns,
/// and the columns' validity, stay as they are. The batches keep their
/// rows, schema and order.
fn pin_partitions(
    partitions: Vec<Vec<RecordBatch>>,
    keep: &(dyn Fn(usize) -> Result<Box<dyn TransferMemory>> + Sync),
) -> Result<Vec<Vec<RecordBatch>>> {
    partitions.into_par_iter().map(|batches| pin_partition(batches, keep)).collect()
}

fn pin_partition(
    batches: Vec<RecordBatch>,
    keep: &(dyn Fn(usize) -> Result<Box<dyn TransferMemory>> + Sync),
) -> Result<Vec<RecordBatch>> {
    let Some(schema) = batches.first().map(RecordBatch::schema) else {
        return Ok(batches);
    };
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let columns = (0..schema.fields().len())
        .into_par_iter()
        .map(|i| {
            let arrays: Vec<&dyn Array> = batches.iter().map(|b| b.column(i).as_ref()).collect();
            match value_width(schema.field(i).data_type()) {
                Some(width) if rows > 0 => pin_column(&arrays, rows, width, keep).map(Some),
                _ => Ok(None),
            }
        })
        .collect::<Result<Vec<Option<Vec<ArrayRef>>>>>()?;
    batches
        .iter()
        .enumerate()
        .map(|(b, batch)| {
            let columns = columns
                .iter()
                .zip(batch.columns())
                .map(|(pinned, column)| match pinned {
                    None => Ok(Arc::clone(column)),
                    Some(arrays) => arrays.get(b).cloned().ok_or_else(|| {
                        internal_datafusion_err!("batch {b} of a pinned column of {} batches", arrays.len())
                    }),
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(RecordBatch::try_new(batch.schema(), columns)?)
        })
        .collect()
}

/// The values of `arrays` (`width` bytes each, `rows` in all) copied end to
/// end into one block from `keep`; each array again, a slice of it.
fn pin_column(
    arrays: &[&dyn Array],
    rows: usize,
    width: usize,
    keep: &(dyn Fn(usize) -> Result<Box<dyn TransferMemory>> + Sync),
) -> Result<Vec<ArrayRef>> {
    let bytes = rows * width;
    let mut memory = keep(bytes)?;
    copy_values_in_parallel(arrays, width, memory.bytes_mut(bytes)?)?;
    let block = memory.into_buffer(bytes)?;
    let mut start = 0;
    arrays
        .iter()
        .map(|array| {
            let len = array.len() * width;
            let values = block.slice_with_length(start, len);
            start += len;
            let data = ArrayData::builder(array.data_type().clone())
                .len(array.len())
                .add_buffer(values)
                .nulls(array.nulls().cloned())
                .build()?;
            Ok(make_array(data))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use arrow::array::{BooleanArray, Int64Array, StringArray};
    use arrow::buffer::{Buffer, MutableBuffer};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use crate::arrays::{runs_in_blocks, value_bytes};

    /// Host memory standing in for a backend's pinned blocks.
    struct HostBlock(MutableBuffer);

    impl TransferMemory for HostBlock {
        fn bytes_mut(&mut self, len: usize) -> Result<&mut [u8]> {
            Ok(&mut self.0.as_slice_mut()[..len])
        }

        fn into_buffer(self: Box<Self>, len: usize) -> Result<Buffer> {
            Ok(Buffer::from(self.0).slice_with_length(0, len))
        }
    }

    #[test]
    fn a_partitions_fixed_width_columns_lie_end_to_end_in_one_block() -> Result<()> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("s", DataType::Utf8, false),
            Field::new("b", DataType::Boolean, false),
        ]));
        let batch = |first: i64, rows: i64| {
            let columns: Vec<ArrayRef> = vec![
                Arc::new(Int64Array::from_iter((first..first + rows).map(|v| (v % 3 != 0).then_some(v)))),
                Arc::new(StringArray::from_iter_values((first..first + rows).map(|v| v.to_string()))),
                Arc::new(BooleanArray::from_iter((first..first + rows).map(|v| Some(v % 2 == 0)))),
            ];
            RecordBatch::try_new(Arc::clone(&schema), columns)
        };
        // A slice of a larger batch and an empty batch among them; an empty
        // partition.
        let partitions = vec![vec![batch(0, 10)?, batch(10, 40)?.slice(5, 30), batch(0, 0)?, batch(50, 7)?], vec![]];
        let blocks = std::sync::Mutex::new(vec![]);
        let keep = |bytes: usize| -> Result<Box<dyn TransferMemory>> {
            blocks.lock().map_err(|_| datafusion::common::internal_datafusion_err!("poisoned"))?.push(bytes);
            Ok(Box::new(HostBlock(MutableBuffer::from_len_zeroed(bytes))))
        };
        let pinned = pin_partitions(partitions.clone(), &keep)?;
        assert_eq!(pinned, partitions);
        assert_eq!(blocks.into_inner().ok(), Some(vec![47 * 8]), "one block, for the Int64 column");
        let pieces: Vec<Buffer> = pinned[0].iter().filter_map(|b| value_bytes(b.column(0).as_ref(), 8)).collect();
        let block = pieces[0].as_ptr() as usize;
        let runs = runs_in_blocks(&pieces, |_| Some((block, 47 * 8))).map(|runs| runs.len());
        assert_eq!(runs, Some(1), "the batches' values end to end in their block");
        for (pinned, original) in pinned[0].iter().zip(&partitions[0]) {
            assert!(Arc::ptr_eq(pinned.column(1), original.column(1)), "other columns stay as they are");
        }
        Ok(())
    }
}
