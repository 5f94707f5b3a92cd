//! Arrow helpers for batches whose arrays share buffers: concatenation
//! that keeps string views compact, and slices that own their bytes.
//!
//! Arrow's `concat` of `Utf8View` / `BinaryView` arrays appends every input
//! array's data buffers, even when the inputs share them. A join's host
//! gathers (`take`) return arrays that share all of their source's
//! buffers, so the batches of one join's output share one set of buffers.
//! Concatenated by the join above them (its build side, its probe chunks),
//! that set would be repeated once per batch, and again at each join of a
//! chain (30,080 buffers in one 64-row batch after three joins in the
//! integration test `string_views_carried_through_joined_joins_stay_compact`),
//! and every later `take` and memory count walks all of them. Arrow's
//! `interleave`, which takes a side's rows from the batches they came in,
//! keeps a shared buffer once per batch in the same way. Here each
//! distinct buffer is kept once, and an array that uses less than half of
//! the bytes it holds is compacted, as arrow's own coalescer does.
//!
//! The same sharing makes a join's output batches, slices of one large
//! chunk, look as large as the chunk to whoever counts their memory
//! (DataFusion's reservations, the `output_bytes` metric); [`owned_slice`]
//! gives each slice buffers of its own size.

use std::collections::HashMap;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow::alloc::Allocation;
use arrow::array::builder::NullBufferBuilder;
use arrow::array::{
    Array, ArrayData, ArrayRef, AsArray, ByteView, GenericByteViewArray, MAX_INLINE_VIEW_LEN, MutableArrayData,
    RecordBatch, RecordBatchOptions, make_array,
};
use arrow::buffer::{Buffer, MutableBuffer, NullBuffer, ScalarBuffer};
use arrow::compute::{concat, interleave};
use arrow::datatypes::{BinaryViewType, ByteViewType, DataType, SchemaRef, StringViewType};
use datafusion::common::internal_err;
use datafusion::error::Result;
use rayon::prelude::*;

use crate::values::value_width;

/// `arrays` as one array; see the module's documentation for view types.
pub(crate) fn concat_arrays(arrays: &[&dyn Array]) -> Result<ArrayRef> {
    match arrays.first().map(|a| a.data_type()) {
        Some(DataType::Utf8View) => Ok(concat_views::<StringViewType>(arrays, false)),
        Some(DataType::BinaryView) => Ok(concat_views::<BinaryViewType>(arrays, false)),
        _ => Ok(concat(arrays)?),
    }
}

/// `arrays`, of `rows` rows in all, as one array, as [`concat_arrays`]
/// makes it, copied on the calling thread's rayon pool: fixed-width values
/// piece by piece, views array by array; other types as one copy.
fn concat_in_parallel(arrays: &[&dyn Array], rows: usize) -> Result<ArrayRef> {
    let Some(data_type) = arrays.first().map(|a| a.data_type()) else {
        return concat_arrays(arrays);
    };
    match data_type {
        DataType::Utf8View => return Ok(concat_views::<StringViewType>(arrays, true)),
        DataType::BinaryView => return Ok(concat_views::<BinaryViewType>(arrays, true)),
        _ => {}
    }
    let Some(width) = value_width(data_type) else {
        return concat_arrays(arrays);
    };
    let mut values = MutableBuffer::from_len_zeroed(rows * width);
    copy_values_in_parallel(arrays, width, values.as_slice_mut())?;
    let data = ArrayData::builder(data_type.clone())
        .len(rows)
        .add_buffer(values.into())
        .nulls(concatenated_nulls(arrays, rows))
        .build()?;
    Ok(make_array(data))
}

/// The values of `arrays` (`width` bytes each) laid end to end in
/// `target`, copied piece by piece on the calling thread's rayon pool.
pub(crate) fn copy_values_in_parallel(arrays: &[&dyn Array], width: usize, target: &mut [u8]) -> Result<()> {
    let mut starts = Vec::with_capacity(arrays.len());
    let mut start = 0;
    for array in arrays {
        starts.push(start);
        start += array.len();
    }
    target
        .par_chunks_mut(COPY_PIECE_BYTES)
        .enumerate()
        .try_for_each(|(i, piece)| copy_values(arrays, &starts, width, i * COPY_PIECE_BYTES, piece))
}

