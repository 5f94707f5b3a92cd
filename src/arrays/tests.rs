use arrow::array::StringViewArray;
use arrow::array::UInt32Array;
use arrow::compute::take;

use super::*;

fn names(rows: usize) -> StringViewArray {
    (0..rows).map(|i| if i % 7 == 0 { None } else { Some(format!("Supplier#{i:012}")) }).collect()
}

#[test]
fn pieces_that_follow_each_other_within_a_block_make_one_run() {
    let values: ArrayRef = Arc::new(arrow::array::Int32Array::from_iter_values(0..100));
    let other: ArrayRef = Arc::new(arrow::array::Int32Array::from_iter_values(0..10));
    let bytes = |array: &ArrayRef, offset, len| value_bytes(array.slice(offset, len).as_ref(), 4).unwrap();
    let pieces = vec![
        bytes(&values, 0, 0),
        bytes(&values, 0, 10),
        bytes(&values, 10, 20),
        bytes(&other, 0, 0),
        bytes(&values, 30, 5),
        bytes(&other, 0, 10),
        bytes(&values, 50, 10),
        bytes(&values, 60, 40),
    ];
    let base = values.to_data().buffers()[0].as_ptr() as usize;
    let other_base = other.to_data().buffers()[0].as_ptr() as usize;
    let whole = |address: usize| {
        [(base, 400), (other_base, 40)].into_iter().find(|&(start, len)| (start..start + len).contains(&address))
    };
    assert_eq!(
        runs_in_blocks(&pieces, whole),
        Some(vec![(1..5, base, 140), (5..6, other_base, 40), (6..8, base + 200, 200)]),
        "an empty piece within a run joins it; those before the first run are left out"
    );
    // The values' memory as two blocks that lie end to end, split at
    // row 60: the last run stops at the first block's end.
    let halves = |address: usize| match address.checked_sub(base) {
        Some(offset) if offset < 240 => Some((base, 240)),
        Some(offset) if offset < 400 => Some((base + 240, 160)),
        _ => whole(address),
    };
    assert_eq!(
        runs_in_blocks(&pieces, halves),
        Some(vec![(1..5, base, 140), (5..6, other_base, 40), (6..7, base + 200, 40), (7..8, base + 240, 160)])
    );
    assert_eq!(runs_in_blocks(&pieces[..1], |_| None), Some(vec![]), "no bytes, no block asked for");
    assert_eq!(runs_in_blocks(&pieces, |address| whole(address).filter(|&(start, _)| start == base)), None);
    assert_eq!(runs_in_blocks(&pieces[1..2], |_| Some((base + 4, 400))), None, "a piece starting before its block");
    assert!(value_bytes(values.as_ref(), 8).is_none(), "100 values of 4 bytes are not 800 bytes");
}

#[test]
fn slices_of_larger_arrays_are_handed_on_over_their_own_rows() -> Result<()> {
    let whole: ArrayRef = Arc::new(arrow::array::Int64Array::from_iter((0..10_000).map(|i| (i % 3 != 0).then_some(i))));
    let unchanged = owned_if_shared(&whole)?;
    assert!(Arc::ptr_eq(&unchanged, &whole), "an array over its own rows stays as it is");
    let strings: ArrayRef = Arc::new(arrow::array::StringArray::from_iter_values((0..10_000).map(|i| format!("{i}"))));
    for column in [whole, strings] {
        let slice = column.slice(5_000, 100);
        let owned = owned_if_shared(&slice)?;
        assert_eq!(owned.as_ref(), slice.as_ref());
        assert!(
            owned.get_array_memory_size() * 10 < slice.get_array_memory_size(),
            "{}: {} bytes counted for 100 rows",
            column.data_type(),
            owned.get_array_memory_size()
        );
    }
    Ok(())
}

/// Batches of several column types, some sliced and some with nulls,
/// of uneven sizes: `sizes` rows each, their views over one source.
fn mixed_batches(sizes: &[usize]) -> Result<Vec<RecordBatch>> {
    use arrow::array::{BooleanArray, Decimal128Array, Int64Array};
    use arrow::datatypes::{Field, Schema};
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("price", DataType::Decimal128(7, 2), false),
        Field::new("name", DataType::Utf8View, true),
        Field::new("flag", DataType::Boolean, true),
    ]));
    let source = names(5_000);
    let mut first = 0usize;
    sizes
        .iter()
        .map(|&rows| {
            let ids = Int64Array::from_iter((first..first + rows + 3).map(|i| (i % 11 != 0).then_some(i as i64)));
            let prices = Decimal128Array::from_iter_values((0..rows).map(|i| (i * 13) as i128))
                .with_precision_and_scale(7, 2)?;
            let rows_of_source = UInt32Array::from_iter_values((0..rows).map(|i| ((first + i) * 37 % 5_000) as u32));
            let flags = BooleanArray::from_iter((0..rows).map(|i| (i % 5 != 0).then_some(i % 2 == 0)));
            first += rows;
            Ok(RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(ids.slice(3, rows)),
                    Arc::new(prices),
                    take(&source, &rows_of_source, None)?,
                    Arc::new(flags),
                ],
            )?)
        })
        .collect()
}

