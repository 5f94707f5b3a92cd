use std::sync::Arc;

use arrow::array::{
    ArrayData, ArrayRef, BooleanArray, Decimal128Array, Int32Array, Int64Array, StringArray, UInt64Array, make_array,
};
use arrow::buffer::Buffer;
use datafusion::common::NullEquality;

use super::*;

fn encode(
    build: Vec<ArrayRef>,
    probe: Vec<ArrayRef>,
    nulls: NullEquality,
) -> (KeyEncoder, NormalizedKeys, NormalizedKeys) {
    let encoder = KeyEncoder::for_build_side(std::slice::from_ref(&build), nulls).unwrap();
    let (b, p) = (encoder.encode(&build).unwrap(), encoder.encode(&probe).unwrap());
    (encoder, b, p)
}

#[test]
fn small_integer_ranges_pack_into_32_bits() {
    let build: ArrayRef = Arc::new(Int64Array::from(vec![Some(-5), Some(10), None, Some(0)]));
    let probe: ArrayRef = Arc::new(Int64Array::from(vec![Some(10), Some(-6), Some(11), None, Some(-5)]));
    let (encoder, b, p) = encode(vec![build], vec![probe], NullEquality::NullEqualsNothing);
    assert_eq!(encoder.exactness(), KeyExactness::Exact);
    assert_eq!(encoder.key_bits(), 32);
    // value - min; NULLs and values outside the build range cannot match
    assert_eq!(b, NormalizedKeys::U32(vec![0, 15, u32::MAX, 5]));
    assert_eq!(p, NormalizedKeys::U32(vec![15, u32::MAX, u32::MAX, u32::MAX, 0]));
}

#[test]
fn null_equals_null_reserves_code_zero() {
    let build: ArrayRef = Arc::new(Int32Array::from(vec![Some(7), None]));
    let probe: ArrayRef = Arc::new(Int32Array::from(vec![None, Some(7), Some(8)]));
    let (_, b, p) = encode(vec![build], vec![probe], NullEquality::NullEqualsNull);
    assert_eq!(b, NormalizedKeys::U32(vec![1, 0]));
    assert_eq!(p, NormalizedKeys::U32(vec![0, 1, u32::MAX]));
}

#[test]
fn composite_keys_pack_in_column_order() {
    let build: Vec<ArrayRef> =
        vec![Arc::new(Int32Array::from(vec![0, 3, 1])), Arc::new(BooleanArray::from(vec![true, false, true]))];
    let (encoder, b, _) = encode(build.clone(), build, NullEquality::NullEqualsNothing);
    assert!(encoder.describe().contains("packed 3 bits"), "{}", encoder.describe());
    // (a - 0) << 1 | bool: packed keys sort like the key tuples
    assert_eq!(b, NormalizedKeys::U32(vec![1, 6, 3]));
}

#[test]
fn wide_ranges_use_64_bits_and_whole_ranges_hash() {
    let wide: ArrayRef = Arc::new(Int64Array::from(vec![0, 1 << 40]));
    let (encoder, b, _) = encode(vec![Arc::clone(&wide)], vec![wide], NullEquality::NullEqualsNothing);
    assert_eq!((encoder.key_bits(), encoder.exactness()), (64, KeyExactness::Exact));
    assert_eq!(b, NormalizedKeys::U64(vec![0, 1 << 40]));

    let whole: ArrayRef = Arc::new(UInt64Array::from(vec![0, u64::MAX]));
    let (encoder, _, _) = encode(vec![Arc::clone(&whole)], vec![whole], NullEquality::NullEqualsNothing);
    assert_eq!(encoder.exactness(), KeyExactness::NeedsVerification);

    let decimal: ArrayRef = Arc::new(Decimal128Array::from(vec![i128::MIN + 1, i128::MAX]));
    let (encoder, _, _) = encode(vec![Arc::clone(&decimal)], vec![decimal], NullEquality::NullEqualsNothing);
    assert_eq!(encoder.exactness(), KeyExactness::NeedsVerification);
}