/// Bytes `first..first + out.len()` of the values of `arrays` laid end to
/// end (`width` bytes each, null slots as they lie; array `i` starts at
/// row `starts[i]`), copied into `out`. Each array's data is looked at by the
/// thread that copies it, not all of them first by one thread: a build
/// side comes in thousands of small batches.
pub(crate) fn copy_values(
    arrays: &[&dyn Array],
    starts: &[usize],
    width: usize,
    first: usize,
    out: &mut [u8],
) -> Result<()> {
    // The last array starting at or before `first`: empty arrays that
    // start at the same row come before it.
    let mut index = starts.partition_point(|&start| start * width <= first).saturating_sub(1);
    let mut done = 0;
    while done < out.len() {
        let (Some(array), Some(&start)) = (arrays.get(index), starts.get(index)) else {
            return internal_err!("bytes {first}..{} asked of {} arrays", first + out.len(), arrays.len());
        };
        let data = array.to_data();
        let range = data.offset() * width..(data.offset() + data.len()) * width;
        let Some(values) = data.buffers().first().and_then(|b| b.as_slice().get(range)) else {
            return internal_err!("an array of {} values of {width} bytes holds fewer bytes", data.len());
        };
        let offset = (first + done - start * width).min(values.len());
        let len = (values.len() - offset).min(out.len() - done);
        out[done..done + len].copy_from_slice(&values[offset..offset + len]);
        done += len;
        index += 1;
    }
    Ok(())
}

/// The bytes of `array`'s values (`width` bytes each), as a buffer that
/// keeps them alive; `None` where it holds fewer.
pub(crate) fn value_bytes(array: &dyn Array, width: usize) -> Option<Buffer> {
    let data = array.to_data();
    let (start, len) = (data.offset() * width, data.len() * width);
    let buffer = data.buffers().first()?;
    (start + len <= buffer.len()).then(|| buffer.slice_with_length(start, len))
}

/// Runs of `pieces` that lie end to end in memory within one block, each
/// piece starting where the one before ends (empty pieces join any run):
/// per run, its pieces' indices, the address of its first byte and its
/// bytes. `block_of(address)` gives the block that holds an address (its
/// first byte's address and its bytes); `None` where a piece lies in no
/// block. Separately allocated blocks can lie end to end in memory; a run
/// still stops at its block's end, as one transfer may read one allocation
/// only.
pub(crate) fn runs_in_blocks(
    pieces: &[Buffer],
    block_of: impl Fn(usize) -> Option<(usize, usize)>,
) -> Option<Vec<(Range<usize>, usize, usize)>> {
    let mut runs: Vec<(Range<usize>, usize, usize)> = vec![];
    let mut block_end = 0;
    for (i, piece) in pieces.iter().enumerate() {
        let start = piece.as_ptr() as usize;
        match runs.last_mut() {
            Some((indices, first, bytes))
                if piece.is_empty() || (*first + *bytes == start && start + piece.len() <= block_end) =>
            {
                indices.end = i + 1;
                *bytes += piece.len();
            }
            // Empty pieces before the first run have no bytes to move.
            _ if piece.is_empty() => {}
            _ => {
                let (block, size) = block_of(start)?;
                if start < block || start + piece.len() > block + size {
                    return None;
                }
                block_end = block + size;
                runs.push((i..i + 1, start, piece.len()));
            }
        }
    }
    Some(runs)
}

/// The validity of `arrays` laid end to end (`rows` in all); `None` where
/// none is null.
fn concatenated_nulls(arrays: &[&dyn Array], rows: usize) -> Option<NullBuffer> {
    let mut nulls = NullBufferBuilder::new(rows);
    for array in arrays {
        match array.nulls() {
            Some(n) => nulls.append_buffer(n),
            None => nulls.append_n_non_nulls(array.len()),
        }
    }
    nulls.finish()
}

/// Rows from which [`concat_record_batches`], where asked to, copies in
/// parallel on the calling thread's rayon pool: fewer take less time to
/// copy than to hand out.
pub(crate) const PARALLEL_CONCAT_ROWS: usize = 1 << 16;

/// Bytes each rayon task of a parallel copy copies.
const COPY_PIECE_BYTES: usize = 1 << 20;