#[test]
fn batches_concatenated_in_parallel_hold_arrows_values() -> Result<()> {
    let sizes: Vec<usize> = (0..37).map(|i| 1 + (i * 7_919) % 4_099).collect();
    let batches = mixed_batches(&sizes)?;
    let rows: usize = sizes.iter().sum();
    assert!(rows >= PARALLEL_CONCAT_ROWS, "{rows} rows stay below the parallel copy");
    let schema = batches[0].schema();
    let ours = concat_record_batches(&schema, &batches, true)?;
    assert_eq!(concat_record_batches(&schema, &batches, false)?, ours);
    let arrows = arrow::compute::concat_batches(&schema, &batches)?;
    assert_eq!(ours, arrows);
    assert!(ours.column(0).null_count() > 0 && ours.column(2).null_count() > 0);
    let names = ours.column(2).as_string_view();
    assert_eq!(names.data_buffers().len(), batches[0].column(2).as_string_view().data_buffers().len());
    let few = concat_record_batches(&schema, &batches[..3], true)?;
    assert_eq!(few, arrow::compute::concat_batches(&schema, &batches[..3])?);
    Ok(())
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
    assert_eq!(ours.as_string_view().iter().collect::<Vec<_>>(), arrows.as_string_view().iter().collect::<Vec<_>>());
    assert_eq!(ours.as_string_view().data_buffers().len(), source.data_buffers().len());
    assert!(arrows.as_string_view().data_buffers().len() >= 40 * source.data_buffers().len());
    Ok(())
}

#[test]
fn rows_interleaved_from_pieces_keep_shared_buffers_once() -> Result<()> {
    let source = names(5_000);
    let pieces = (0..300u32)
        .map(|p| take(&source, &UInt32Array::from_iter_values((0..50).map(|i| (i * 37 + p * 11) % 5_000)), None))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let refs: Vec<&dyn Array> = pieces.iter().map(|p| p.as_ref()).collect();
    let indices: Vec<(usize, usize)> = (0..20_000).map(|i| ((i * 7919) % 300, (i * 31) % 50)).collect();
    let ours = interleave_arrays(&refs, &indices)?;
    let arrows = interleave(&refs, &indices)?;
    assert_eq!(ours.as_ref(), arrows.as_ref());
    assert!(ours.null_count() > 0);
    assert_eq!(ours.as_string_view().data_buffers().len(), source.data_buffers().len());
    // Arrow's keeps a buffer once per piece whose rows use it.
    let buffers = |array: &ArrayRef| array.as_string_view().data_buffers().len();
    assert!(buffers(&arrows) > 50 * buffers(&ours), "{} against {}", buffers(&arrows), buffers(&ours));
    assert!(interleave_arrays(&refs, &[(300, 0)]).is_err());
    assert!(interleave_arrays(&refs, &[(0, 50)]).is_err());
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
fn owned_slices_hold_their_rows_and_count_their_own_bytes() -> Result<()> {
    use arrow::array::{BooleanArray, Int64Array, StringArray};
    use arrow::datatypes::{Field, Schema};
    use datafusion::common::utils::memory::get_record_batch_memory_size;

    let rows = 100_000;
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("name", DataType::Utf8View, true),
        Field::new("text", DataType::Utf8, true),
        Field::new("mark", DataType::Boolean, true),
    ]));
    let keys: Int64Array = (0..rows as i64).map(|i| (i % 5 != 0).then_some(i)).collect();
    let names = take(&names(3_000), &UInt32Array::from_iter_values((0..rows as u32).map(|i| i % 3_000)), None)?;
    let text: StringArray = (0..rows).map(|i| (i % 3 != 0).then(|| format!("row {i}"))).collect();
    let mark: BooleanArray = (0..rows).map(|i| (i % 7 != 0).then_some(i % 2 == 0)).collect();
    let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(keys), names, Arc::new(text), Arc::new(mark)])?;
    let whole = get_record_batch_memory_size(&batch);
    let (mut counted, mut offset) = (0, 0);
    for len in [1, 8_191, 8_192, 33_333, 50_283] {
        let slice = owned_slice(&batch, offset, len)?;
        assert_eq!(slice, batch.slice(offset, len), "rows {offset}..{}", offset + len);
        counted += get_record_batch_memory_size(&slice);
        offset += len;
    }
    assert_eq!(offset, rows);
    assert!(counted < 2 * whole, "slices count {counted} bytes, the batch {whole}");
    Ok(())
}

#[test]
fn a_batch_is_compacted_only_where_its_views_are_sparse() -> Result<()> {
    use arrow::array::Int64Array;
    use arrow::datatypes::{Field, Schema};

    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("sparse", DataType::Utf8View, true),
        Field::new("dense", DataType::Utf8View, true),
    ]));
    let source = names(100_000);
    let picks = UInt32Array::from_iter_values((0..1_000).map(|i| i * 97));
    let dense = names(1_000);
    let batch = RecordBatch::try_new(
        schema,
        vec![Arc::new(Int64Array::from_iter_values(0..1_000)), take(&source, &picks, None)?, Arc::new(dense)],
    )?;
    let compact = compacted(&batch)?;
    assert_eq!(compact, batch);
    let held = |b: &RecordBatch, i: usize| -> usize {
        b.column(i).as_string_view().data_buffers().iter().map(Buffer::len).sum()
    };
    assert!(held(&compact, 1) * 10 < held(&batch, 1), "{} of {}", held(&compact, 1), held(&batch, 1));
    assert!(Arc::ptr_eq(compact.column(2), batch.column(2)) && Arc::ptr_eq(compact.column(0), batch.column(0)));
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