#[test]
fn strings_hash_equal_values_alike_and_nulls_to_unmatchable() {
    let build: ArrayRef = Arc::new(StringArray::from(vec![Some("x"), None, Some("y")]));
    let probe: ArrayRef = Arc::new(StringArray::from(vec![Some("y"), Some("x"), None]));
    let (encoder, b, p) = encode(vec![build], vec![probe], NullEquality::NullEqualsNothing);
    assert_eq!(encoder.exactness(), KeyExactness::NeedsVerification);
    let (NormalizedKeys::U64(b), NormalizedKeys::U64(p)) = (b, p) else { panic!("hashed keys are 64-bit") };
    assert_eq!((b[0], b[2]), (p[1], p[0]));
    assert_eq!((b[1], p[2]), (u64::MAX, u64::MAX));
    assert_ne!(b[0], b[2]);
}

#[test]
fn verification_rejects_pairs_that_only_share_a_hash() {
    let build: Vec<ArrayRef> = vec![Arc::new(StringArray::from(vec![Some("a"), Some("b"), None]))];
    let probe: Vec<ArrayRef> = vec![Arc::new(StringArray::from(vec![Some("a"), Some("c"), None]))];
    // Pairs as a colliding hash would propose them.
    let (build_rows, probe_rows) = ([0, 1, 2, 0], [0, 1, 2, 2]);
    let mut keep = [true; 4];
    verify_candidates(&build, &probe, &build_rows, &probe_rows, NullEquality::NullEqualsNothing, &mut keep).unwrap();
    assert_eq!(keep, [true, false, false, false]);
    let mut keep = [true; 4];
    verify_candidates(&build, &probe, &build_rows, &probe_rows, NullEquality::NullEqualsNull, &mut keep).unwrap();
    assert_eq!(keep, [true, false, true, false]);
}

#[test]
fn empty_or_all_null_build_sides_match_nothing() {
    let build: ArrayRef = Arc::new(Int32Array::from(vec![None, None]));
    let probe: ArrayRef = Arc::new(Int32Array::from(vec![Some(1), None]));
    let (_, b, p) = encode(vec![Arc::clone(&build)], vec![Arc::clone(&probe)], NullEquality::NullEqualsNothing);
    assert_eq!((b, p), (NormalizedKeys::U32(vec![u32::MAX; 2]), NormalizedKeys::U32(vec![u32::MAX; 2])));
    let (_, b, p) = encode(vec![build], vec![probe], NullEquality::NullEqualsNull);
    assert_eq!((b, p), (NormalizedKeys::U32(vec![0, 0]), NormalizedKeys::U32(vec![u32::MAX, 0])));
}

#[test]
fn supported_key_types() {
    use arrow::datatypes::DataType;
    assert!(is_supported_key_type(&DataType::Utf8View));
    assert!(is_supported_key_type(&DataType::Dictionary(Box::new(DataType::Int16), Box::new(DataType::Utf8))));
    assert!(!is_supported_key_type(&DataType::Dictionary(Box::new(DataType::Utf8), Box::new(DataType::Utf8))));
    assert!(!is_supported_key_type(&DataType::new_list(DataType::Int32, true)));
}

#[test]
fn a_build_side_in_pieces_encodes_as_the_whole() {
    let whole: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![Some(40), Some(-3), None, Some(7), Some(12), Some(-9)])),
        Arc::new(Int32Array::from(vec![Some(1), Some(2), Some(3), None, Some(5), Some(0)])),
    ];
    // Uneven pieces, one of them empty, the extremes in different pieces.
    let pieces: Vec<Vec<ArrayRef>> = [(0, 2), (2, 0), (2, 3), (5, 1)]
        .iter()
        .map(|&(at, len)| whole.iter().map(|k| k.slice(at, len)).collect())
        .collect();
    for nulls in [NullEquality::NullEqualsNothing, NullEquality::NullEqualsNull] {
        let from_whole = KeyEncoder::for_build_side(std::slice::from_ref(&whole), nulls).unwrap();
        let from_pieces = KeyEncoder::for_build_side(&pieces, nulls).unwrap();
        assert_eq!(from_whole.describe(), from_pieces.describe());
        assert_eq!(from_whole.encode(&whole).unwrap(), from_pieces.encode(&whole).unwrap());
    }
}