/// `batches` as one batch of `schema`, each column as [`concat_arrays`]
/// makes it. `in_parallel`, from [`PARALLEL_CONCAT_ROWS`] rows on, the
/// columns are made in parallel, and each column's values are copied in
/// parallel too: one thread took 160 ms for the 2.1 million rows of a
/// build side that DataFusion's operator joined (TPC-DS Q12 at scale
/// factor 10 on the H100), most of it faulting in fresh pages.
pub(crate) fn concat_record_batches(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    in_parallel: bool,
) -> Result<RecordBatch> {
    let rows = batches.iter().map(RecordBatch::num_rows).sum();
    let parallel = in_parallel && rows >= PARALLEL_CONCAT_ROWS;
    let column = |i: usize| {
        let arrays: Vec<&dyn Array> = batches.iter().map(|b| b.column(i).as_ref()).collect();
        match parallel {
            true => concat_in_parallel(&arrays, rows),
            false => concat_arrays(&arrays),
        }
    };
    let columns = match parallel {
        true => (0..schema.fields().len()).into_par_iter().map(column).collect::<Result<Vec<_>>>()?,
        false => (0..schema.fields().len()).map(column).collect::<Result<Vec<_>>>()?,
    };
    Ok(RecordBatch::try_new_with_options(
        Arc::clone(schema),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(rows)),
    )?)
}

/// Rows `offset..offset + len` of `batch`, each column in buffers that
/// cover only those rows: fixed-width values are the parent's memory,
/// re-wrapped (no copy); string views are compacted when they use less
/// than half of what they hold; other types are copied.
pub(crate) fn owned_slice(batch: &RecordBatch, offset: usize, len: usize) -> Result<RecordBatch> {
    let columns =
        batch.columns().iter().map(|column| owned_rows(&column.slice(offset, len))).collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new_with_options(
        batch.schema(),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(len)),
    )?)
}

/// `batch` with each string or binary view column that uses less than half
/// of the bytes it holds compacted, the other columns as they are. The
/// batches of DataFusion's own join, which the operator hands on where
/// DataFusion's operator joins for it, each share every buffer of the
/// build side's string views: a join above that collects them (arrow's
/// `concat`) would keep the shared buffers once per batch, and every later
/// gather would walk and count them all (TPC-H Q21 at scale factor 10:
/// thousands of references to one buffer in every batch).
pub(crate) fn compacted(batch: &RecordBatch) -> Result<RecordBatch> {
    let column = |column: &ArrayRef| match column.data_type() {
        DataType::Utf8View => compacted_views::<StringViewType>(column),
        DataType::BinaryView => compacted_views::<BinaryViewType>(column),
        _ => Arc::clone(column),
    };
    Ok(RecordBatch::try_new_with_options(
        batch.schema(),
        batch.columns().iter().map(column).collect(),
        &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )?)
}

fn compacted_views<T: ByteViewType>(column: &ArrayRef) -> ArrayRef {
    let array = column.as_byte_view::<T>();
    match sparse(array) {
        true => Arc::new(array.gc()),
        false => Arc::clone(column),
    }
}

/// `column` over its own rows where it holds more than twice the memory
/// they take (a slice of a larger array), else as it is: handed on as it
/// is, it would count the whole array's memory in every reservation.
pub(crate) fn owned_if_shared(column: &ArrayRef) -> Result<ArrayRef> {
    let data = column.to_data();
    match data.get_buffer_memory_size() > 2 * data.get_slice_memory_size()? {
        true => owned_rows(column),
        false => Ok(Arc::clone(column)),
    }
}

/// `slice`'s rows in arrays of their own size, over the same memory where
/// the values are fixed-width or views (counted as the slice's rows only).
pub(crate) fn owned_rows(slice: &ArrayRef) -> Result<ArrayRef> {
    let data_type = slice.data_type();
    match data_type {
        DataType::Utf8View => return Ok(owned_views::<StringViewType>(slice)),
        DataType::BinaryView => return Ok(owned_views::<BinaryViewType>(slice)),
        _ => {}
    }
    let data = slice.to_data();
    let rows = data.len();
    match (data_type.primitive_width(), data.buffers(), data.child_data().is_empty()) {
        (Some(width), [values], true) => {
            let values = owned_bytes(values, data.offset() * width, rows * width)?;
            let nulls = data.nulls().map(owned_nulls);
            Ok(make_array(ArrayData::builder(data_type.clone()).len(rows).add_buffer(values).nulls(nulls).build()?))
        }
        _ => {
            let mut copy = MutableArrayData::new(vec![&data], false, rows);
            copy.try_extend(0, 0, rows)?;
            Ok(make_array(copy.freeze()))
        }
    }
}

