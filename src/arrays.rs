//! Concatenation of Arrow arrays that keeps string views compact.
//!
//! Arrow's `concat` of `Utf8View` / `BinaryView` arrays appends every input
//! array's data buffers, even when the inputs share them. A join's host
//! gathers (`take`) return arrays that share all of their source's
//! buffers, so the batches of one join's output share one set of buffers.
//! Concatenated by the join above them (its build side, its probe chunks),
//! that set would be repeated once per batch, and again at each join of a
//! chain: TPC-H Q21's supplier names reached millions of buffers, and
//! every `take` and memory count walked all of them. Here each distinct
//! buffer is kept once, and an array that uses less than half of the bytes
//! it holds is compacted, as arrow's own coalescer does.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::builder::NullBufferBuilder;
use arrow::array::{
    Array, ArrayRef, AsArray, ByteView, GenericByteViewArray, MAX_INLINE_VIEW_LEN, RecordBatch, RecordBatchOptions,
};
use arrow::buffer::{Buffer, ScalarBuffer};
use arrow::compute::concat;
use arrow::datatypes::{BinaryViewType, ByteViewType, DataType, SchemaRef, StringViewType};
use datafusion::error::Result;

/// `arrays` as one array; see the module's documentation for view types.
pub(crate) fn concat_arrays(arrays: &[&dyn Array]) -> Result<ArrayRef> {
    match arrays.first().map(|a| a.data_type()) {
        Some(DataType::Utf8View) => concat_views::<StringViewType>(arrays),
        Some(DataType::BinaryView) => concat_views::<BinaryViewType>(arrays),
        _ => Ok(concat(arrays)?),
    }
}

/// `batches` as one batch of `schema`, each column by [`concat_arrays`].
pub(crate) fn concat_record_batches(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<RecordBatch> {
    let rows = batches.iter().map(RecordBatch::num_rows).sum();
    let columns = (0..schema.fields().len())
        .map(|i| concat_arrays(&batches.iter().map(|b| b.column(i).as_ref()).collect::<Vec<_>>()))
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new_with_options(
        Arc::clone(schema),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(rows)),
    )?)
}

fn concat_views<T: ByteViewType>(arrays: &[&dyn Array]) -> Result<ArrayRef> {
    let len = arrays.iter().map(|a| a.len()).sum();
    let mut views = Vec::with_capacity(len);
    let mut nulls = NullBufferBuilder::new(len);
    let mut buffers: Vec<Buffer> = vec![];
    // A buffer is the same buffer when it starts at the same address with
    // the same length.
    let mut index_of: HashMap<(usize, usize), u32> = HashMap::new();
    for array in arrays {
        let array = array.as_byte_view::<T>();
        let remap = array
            .data_buffers()
            .iter()
            .map(|buffer| {
                *index_of.entry((buffer.as_ptr() as usize, buffer.len())).or_insert_with(|| {
                    buffers.push(buffer.clone());
                    (buffers.len() - 1) as u32
                })
            })
            .collect::<Vec<u32>>();
        views.extend(array.views().iter().map(|&view| {
            let mut view = ByteView::from(view);
            if view.length <= MAX_INLINE_VIEW_LEN {
                return view.as_u128();
            }
            view.buffer_index = remap[view.buffer_index as usize];
            view.as_u128()
        }));
        match array.nulls() {
            Some(n) => nulls.append_buffer(n),
            None => nulls.append_n_non_nulls(array.len()),
        }
    }
    // SAFETY: every view comes from a valid array of the same type; only its
    // buffer index changed, to the position of the very same buffer in
    // `buffers`. Inline views carry no index and are copied unchanged.
    let array = unsafe { GenericByteViewArray::<T>::new_unchecked(ScalarBuffer::from(views), buffers, nulls.finish()) };
    let held: usize = array.data_buffers().iter().map(Buffer::len).sum();
    match held > 2 * array.total_buffer_bytes_used() {
        true => Ok(Arc::new(array.gc())),
        false => Ok(Arc::new(array)),
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::StringViewArray;
    use arrow::array::UInt32Array;
    use arrow::compute::take;

    use super::*;

    fn names(rows: usize) -> StringViewArray {
        (0..rows).map(|i| if i % 7 == 0 { None } else { Some(format!("Supplier#{i:012}")) }).collect()
    }

    #[test]
    fn shared_buffers_are_kept_once_and_values_are_unchanged() -> Result<()> {
        let source = names(5_000);
        let pieces = (0..40u32)
            .map(|p| take(&source, &UInt32Array::from_iter_values((0..500).map(|i| (i * 37 + p * 11) % 5_000)), None))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let refs: Vec<&dyn Array> = pieces.iter().map(|p| p.as_ref()).collect();
        let ours = concat_arrays(&refs)?;
        let arrows = concat(&refs)?;
        assert_eq!(
            ours.as_string_view().iter().collect::<Vec<_>>(),
            arrows.as_string_view().iter().collect::<Vec<_>>()
        );
        assert_eq!(ours.as_string_view().data_buffers().len(), source.data_buffers().len());
        assert!(arrows.as_string_view().data_buffers().len() >= 40 * source.data_buffers().len());
        Ok(())
    }

    #[test]
    fn a_sparse_result_is_compacted() -> Result<()> {
        let source = names(100_000);
        let few = take(&source, &UInt32Array::from(vec![1, 99_998, 50_000]), None)?;
        let again = take(&source, &UInt32Array::from(vec![2, 3]), None)?;
        let joined = concat_arrays(&[few.as_ref(), again.as_ref()])?;
        let joined = joined.as_string_view();
        let held: usize = joined.data_buffers().iter().map(Buffer::len).sum();
        assert!(held <= 2 * joined.total_buffer_bytes_used(), "held {held} bytes");
        let expected = [1, 99_998, 50_000, 2, 3].map(|i| Some(format!("Supplier#{i:012}")));
        assert_eq!(joined.iter().map(|v| v.map(str::to_owned)).collect::<Vec<_>>(), expected);
        Ok(())
    }

    #[test]
    fn binary_views_and_nulls_survive() -> Result<()> {
        let binary = arrow::compute::cast(&names(3_000), &DataType::BinaryView)?;
        let halves = [binary.slice(0, 1_500), binary.slice(1_500, 1_500)];
        let joined = concat_arrays(&[halves[0].as_ref(), halves[1].as_ref()])?;
        assert_eq!(joined.as_ref(), binary.as_ref());
        assert_eq!(joined.null_count(), binary.null_count());
        Ok(())
    }
}