#[test]
fn key_ranges_gathered_piece_by_piece_choose_the_same_encoding() {
    let int_keys: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![Some(40), Some(-3), None, Some(7), Some(12), Some(-9)])),
        Arc::new(BooleanArray::from(vec![Some(true), None, Some(false), Some(true), None, Some(false)])),
    ];
    let string_keys: Vec<ArrayRef> = vec![
        Arc::new(Int32Array::from(vec![Some(1), Some(2), Some(3), None, Some(5), Some(0)])),
        Arc::new(StringArray::from(vec![Some("a"), Some("b"), None, Some("d"), Some("e"), Some("f")])),
    ];
    for whole in [int_keys, string_keys] {
        let pieces: Vec<Vec<ArrayRef>> = [(0, 2), (2, 0), (2, 3), (5, 1)]
            .iter()
            .map(|&(at, len)| whole.iter().map(|k| k.slice(at, len)).collect())
            .collect();
        let ranges = pieces.iter().map(|keys| KeyRanges::of_piece(keys)).reduce(KeyRanges::merge).unwrap();
        for nulls in [NullEquality::NullEqualsNothing, NullEquality::NullEqualsNull] {
            let from_pieces = KeyEncoder::for_build_side(&pieces, nulls).unwrap();
            let from_ranges = KeyEncoder::for_key_ranges(&ranges, nulls).unwrap();
            assert_eq!(from_pieces.describe(), from_ranges.describe());
            assert_eq!(from_pieces.encode(&whole).unwrap(), from_ranges.encode(&whole).unwrap());
        }
    }
}

#[test]
fn a_string_key_hashes_even_when_its_pieces_are_empty() {
    let piece: Vec<ArrayRef> =
        vec![Arc::new(Int32Array::from(Vec::<i32>::new())), Arc::new(StringArray::from(Vec::<&str>::new()))];
    let encoder = KeyEncoder::for_build_side(&[piece.clone(), piece], NullEquality::NullEqualsNothing).unwrap();
    assert_eq!(encoder.exactness(), KeyExactness::NeedsVerification);
}

/// Ordered keys sort in SQL order, NULLs first or last, columns ascending
/// or descending; the build side's NULLs sort in place but never match.
#[test]
fn ordered_keys_sort_in_sql_order_and_build_nulls_never_match() {
    use arrow::compute::{SortColumn, SortOptions, lexsort_to_indices};
    let first: ArrayRef = Arc::new(Int32Array::from(vec![Some(3), None, Some(-2), Some(3), None, Some(7)]));
    let second: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), Some(5), None, Some(-4), None, Some(1)]));
    let build = vec![first, second];
    for (descending, nulls_first) in [(false, true), (false, false), (true, true), (true, false)] {
        let order = [SortOptions { descending, nulls_first }, SortOptions { descending: !descending, nulls_first }];
        let ranges = KeyRanges::of_pieces(std::slice::from_ref(&build));
        for nulls in [NullEquality::NullEqualsNothing, NullEquality::NullEqualsNull] {
            let encoder = KeyEncoder::for_ordered_keys(&ranges, nulls, &order).unwrap().unwrap();
            let NormalizedKeys::U32(codes) = encoder.encode(&build).unwrap() else { panic!("32-bit keys") };
            let columns: Vec<SortColumn> =
                build.iter().zip(order).map(|(k, o)| SortColumn { values: Arc::clone(k), options: Some(o) }).collect();
            let sql_order: Vec<u32> = lexsort_to_indices(&columns, None).unwrap().values().to_vec();
            let sorted: Vec<u32> = sql_order.iter().map(|&i| codes[i as usize]).collect();
            assert!(sorted.windows(2).all(|w| w[0] <= w[1]), "{order:?} {nulls:?}: {sorted:?}");
            assert!(codes.iter().all(|&c| c != u32::MAX), "every build row sorts in place");
            let NormalizedKeys::U32(probe) = encoder.for_probe_side().encode(&build).unwrap() else {
                panic!("32-bit keys")
            };
            for (row, (&b, &p)) in codes.iter().zip(&probe).enumerate() {
                let has_null = build.iter().any(|k| k.is_null(row));
                match (has_null, nulls) {
                    (true, NullEquality::NullEqualsNothing) => assert_eq!(p, u32::MAX, "row {row}"),
                    _ => assert_eq!(p, b, "row {row}"),
                }
            }
        }
    }
}