fn owned_views<T: ByteViewType>(slice: &ArrayRef) -> ArrayRef {
    let array = slice.as_byte_view::<T>();
    if sparse(array) {
        return Arc::new(array.gc());
    }
    let views = array.views().inner();
    let Ok(views) = owned_bytes(views, 0, views.len()) else {
        return Arc::new(array.gc());
    };
    // SAFETY: the views and data buffers are the valid array's own, the
    // views re-wrapped over the same memory.
    Arc::new(unsafe {
        GenericByteViewArray::<T>::new_unchecked(
            ScalarBuffer::from(views),
            array.data_buffers().to_vec(),
            array.nulls().map(owned_nulls),
        )
    })
}

/// `bytes` bytes of `buffer` from `start`, as a buffer of that size that
/// keeps `buffer` alive.
fn owned_bytes(buffer: &Buffer, start: usize, bytes: usize) -> Result<Buffer> {
    if start.checked_add(bytes).is_none_or(|end| end > buffer.len()) {
        return internal_err!("{bytes} bytes from {start} lie outside a buffer of {} bytes", buffer.len());
    }
    let Some(pointer) = NonNull::new(buffer.as_ptr().wrapping_add(start).cast_mut()) else {
        return internal_err!("a buffer without memory");
    };
    let owner: Arc<dyn Allocation> = Arc::new(buffer.clone());
    // SAFETY: the range lies inside `buffer` (checked above), whose memory
    // `owner` keeps alive and unchanged as long as the new buffer lives.
    Ok(unsafe { Buffer::from_custom_allocation(pointer, bytes, owner) })
}

fn owned_nulls(nulls: &NullBuffer) -> NullBuffer {
    NullBuffer::new(nulls.iter().collect())
}

/// `arrays` of view type `T` as one array, each distinct buffer kept once;
/// the views remapped `in_parallel` on the calling thread's rayon pool, one
/// array per task, or on this thread.
fn concat_views<T: ByteViewType>(arrays: &[&dyn Array], in_parallel: bool) -> ArrayRef {
    let typed: Vec<&GenericByteViewArray<T>> = arrays.iter().map(|a| a.as_byte_view::<T>()).collect();
    let len = arrays.iter().map(|a| a.len()).sum();
    let mut buffers = DistinctBuffers::default();
    let remaps: Vec<Vec<u32>> = typed.iter().map(|array| buffers.remap(array)).collect();
    let mut views = vec![0u128; len];
    let mut pieces = Vec::with_capacity(arrays.len());
    let mut rest = views.as_mut_slice();
    for array in arrays {
        let (piece, tail) = std::mem::take(&mut rest).split_at_mut(array.len());
        pieces.push(piece);
        rest = tail;
    }
    let fill = |(piece, (array, remap)): (&mut [u128], (&&GenericByteViewArray<T>, &Vec<u32>))| {
        for (out, &view) in piece.iter_mut().zip(array.views().iter()) {
            *out = remapped(view, remap);
        }
    };
    match in_parallel {
        true => pieces.into_par_iter().zip(typed.par_iter().zip(remaps.par_iter())).for_each(fill),
        false => pieces.into_iter().zip(typed.iter().zip(remaps.iter())).for_each(fill),
    }
    buffers.into_array::<T>(views, concatenated_nulls(arrays, len))
}

/// The values at `indices` (array, row) of `arrays`, as arrow's
/// `interleave`, which for view types keeps a buffer once per input array
/// that holds it: a join's output taken from thousands of batches that
/// share one set of buffers would hold thousands of copies of the set.
pub(crate) fn interleave_arrays(arrays: &[&dyn Array], indices: &[(usize, usize)]) -> Result<ArrayRef> {
    match arrays.first().map(|a| a.data_type()) {
        Some(DataType::Utf8View) => interleave_views::<StringViewType>(arrays, indices),
        Some(DataType::BinaryView) => interleave_views::<BinaryViewType>(arrays, indices),
        _ => Ok(interleave(arrays, indices)?),
    }
}