/// A key of one integer column without NULLs is coded in the values' own
/// width: the distance from the build side's bound, or the unmatchable key
/// outside its range, the type's extremes included; a probe column whose
/// type cannot hold the build side's bounds is coded all the same.
#[test]
fn single_column_codes_are_distances_within_the_build_range() {
    use arrow::array::{Int8Array, UInt8Array, UInt32Array};
    use arrow::compute::{SortOptions, cast};
    use arrow::datatypes::DataType;
    let cases: Vec<(ArrayRef, ArrayRef)> = vec![
        (
            Arc::new(Int8Array::from(vec![20, -100, 3])),
            Arc::new(Int8Array::from(vec![i8::MIN, -101, -100, 0, 20, 21, i8::MAX])),
        ),
        (Arc::new(UInt8Array::from(vec![200, 3])), Arc::new(UInt8Array::from(vec![0, 2, 3, 200, 201, u8::MAX]))),
        (
            Arc::new(Int32Array::from(vec![1 << 30, -7])),
            Arc::new(Int32Array::from(vec![i32::MIN, -8, -7, 5, 1 << 30, (1 << 30) + 1, i32::MAX])),
        ),
        (
            Arc::new(UInt32Array::from(vec![10, 4_000_000_000])),
            Arc::new(UInt32Array::from(vec![0, 9, 10, 4_000_000_000, 4_000_000_001, u32::MAX])),
        ),
        (
            Arc::new(Int64Array::from(vec![i64::MIN + 5, i64::MIN + 1000])),
            Arc::new(Int64Array::from(vec![i64::MIN, i64::MIN + 5, i64::MIN + 1001, 0, i64::MAX])),
        ),
        (
            Arc::new(UInt64Array::from(vec![u64::MAX - 10, u64::MAX - 2])),
            Arc::new(UInt64Array::from(vec![0, u64::MAX - 11, u64::MAX - 10, u64::MAX - 2, u64::MAX - 1, u64::MAX])),
        ),
        (
            Arc::new(Int64Array::from(vec![-5, 3_000_000_000])),
            Arc::new(Int32Array::from(vec![i32::MIN, -6, -5, 0, i32::MAX])),
        ),
        (
            Arc::new(Decimal128Array::from(vec![-(10_i128.pow(20)), 100 - 10_i128.pow(20)])),
            Arc::new(Decimal128Array::from(vec![
                i128::MIN,
                -(10_i128.pow(20)) - 1,
                -(10_i128.pow(20)),
                100 - 10_i128.pow(20),
                101 - 10_i128.pow(20),
                (1 << 64) - 10_i128.pow(20),
                i128::MAX,
            ])),
        ),
    ];
    let as_i128 = |array: &ArrayRef| -> Vec<i128> {
        let decimal = match array.data_type() {
            DataType::Decimal128(..) => Arc::clone(array),
            _ => cast(array, &DataType::Decimal128(38, 0)).unwrap(),
        };
        decimal.as_any().downcast_ref::<Decimal128Array>().unwrap().values().to_vec()
    };
    let codes = |keys: NormalizedKeys| -> Vec<u64> {
        match keys {
            NormalizedKeys::U32(k) => {
                k.into_iter().map(|c| if c == u32::MAX { u64::MAX } else { u64::from(c) }).collect()
            }
            NormalizedKeys::U64(k) => k,
        }
    };
    for (build, probe) in cases {
        let values = as_i128(&build);
        let (lo, hi) = (*values.iter().min().unwrap(), *values.iter().max().unwrap());
        let ranges = KeyRanges::of_pieces(&[vec![Arc::clone(&build)]]);
        let mut encoders =
            vec![(KeyEncoder::for_key_ranges(&ranges, NullEquality::NullEqualsNothing).unwrap(), false, 0)];
        for (descending, nulls_first) in [(false, true), (false, false), (true, true), (true, false)] {
            let order = [SortOptions { descending, nulls_first }];
            let encoder = KeyEncoder::for_ordered_keys(&ranges, NullEquality::NullEqualsNothing, &order).unwrap();
            encoders.push((encoder.unwrap(), descending, u64::from(nulls_first)));
        }
        for (encoder, descending, shift) in encoders {
            let expected: Vec<u64> = as_i128(&probe)
                .into_iter()
                .map(|v| match (lo..=hi).contains(&v) {
                    true => (if descending { hi - v } else { v - lo }) as u64 + shift,
                    false => u64::MAX,
                })
                .collect();
            let got = codes(encoder.for_probe_side().encode(std::slice::from_ref(&probe)).unwrap());
            assert_eq!(
                got,
                expected,
                "{} probe of a {} build side, {}",
                probe.data_type(),
                build.data_type(),
                encoder.describe()
            );
        }
    }
}

#[test]
fn spans_become_bounds_of_each_keys_own_type() {
    use arrow::array::{Date32Array, TimestampMicrosecondArray};
    use arrow::datatypes::DataType;
    use datafusion::common::ScalarValue;

    let timestamps = TimestampMicrosecondArray::from(vec![Some(7), Some(-3)]).with_timezone("+02:00");
    let decimals = Decimal128Array::from(vec![Some(1234), Some(-5)]).with_precision_and_scale(10, 2).unwrap();
    let keys: Vec<ArrayRef> = vec![
        Arc::new(UInt64Array::from(vec![Some(u64::MAX), Some(3)])),
        Arc::new(Date32Array::from(vec![Some(19000), None])),
        Arc::new(timestamps),
        Arc::new(decimals),
        Arc::new(Int32Array::from(vec![None, None])),
        Arc::new(BooleanArray::from(vec![Some(true), Some(true)])),
        Arc::new(StringArray::from(vec![Some("a"), Some("b")])),
    ];
    let types: Vec<DataType> = keys.iter().map(|k| k.data_type().clone()).collect();
    let tz = Some(Arc::from("+02:00"));
    assert_eq!(
        KeyRanges::of_piece(&keys).bounds(&types),
        vec![
            SpanBounds::Between(ScalarValue::UInt64(Some(3)), ScalarValue::UInt64(Some(u64::MAX))),
            SpanBounds::Between(ScalarValue::Date32(Some(19000)), ScalarValue::Date32(Some(19000))),
            SpanBounds::Between(
                ScalarValue::TimestampMicrosecond(Some(-3), tz.clone()),
                ScalarValue::TimestampMicrosecond(Some(7), tz)
            ),
            SpanBounds::Between(ScalarValue::Decimal128(Some(-5), 10, 2), ScalarValue::Decimal128(Some(1234), 10, 2)),
            SpanBounds::NoValue,
            // Booleans span both values; strings are hashed, not spanned.
            SpanBounds::Unknown,
            SpanBounds::Unknown,
        ]
    );
}

/// Raw bits of `column`'s type in the type's order.
fn as_ordered(column: &ArrayRef, bits: u32) -> i64 {
    match RawKeys::of_type(column.data_type()) {
        Some(RawKeys::Signed) => i64::from(bits as i32),
        _ => i64::from(bits),
    }
}

/// Copies `pieces` (one key column) as raw bits the way an upload asks for
/// them, in parts of `part` rows that cross the pieces' ends.
fn copied_raw(pieces: &[ArrayRef], part: usize) -> (Vec<u32>, RawSpan) {
    let raw = RawKeys::of_column(pieces[0].as_ref()).unwrap();
    let span = RawSpan::default();
    let mut bits = vec![];
    for piece in pieces {
        let mut out = vec![0u32; piece.len()];
        for (i, chunk) in out.chunks_mut(part).enumerate() {
            raw.copy(piece.as_ref(), i * part, chunk, &span).unwrap();
        }
        bits.extend(out);
    }
    (bits, span)
}