fn interleave_views<T: ByteViewType>(arrays: &[&dyn Array], indices: &[(usize, usize)]) -> Result<ArrayRef> {
    let arrays: Vec<&GenericByteViewArray<T>> = arrays.iter().map(|a| a.as_byte_view::<T>()).collect();
    let mut buffers = DistinctBuffers::default();
    let remaps: Vec<Vec<u32>> = arrays.iter().map(|array| buffers.remap(array)).collect();
    let mut views = Vec::with_capacity(indices.len());
    for &(array, row) in indices {
        let (Some(source), Some(remap)) = (arrays.get(array), remaps.get(array)) else {
            return internal_err!("a value taken of array {array} of {}", arrays.len());
        };
        match source.views().get(row) {
            Some(&view) => views.push(remapped(view, remap)),
            None => return internal_err!("row {row} taken of an array of {} values", source.len()),
        }
    }
    let nulls = arrays.iter().any(|a| a.null_count() > 0).then(|| {
        NullBuffer::from(indices.iter().map(|&(array, row)| arrays[array].is_valid(row)).collect::<Vec<bool>>())
    });
    Ok(buffers.into_array::<T>(views, nulls))
}

/// `view` with its buffer index mapped through `remap`; inline views carry
/// no index and stay as they are.
fn remapped(view: u128, remap: &[u32]) -> u128 {
    let mut view = ByteView::from(view);
    if view.length <= MAX_INLINE_VIEW_LEN {
        return view.as_u128();
    }
    view.buffer_index = remap[view.buffer_index as usize];
    view.as_u128()
}

/// The data buffers of view arrays, each distinct buffer once: a buffer is
/// the same buffer when it starts at the same address with the same length.
#[derive(Default)]
struct DistinctBuffers {
    buffers: Vec<Buffer>,
    index_of: HashMap<(usize, usize), u32>,
}

impl DistinctBuffers {
    /// Where each of `array`'s buffers lies among the distinct ones.
    fn remap<T: ByteViewType>(&mut self, array: &GenericByteViewArray<T>) -> Vec<u32> {
        array
            .data_buffers()
            .iter()
            .map(|buffer| {
                *self.index_of.entry((buffer.as_ptr() as usize, buffer.len())).or_insert_with(|| {
                    self.buffers.push(buffer.clone());
                    (self.buffers.len() - 1) as u32
                })
            })
            .collect()
    }

    /// An array of `views` remapped by [`DistinctBuffers::remap`] over
    /// these buffers, compacted when sparse.
    fn into_array<T: ByteViewType>(self, views: Vec<u128>, nulls: Option<NullBuffer>) -> ArrayRef {
        // SAFETY: every view comes from a valid array of the same type; only
        // its buffer index changed, to the position of the very same buffer
        // here. Inline views carry no index and are copied unchanged.
        let array = unsafe { GenericByteViewArray::<T>::new_unchecked(ScalarBuffer::from(views), self.buffers, nulls) };
        match sparse(&array) {
            true => Arc::new(array.gc()),
            false => Arc::new(array),
        }
    }
}

/// Whether `array` holds more than twice the bytes its values use, where
/// copying them out is worth its cost.
fn sparse<T: ByteViewType>(array: &GenericByteViewArray<T>) -> bool {
    let held: usize = array.data_buffers().iter().map(Buffer::len).sum();
    held > 2 * array.total_buffer_bytes_used()
}

/// The 32-bit offsets of an array of strings, binaries, lists or maps, whose
/// values one array holds at most [`crate::values::MAX_ARRAY_VALUES`] of;
/// `None` for other types.
pub(crate) fn value_offsets(array: &dyn Array) -> Option<&[i32]> {
    match array.data_type() {
        DataType::Utf8 => Some(array.as_string::<i32>().value_offsets()),
        DataType::Binary => Some(array.as_binary::<i32>().value_offsets()),
        DataType::List(_) => Some(array.as_list::<i32>().value_offsets()),
        DataType::Map(..) => Some(array.as_map().value_offsets()),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