#[test]
fn raw_keys_coded_as_the_encoder_codes_them() {
    use arrow::array::{Date32Array, Decimal32Array, UInt32Array};
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x0072_6177);
    let rows = 5_000;
    let mut int32 = |base: i32| -> ArrayRef {
        Arc::new((0..rows).map(|_| base.wrapping_add(rng.random_range(0..1_000_000))).collect::<Int32Array>())
    };
    let columns: Vec<ArrayRef> = vec![
        int32(i32::MIN),
        int32(i32::MAX - 999_999),
        int32(-500_000),
        Arc::new(UInt32Array::from_iter_values((0..rows as u32).map(|i| u32::MAX - (i * 7919) % 100_000))),
        Arc::new(Date32Array::from_iter_values((0..rows as i32).map(|i| 19_000 - i % 400))),
        Arc::new(
            Decimal32Array::from_iter_values((0..rows as i32).map(|i| i * 3 - 7_000))
                .with_precision_and_scale(9, 2)
                .unwrap(),
        ),
    ];
    for column in columns {
        // Pieces of uneven lengths, one of them empty.
        let pieces: Vec<ArrayRef> =
            vec![column.slice(0, 1_234), column.slice(1_234, 0), column.slice(1_234, rows - 1_234)];
        let pieces_as_keys: Vec<Vec<ArrayRef>> = pieces.iter().map(|p| vec![Arc::clone(p)]).collect();
        let (bits, span) = copied_raw(&pieces, 1_000);
        assert_eq!(span.ranges(), KeyRanges::of_pieces(&pieces_as_keys), "{}", column.data_type());
        // Probe values around the build side's span and past both of its
        // ends, wrapping where the span starts at the type's smallest value.
        let (lo, hi) = (*bits.iter().min_by_key(|b| as_ordered(&column, **b)).unwrap(), {
            *bits.iter().max_by_key(|b| as_ordered(&column, **b)).unwrap()
        });
        let probe_bits: Vec<u32> = (0..rows as u32)
            .map(|i| match i % 3 {
                0 => lo.wrapping_sub(1 + i % 1_000),
                1 => hi.wrapping_add(1 + i % 1_000),
                _ => bits[i as usize],
            })
            .collect();
        let probe = make_array(
            ArrayData::builder(column.data_type().clone())
                .len(rows)
                .add_buffer(Buffer::from_vec(probe_bits.clone()))
                .build()
                .unwrap(),
        );
        for nulls in [NullEquality::NullEqualsNothing, NullEquality::NullEqualsNull] {
            let encoder = KeyEncoder::for_key_ranges(&span.ranges(), nulls).unwrap();
            let raw = encoder.raw_codes().unwrap();
            let codes: Vec<u32> = bits.iter().map(|&b| raw.code(b)).collect();
            assert_eq!(NormalizedKeys::U32(codes), encoder.encode(&[Arc::clone(&column)]).unwrap(), "{nulls:?}");
            let probe_encoder = encoder.for_probe_side();
            let probe_codes: Vec<u32> = probe_bits.iter().map(|&b| raw.code(b)).collect();
            assert_eq!(probe_codes.iter().filter(|&&c| c == u32::MAX).count(), (0..rows).filter(|i| i % 3 < 2).count());
            let expected = probe_encoder.encode(&[Arc::clone(&probe)]).unwrap();
            assert_eq!(NormalizedKeys::U32(probe_codes), expected, "probe side, {nulls:?}");
        }
    }
}

#[test]
fn raw_keys_only_where_codes_are_the_raw_bits_less_one_value() {
    // A span wider than 31 bits codes in 64 bits.
    let wide: ArrayRef = Arc::new(Int32Array::from(vec![i32::MIN, i32::MAX]));
    let (_, span) = copied_raw(std::slice::from_ref(&wide), 1);
    let encoder = KeyEncoder::for_key_ranges(&span.ranges(), NullEquality::NullEqualsNothing).unwrap();
    assert_eq!((encoder.key_bits(), encoder.raw_codes()), (64, None));
    // Codes that count down from the largest value.
    let narrow: ArrayRef = Arc::new(Int32Array::from(vec![3, 9]));
    let (_, span) = copied_raw(std::slice::from_ref(&narrow), 2);
    let descending = [SortOptions { descending: true, nulls_first: false }];
    let encoder = KeyEncoder::for_ordered_keys(&span.ranges(), NullEquality::NullEqualsNothing, &descending).unwrap();
    assert_eq!(encoder.unwrap().raw_codes(), None);
    // Columns of other widths, or holding NULLs, do not go up raw.
    assert_eq!(RawKeys::of_column(&Int64Array::from(vec![1, 2])), None);
    assert_eq!(RawKeys::of_column(&Int32Array::from(vec![Some(1), None])), None);
    let two = vec![Arc::clone(&narrow), narrow];
    let encoder = KeyEncoder::for_build_side(&[two], NullEquality::NullEqualsNothing).unwrap();
    assert_eq!(encoder.raw_codes(), None);
}
