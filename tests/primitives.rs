//! Differential tests of the join primitives on fresh random inputs.
//!
//! The CPU backend is checked against plain definitions (a stable partition
//! is a stable sort by partition id; matches are the pairs of equal keys);
//! the backend under test (`GPU_JOIN_TEST_BACKEND`) must then produce exactly
//! what the CPU backend produces: the same transformed relations, and the
//! same set of matches. `GPU_JOIN_PRIMITIVE_MAX_ROWS` raises the largest
//! input (default 20 000 rows; 2^27 on a GPU).

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, Date32Array, Decimal128Array, Float64Array, Int8Array, Int16Array, Int32Array,
    Int64Array, StringArray, TimestampMicrosecondArray, UInt8Array, UInt16Array, UInt32Array, UInt64Array,
};
use arrow::compute::take;
use arrow::datatypes::{DataType, TimeUnit};
use datafusion_gpu_join::backend::cpu::CpuBackend;
use datafusion_gpu_join::backend::cuda::CudaBackend;
use datafusion_gpu_join::backend::{
    BackendHandle, Candidates, Comparison, DeviceCounters, JoinBackend, Layout, MAX_CANDIDATES, MatchFlags,
    NULL_POSITION, PartitionSpec, SortSpec, Space, Transformed,
};
use datafusion_gpu_join::keys::{NormalizedKey, RawCodes};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

use crate::common::test_backend;

/// Above this many rows only the most used configurations run.
const LARGE_ROWS: usize = 1 << 22;

fn max_rows() -> usize {
    std::env::var("GPU_JOIN_PRIMITIVE_MAX_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000)
}

fn seed() -> u64 {
    std::env::var("GPU_JOIN_PRIMITIVE_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
    })
}

/// Row counts: tiny, not powers of two, and the largest allowed.
fn sizes() -> Vec<usize> {
    let max = max_rows();
    let mut sizes: Vec<usize> = [0, 1, 2, 31, 1000, 4097, 65_537].into_iter().filter(|&n| n < max).collect();
    sizes.push(max);
    sizes
}

/// Key distributions: unique shuffled keys, few distinct keys, one heavy
/// hitter, and a share of unmatchable keys (NULLs or out-of-range values).
#[derive(Debug, Clone, Copy)]
enum Keys {
    DenseUnique,
    FewDistinct,
    Skewed,
    WithUnmatchable,
}

fn keys<K: NormalizedKey>(rng: &mut StdRng, rows: usize, kind: Keys) -> Vec<K> {
    let domain = (rows as u64).max(1);
    let mut keys: Vec<u64> = match kind {
        Keys::DenseUnique => (0..rows as u64).collect(),
        Keys::FewDistinct => (0..rows).map(|_| rng.random_range(0..7)).collect(),
        Keys::Skewed => {
            (0..rows).map(|_| if rng.random_bool(0.7) { 42 } else { rng.random_range(0..domain) }).collect()
        }
        Keys::WithUnmatchable => (0..rows)
            .map(|_| if rng.random_bool(0.2) { K::UNMATCHABLE.to_u64() } else { rng.random_range(0..domain) })
            .collect(),
    };
    keys.shuffle(rng);
    // 64-bit keys use their high bits too.
    let spread = if K::BITS == 64 { 0x0100_0000_0001u64 } else { 1 };
    keys.into_iter()
        .map(|k| if k == K::UNMATCHABLE.to_u64() { K::UNMATCHABLE } else { K::from_u64(k.wrapping_mul(spread)) })
        .collect()
}

fn payload(rng: &mut StdRng, rows: usize) -> ArrayRef {
    Arc::new((0..rows).map(|_| rng.random_bool(0.9).then(|| rng.random::<i32>())).collect::<Int32Array>())
}

fn open<B: JoinBackend>(device: &B::Device) -> B {
    B::open(device, Arc::new(DeviceCounters::default())).expect("backend opens")
}

/// A transformed relation brought back to the host for comparison.
#[derive(Debug, PartialEq)]
struct HostRelation<K> {
    keys: Vec<K>,
    row_ids: Option<Vec<u32>>,
    payloads: Vec<ArrayRef>,
    offsets: Vec<u32>,
    layout: Layout,
}

fn to_host<B: JoinBackend, K: NormalizedKey>(backend: &B, relation: &Transformed<B, K>) -> HostRelation<K> {
    HostRelation {
        keys: backend.download(&relation.keys).unwrap(),
        row_ids: relation.row_ids.as_ref().map(|ids| backend.download(ids).unwrap()),
        payloads: relation.payloads.iter().map(|p| backend.download_column(p).unwrap()).collect(),
        offsets: backend.download(&relation.offsets).unwrap(),
        layout: relation.layout,
    }
}

fn transform<B: JoinBackend, K: NormalizedKey>(
    backend: &B,
    keys: &[K],
    payload: &ArrayRef,
    layout: Layout,
) -> Transformed<B, K> {
    let keys = backend.upload(keys).unwrap();
    let payload = backend.upload_column(payload).unwrap();
    match layout {
        Layout::Partitioned(spec) => backend.partition(&keys, &[&payload], true, spec).unwrap(),
        Layout::Sorted(spec) => backend.sort(&keys, &[&payload], true, spec).unwrap(),
    }
}

/// The narrowest sort of every side's keys, as a packed encoding gives:
/// their matchable values' bits and one more.
fn tight_sort<K: NormalizedKey>(sides: &[&[K]]) -> SortSpec {
    let largest = sides.iter().copied().flatten().filter(|k| **k != K::UNMATCHABLE).map(|k| k.to_u64()).max();
    SortSpec::for_value_bits::<K>(largest.map_or(0, |k| u64::BITS - k.leading_zeros()))
}

/// The definition of a transform: a stable sort by partition id (or by the
/// key bits sorted by).
fn expected_order<K: NormalizedKey>(keys: &[K], layout: Layout) -> Vec<u32> {
    let mut order: Vec<u32> = (0..keys.len() as u32).collect();
    match layout {
        Layout::Partitioned(spec) => order.par_sort_by_key(|&r| spec.partition_of(keys[r as usize])),
        Layout::Sorted(spec) => order.par_sort_by_key(|&r| spec.sort_key(keys[r as usize])),
    }
    order
}

/// Pairs of equal, matchable keys as (build row, probe row), sorted: a
/// merge of both sides sorted by key.
fn expected_matches<K: NormalizedKey>(build: &[K], probe: &[K]) -> Vec<(u32, u32)> {
    let sorted = |keys: &[K]| {
        let mut rows: Vec<(K, u32)> =
            keys.iter().enumerate().filter(|(_, k)| **k != K::UNMATCHABLE).map(|(r, k)| (*k, r as u32)).collect();
        rows.par_sort_unstable();
        rows
    };
    let (build, probe) = (sorted(build), sorted(probe));
    let mut pairs = vec![];
    let (mut i, mut j) = (0, 0);
    while i < build.len() && j < probe.len() {
        match build[i].0.cmp(&probe[j].0) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                let key = build[i].0;
                let i_end = i + build[i..].iter().take_while(|(k, _)| *k == key).count();
                let j_end = j + probe[j..].iter().take_while(|(k, _)| *k == key).count();
                for b in &build[i..i_end] {
                    pairs.extend(probe[j..j_end].iter().map(|p| (b.1, p.1)));
                }
                (i, j) = (i_end, j_end);
            }
        }
    }
    pairs.par_sort_unstable();
    pairs
}

/// The match of the relations' layout: hash tables (`tables`, or built
/// for this match) or a merge.
fn find_matches<B: JoinBackend, K: NormalizedKey>(
    backend: &B,
    build: &Transformed<B, K>,
    tables: Option<&B::HashTables>,
    probe: &Transformed<B, K>,
    spaces: (Space, Space),
) -> Candidates<B> {
    match (build.layout, tables) {
        (Layout::Partitioned(_), Some(tables)) => backend.hash_match(build, tables, probe, spaces).unwrap(),
        (Layout::Partitioned(_), None) => {
            backend.hash_match(build, &backend.hash_tables(build).unwrap(), probe, spaces).unwrap()
        }
        (Layout::Sorted(_), _) => backend.merge_match(build, probe, spaces).unwrap(),
    }
}

fn matches_as_rows<B: JoinBackend, K: NormalizedKey>(
    backend: &B,
    build: &Transformed<B, K>,
    tables: Option<&B::HashTables>,
    probe: &Transformed<B, K>,
    spaces: (Space, Space),
) -> Vec<(u32, u32)> {
    let candidates = find_matches(backend, build, tables, probe, spaces);
    let rows = |positions: &B::Vector<u32>, relation: &Transformed<B, K>, space: Space| -> Vec<u32> {
        let positions = backend.download(positions).unwrap();
        match space {
            Space::Original => positions,
            Space::Transformed => {
                let ids = backend.download(relation.row_ids.as_ref().unwrap()).unwrap();
                positions.iter().map(|&p| ids[p as usize]).collect()
            }
        }
    };
    let mut pairs: Vec<(u32, u32)> =
        rows(&candidates.build, build, spaces.0).into_iter().zip(rows(&candidates.probe, probe, spaces.1)).collect();
    pairs.par_sort_unstable();
    pairs
}

/// The build and probe rows that have a match, as the pairs say: sorted
/// original rows of each side.
fn rows_with_a_match(pairs: &[(u32, u32)]) -> (Vec<u32>, Vec<u32>) {
    let side = |row: fn(&(u32, u32)) -> u32| {
        let mut rows: Vec<u32> = pairs.iter().map(row).collect();
        rows.par_sort_unstable();
        rows.dedup();
        rows
    };
    (side(|p| p.0), side(|p| p.1))
}

/// The rows `flags` set, as original rows: positions mapped by the
/// relation's row ids where the flags are in its transformed space.
fn flagged_rows<B: JoinBackend>(backend: &B, flags: Option<B::Flags>, row_ids: Option<&[u32]>) -> Vec<u32> {
    let Some(flags) = flags else {
        return vec![];
    };
    let set = backend.download_flags(&flags).unwrap();
    let mut rows: Vec<u32> =
        (0..set.len() as u32).filter(|&i| set[i as usize]).map(|i| row_ids.map_or(i, |ids| ids[i as usize])).collect();
    rows.par_sort_unstable();
    rows
}

/// Which sides a mark flags: build rows, probe rows, or both.
const MARKED_SIDES: [(bool, bool); 3] = [(true, false), (false, true), (true, true)];

/// The rows of each side with a match, as the layout's mark flags them
/// without pairs: hash tables (`tables`, or built for this mark) or a
/// sorted search; empty for a side not marked.
fn marks_as_rows<B: JoinBackend, K: NormalizedKey>(
    backend: &B,
    build: &Transformed<B, K>,
    tables: Option<&B::HashTables>,
    probe: &Transformed<B, K>,
    spaces: (Space, Space),
    (mark_build, mark_probe): (bool, bool),
) -> (Vec<u32>, Vec<u32>) {
    let build_flags = mark_build.then(|| backend.new_flags(build.rows).unwrap());
    let probe_flags = mark_probe.then(|| backend.new_flags(probe.rows).unwrap());
    let flags = MatchFlags { build: build_flags.as_ref(), probe: probe_flags.as_ref() };
    match (build.layout, tables) {
        (Layout::Partitioned(_), Some(tables)) => backend.hash_mark(build, tables, probe, spaces, flags).unwrap(),
        (Layout::Partitioned(_), None) => {
            backend.hash_mark(build, &backend.hash_tables(build).unwrap(), probe, spaces, flags).unwrap()
        }
        (Layout::Sorted(_), _) => backend.merge_mark(build, probe, spaces, flags).unwrap(),
    }
    let ids = |relation: &Transformed<B, K>, space: Space| match space {
        Space::Original => None,
        Space::Transformed => Some(backend.download(relation.row_ids.as_ref().unwrap()).unwrap()),
    };
    let (build_ids, probe_ids) = (ids(build, spaces.0), ids(probe, spaces.1));
    (flagged_rows(backend, build_flags, build_ids.as_deref()), flagged_rows(backend, probe_flags, probe_ids.as_deref()))
}

/// The definition of a directory: entry `c` counts the build keys below
/// code `c` (unmatchable keys are above every code).
fn expected_directory<K: NormalizedKey>(build: &[K], codes: u32) -> Vec<u32> {
    let mut directory = vec![0u32; codes as usize + 1];
    for key in build.iter().map(|k| k.to_u64()).filter(|&k| k < u64::from(codes)) {
        directory[key as usize + 1] += 1;
    }
    directory
        .iter()
        .scan(0, |sum, &count| {
            *sum += count;
            Some(*sum)
        })
        .collect()
}

/// Largest key bits a sort's spec may have for the directory join to be
/// tested on it: a directory of at most 2^28 codes.
const DIRECTORY_KEY_BITS: u32 = 29;

/// A sorted build side's directory, and the directory match of each probe
/// side's keys as they are, against the definitions: every pair of equal
/// keys, in probe order.
fn check_directory_match<B: JoinBackend, K: NormalizedKey>(
    tested: &B,
    build: &Transformed<B, K>,
    build_keys: &[K],
    probes: &[(Vec<K>, ArrayRef)],
    spec: SortSpec,
    what: &str,
) {
    let codes = 1u32 << (spec.key_bits - 1);
    let directory = tested.directory(build, codes).unwrap();
    let expected = expected_directory(build_keys, codes);
    assert!(tested.download(&directory).unwrap() == expected, "{what}: the directory of {codes} codes differs");
    let row_ids = tested.download(build.row_ids.as_ref().unwrap()).unwrap();
    for (probe_keys, _) in probes {
        let keys = tested.upload(probe_keys).unwrap();
        for space in [Space::Transformed, Space::Original] {
            let candidates = tested.directory_match(build, &directory, &keys, space).unwrap();
            let probe = tested.download(&candidates.probe).unwrap();
            assert!(probe.is_sorted(), "{what}, {space:?}: directory matches out of probe order");
            let build_rows = tested.download(&candidates.build).unwrap().into_iter().map(|p| match space {
                Space::Transformed => row_ids[p as usize],
                Space::Original => p,
            });
            let mut pairs: Vec<(u32, u32)> = build_rows.zip(probe).collect();
            pairs.par_sort_unstable();
            let expected = expected_matches(build_keys, probe_keys);
            assert!(pairs == expected, "{what}, {} probe rows, {space:?}: directory matches differ", probe_keys.len());
            let (build_matched, probe_matched) = rows_with_a_match(&expected);
            for (mark_build, mark_probe) in MARKED_SIDES {
                let build_flags = mark_build.then(|| tested.new_flags(build.rows).unwrap());
                let probe_flags = mark_probe.then(|| tested.new_flags(probe_keys.len()).unwrap());
                let flags = MatchFlags { build: build_flags.as_ref(), probe: probe_flags.as_ref() };
                tested.directory_mark(build, &directory, &keys, space, flags).unwrap();
                let build_ids = matches!(space, Space::Transformed).then_some(row_ids.as_slice());
                let marked = (flagged_rows(tested, build_flags, build_ids), flagged_rows(tested, probe_flags, None));
                let expected = (
                    if mark_build { build_matched.clone() } else { vec![] },
                    if mark_probe { probe_matched.clone() } else { vec![] },
                );
                assert!(
                    marked == expected,
                    "{what}, {} probe rows, {space:?}, marking ({mark_build}, {mark_probe}): directory marks differ",
                    probe_keys.len()
                );
            }
        }
    }
}

fn check_transform_and_match<B: JoinBackend, K: NormalizedKey>(device: &B::Device, rng: &mut StdRng, case: &str) {
    let (cpu, tested) = (open::<CpuBackend>(&()), open::<B>(device));
    for &rows in &sizes() {
        for kind in [Keys::DenseUnique, Keys::FewDistinct, Keys::Skewed, Keys::WithUnmatchable] {
            // Repeated keys make (nearly) a cartesian product; keep it small.
            if matches!(kind, Keys::FewDistinct | Keys::Skewed) && rows > 1_000 {
                continue;
            }
            // The largest inputs run the configurations joins use most.
            let large = rows > LARGE_ROWS;
            if large && !matches!(kind, Keys::WithUnmatchable) {
                continue;
            }
            // A match makes at most MAX_CANDIDATES pairs (the operator
            // joins larger probe chunks in pieces): a probe side of that
            // many rows, of which about 0.64 match once here, stays below.
            let probe_rows = |n: usize| n.min(MAX_CANDIDATES);
            let (build_keys, build_payload) = (keys::<K>(rng, rows, kind), payload(rng, rows));
            let probes: Vec<(Vec<K>, ArrayRef)> = [rows + rows / 3 + 1, rows / 16 + 1, rows / 16 + 1]
                .into_iter()
                .map(|n| (keys::<K>(rng, probe_rows(n), kind), payload(rng, probe_rows(n))))
                .collect();
            let bits = PartitionSpec::for_build_rows(rows, tested.partition_target_rows()).bits;
            let tight = Layout::Sorted(tight_sort(&[&build_keys, &probes[0].0, &probes[1].0, &probes[2].0]));
            let mut layouts = vec![Layout::Partitioned(PartitionSpec { bits }), tight];
            if !large {
                layouts.extend([Layout::Partitioned(PartitionSpec { bits: 0 }), Layout::Sorted(SortSpec::full::<K>())]);
            }
            for layout in layouts {
                let what = format!("{case}: {rows} rows, {kind:?}, {layout:?}");
                let reference = to_host(&cpu, &transform(&cpu, &build_keys, &build_payload, layout));
                let order = expected_order(&build_keys, layout);
                assert_eq!(reference.row_ids.as_ref(), Some(&order), "{what}: CPU transform is not a stable partition");
                assert_eq!(reference.keys, order.iter().map(|&r| build_keys[r as usize]).collect::<Vec<_>>(), "{what}");
                let expected_payload = take(build_payload.as_ref(), &UInt32Array::from(order.clone()), None).unwrap();
                assert_eq!(reference.payloads[0].as_ref(), expected_payload.as_ref(), "{what}");

                let build = transform(&tested, &build_keys, &build_payload, layout);
                assert_eq!(
                    to_host(&tested, &build),
                    reference,
                    "{what}: transformed relation differs from the CPU backend's"
                );
                // One build side's tables serve every probe side below, as
                // they serve a join's probe chunks: a probe side larger than
                // the build side, then two far smaller ones (probe chunks of a
                // large build side), which a backend may match differently,
                // the second through what the first left built.
                match layout {
                    Layout::Sorted(spec) if layout == tight && spec.key_bits <= DIRECTORY_KEY_BITS => {
                        check_directory_match(&tested, &build, &build_keys, &probes, spec, &what)
                    }
                    _ => {}
                }
                let tables = matches!(layout, Layout::Partitioned(_)).then(|| tested.hash_tables(&build).unwrap());
                for (probe_keys, probe_payload) in &probes {
                    let probe = transform(&tested, probe_keys, probe_payload, layout);
                    let expected = expected_matches(&build_keys, probe_keys);
                    let mut spaces = vec![(Space::Transformed, Space::Transformed), (Space::Original, Space::Original)];
                    if !large {
                        spaces.push((Space::Transformed, Space::Original));
                    }
                    let (build_matched, probe_matched) = rows_with_a_match(&expected);
                    for spaces in spaces {
                        let actual = matches_as_rows(&tested, &build, tables.as_ref(), &probe, spaces);
                        assert!(
                            actual == expected,
                            "{what}, {} probe rows, {spaces:?}: {} matches, expected {}",
                            probe_keys.len(),
                            actual.len(),
                            expected.len()
                        );
                        for sides in MARKED_SIDES {
                            let (build_rows, probe_rows) =
                                marks_as_rows(&tested, &build, tables.as_ref(), &probe, spaces, sides);
                            let expected_build = if sides.0 { build_matched.clone() } else { vec![] };
                            let expected_probe = if sides.1 { probe_matched.clone() } else { vec![] };
                            assert!(
                                build_rows == expected_build && probe_rows == expected_probe,
                                "{what}, {} probe rows, {spaces:?}, marking {sides:?}: rows with a match differ",
                                probe_keys.len()
                            );
                        }
                    }
                }
            }
        }
    }
}

fn check_gathers_and_flags<B: JoinBackend>(device: &B::Device, rng: &mut StdRng) {
    let tested = open::<B>(device);
    for &rows in &sizes() {
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new((0..rows).map(|i| (i % 5 != 0).then_some(i as i8)).collect::<Int8Array>()),
            Arc::new((0..rows).map(|i| (i % 3 != 0).then_some(i as i16)).collect::<Int16Array>()),
            payload(rng, rows),
            Arc::new((0..rows).map(|i| (i % 7 != 0).then_some(i as i64 * -3)).collect::<Int64Array>()),
            Arc::new((0..rows).map(|i| (i % 2 != 0).then_some(i as f64 / 3.0)).collect::<Float64Array>()),
            Arc::new(
                (0..rows)
                    .map(|i| (i % 4 != 0).then_some(i as i128 * 1_000_000_007))
                    .collect::<Decimal128Array>()
                    .with_precision_and_scale(38, 4)
                    .unwrap(),
            ),
            Arc::new((0..rows).map(|i| (i % 6 != 0).then_some(i % 3 == 0)).collect::<BooleanArray>()),
        ];
        // Strings only for a backend that holds them: making 2^27 of them
        // for nothing would dominate the largest size.
        if tested.holds_column(&DataType::Utf8) {
            columns.push(Arc::new((0..rows).map(|i| (i % 5 != 1).then(|| format!("s{i}"))).collect::<StringArray>()));
        }
        let positions: Vec<u32> = (0..rows + rows / 2)
            .map(|_| if rows == 0 || rng.random_bool(0.1) { NULL_POSITION } else { rng.random_range(0..rows as u32) })
            .collect();
        let device_positions = tested.upload(&positions).unwrap();
        let indices: UInt32Array = positions.iter().map(|&p| (p != NULL_POSITION).then_some(p)).collect();
        for column in columns.iter().filter(|c| tested.holds_column(c.data_type())) {
            let uploaded = tested.upload_column(column).unwrap();
            let gathered = tested.gather_column(&uploaded, &device_positions, true).unwrap();
            let expected = take(column.as_ref(), &indices, None).unwrap();
            assert_eq!(
                tested.download_column(&gathered).unwrap().as_ref(),
                expected.as_ref(),
                "{rows} rows of {}",
                column.data_type()
            );
            let in_order = tested.gather_column(&uploaded, &tested.sequence(rows).unwrap(), false).unwrap();
            assert_eq!(tested.download_column(&in_order).unwrap().as_ref(), column.as_ref(), "{rows} rows in order");
        }

        let values: Vec<u32> = (0..rows as u32).map(|i| i.wrapping_mul(2_654_435_761) % (rows as u32 + 1)).collect();
        let gathered = tested
            .download(&tested.gather_positions(&tested.upload(&values).unwrap(), &device_positions).unwrap())
            .unwrap();
        let expected: Vec<u32> =
            positions.iter().map(|&p| if p == NULL_POSITION { NULL_POSITION } else { values[p as usize] }).collect();
        assert_eq!(gathered, expected, "gather_positions, {rows} rows");

        let keep: Vec<u8> = positions.iter().map(|_| u8::from(rng.random_bool(0.4))).collect();
        let selected =
            tested.download(&tested.select(&device_positions, &tested.upload(&keep).unwrap()).unwrap()).unwrap();
        let expected: Vec<u32> = positions.iter().zip(&keep).filter(|(_, k)| **k != 0).map(|(p, _)| *p).collect();
        assert_eq!(selected, expected, "select, {rows} rows");

        assert_eq!(tested.download(&tested.sequence(rows).unwrap()).unwrap(), (0..rows as u32).collect::<Vec<_>>());
        // Random bits around a span that may wrap past the type's end, the
        // shift of a NULL's code: values outside it code as unmatchable.
        let codes =
            RawCodes { lo: rng.random(), span: rng.random_range(0..=rows as u32 * 2), shift: rng.random_range(0..2) };
        let bits: Vec<u32> = (0..rows).map(|_| codes.lo.wrapping_add(rng.random_range(0..=rows as u32 * 4))).collect();
        let coded = tested.download(&tested.raw_codes(tested.upload(&bits).unwrap(), codes).unwrap()).unwrap();
        assert_eq!(coded, bits.iter().map(|&b| codes.code(b)).collect::<Vec<_>>(), "raw codes, {rows} rows");
        // 0 less 1 is the null position; the others each point at the row before.
        let less_one = RawCodes { lo: 1, span: u32::MAX - 1, shift: 0 };
        let shifted = tested.raw_codes(tested.sequence(rows).unwrap(), less_one).unwrap();
        let column = &columns[0];
        let gathered = tested.gather_column(&tested.upload_column(column).unwrap(), &shifted, true).unwrap();
        let indices: UInt32Array = (0..rows as u32).map(|i| i.checked_sub(1)).collect();
        let expected = take(column.as_ref(), &indices, None).unwrap();
        assert_eq!(
            tested.download_column(&gathered).unwrap().as_ref(),
            expected.as_ref(),
            "a sequence less one gathers as positions, {rows} rows"
        );
        assert_eq!(tested.download(&tested.null_positions(rows).unwrap()).unwrap(), vec![NULL_POSITION; rows]);
        let joined =
            tested.download(&tested.concat(&device_positions, &tested.sequence(rows).unwrap()).unwrap()).unwrap();
        assert_eq!(joined, [positions.clone(), (0..rows as u32).collect()].concat());

        let sort_keys: Vec<u32> = positions.iter().map(|p| p % 97).collect();
        let (sorted_keys, sorted_values) =
            tested.sort_pairs(&tested.upload(&sort_keys).unwrap(), &device_positions).unwrap();
        let mut order: Vec<usize> = (0..positions.len()).collect();
        order.par_sort_by_key(|&i| sort_keys[i]);
        assert_eq!(tested.download(&sorted_keys).unwrap(), order.iter().map(|&i| sort_keys[i]).collect::<Vec<_>>());
        assert_eq!(
            tested.download(&sorted_values).unwrap(),
            order.iter().map(|&i| positions[i]).collect::<Vec<_>>(),
            "sort_pairs is stable"
        );

        check_scatter_permutation(&tested, rng, rows);

        let flags = tested.new_flags(rows).unwrap();
        tested.set_flags(&flags, &device_positions).unwrap();
        let mut expected = vec![false; rows];
        positions.iter().filter(|&&p| p != NULL_POSITION).for_each(|&p| expected[p as usize] = true);
        assert_eq!(tested.download_flags(&flags).unwrap(), expected);
        let set: Vec<u32> = (0..rows as u32).filter(|&i| expected[i as usize]).collect();
        let unset: Vec<u32> = (0..rows as u32).filter(|&i| !expected[i as usize]).collect();
        assert_eq!(tested.download(&tested.flagged(&flags, true).unwrap()).unwrap(), set);
        assert_eq!(tested.download(&tested.flagged(&flags, false).unwrap()).unwrap(), unset);
    }
}

/// Values of one integer-like type, as logical values and as an Arrow
/// array: the type's extremes (where a comparison of the wrong signedness
/// or width goes wrong), a small domain (so that equal values are common),
/// and NULLs.
fn comparable_values(rng: &mut StdRng, data_type: &DataType, rows: usize) -> (Vec<Option<i128>>, ArrayRef) {
    let (min, max): (i128, i128) = match data_type {
        DataType::Int8 => (i8::MIN.into(), i8::MAX.into()),
        DataType::Int16 => (i16::MIN.into(), i16::MAX.into()),
        DataType::Int32 | DataType::Date32 => (i32::MIN.into(), i32::MAX.into()),
        DataType::UInt8 => (0, u8::MAX.into()),
        DataType::UInt16 => (0, u16::MAX.into()),
        DataType::UInt32 => (0, u32::MAX.into()),
        DataType::UInt64 => (0, u64::MAX.into()),
        _ => (i64::MIN.into(), i64::MAX.into()),
    };
    let extremes = [min, min + 1, max - 1, max, (min + max) / 2];
    let logical: Vec<Option<i128>> = (0..rows)
        .map(|_| match rng.random_range(0..10) {
            0 => None,
            1 | 2 => Some(*extremes.choose(rng).unwrap()),
            _ => Some(min.max(-3) + rng.random_range(0..8)),
        })
        .collect();
    macro_rules! array {
        ($array:ty, $native:ty) => {
            Arc::new(logical.iter().map(|v| v.map(|v| v as $native)).collect::<$array>()) as ArrayRef
        };
    }
    let array = match data_type {
        DataType::Int8 => array!(Int8Array, i8),
        DataType::Int16 => array!(Int16Array, i16),
        DataType::Int32 => array!(Int32Array, i32),
        DataType::Date32 => array!(Date32Array, i32),
        DataType::UInt8 => array!(UInt8Array, u8),
        DataType::UInt16 => array!(UInt16Array, u16),
        DataType::UInt32 => array!(UInt32Array, u32),
        DataType::UInt64 => array!(UInt64Array, u64),
        DataType::Timestamp(TimeUnit::Microsecond, None) => array!(TimestampMicrosecondArray, i64),
        _ => array!(Int64Array, i64),
    };
    (logical, array)
}

/// Whether two logical values compare as a [`Comparison`] asks.
type Holds = fn(&i128, &i128) -> bool;

/// Join filter comparisons: for pairs of rows of two columns of one type,
/// with NULL values, null rows and flags of earlier comparisons, the flags
/// are exactly where both values are there, compare as asked and the
/// earlier flag is set.
fn check_compare_rows<B: JoinBackend>(device: &B::Device, rng: &mut StdRng) {
    let tested = open::<B>(device);
    let types = [
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::UInt8,
        DataType::UInt16,
        DataType::UInt32,
        DataType::UInt64,
        DataType::Date32,
        DataType::Timestamp(TimeUnit::Microsecond, None),
    ];
    let ops: [(Comparison, Holds); 6] = [
        (Comparison::Eq, i128::eq),
        (Comparison::NotEq, i128::ne),
        (Comparison::Lt, i128::lt),
        (Comparison::LtEq, i128::le),
        (Comparison::Gt, i128::gt),
        (Comparison::GtEq, i128::ge),
    ];
    for &rows in &sizes() {
        // The largest sizes for the join keys' usual types only.
        let types = match rows > LARGE_ROWS {
            true => &types[3..4],
            false => &types[..],
        };
        for data_type in types {
            let (left_rows, right_rows) = (rows.max(1), rng.random_range(1..=rows.max(1)));
            let (left, left_array) = comparable_values(rng, data_type, left_rows);
            let (right, right_array) = comparable_values(rng, data_type, right_rows);
            let row = |rng: &mut StdRng, of: usize| match rng.random_bool(0.02) {
                true => NULL_POSITION,
                false => rng.random_range(0..of as u32),
            };
            let pairs: Vec<(u32, u32)> = (0..rows).map(|_| (row(rng, left_rows), row(rng, right_rows))).collect();
            let (left_positions, right_positions): (Vec<u32>, Vec<u32>) = pairs.iter().copied().unzip();
            let and: Vec<u8> = (0..rows).map(|_| u8::from(rng.random_bool(0.7))).collect();
            let (left_column, right_column) =
                (tested.upload_column(&left_array).unwrap(), tested.upload_column(&right_array).unwrap());
            let (left_positions, right_positions) =
                (tested.upload(&left_positions).unwrap(), tested.upload(&right_positions).unwrap());
            let uploaded_and = tested.upload(&and).unwrap();
            // Every comparison, but one at the largest sizes.
            let ops = match rows > LARGE_ROWS {
                true => vec![*ops.choose(rng).unwrap()],
                false => ops.to_vec(),
            };
            for ((op, holds), with_and) in ops.into_iter().flat_map(|op| [(op, false), (op, true)]) {
                let flags = tested
                    .compare_rows(
                        op,
                        (&left_column, &left_positions),
                        (&right_column, &right_positions),
                        with_and.then_some(&uploaded_and),
                    )
                    .unwrap();
                let value = |values: &[Option<i128>], row: u32| match row {
                    NULL_POSITION => None,
                    row => values[row as usize],
                };
                let expected: Vec<u8> = pairs
                    .iter()
                    .zip(&and)
                    .map(|(&(l, r), &and)| {
                        let compared =
                            matches!((value(&left, l), value(&right, r)), (Some(a), Some(b)) if holds(&a, &b));
                        u8::from(compared && (!with_and || and != 0))
                    })
                    .collect();
                assert_eq!(
                    tested.download(&flags).unwrap(),
                    expected,
                    "{rows} pairs of {data_type} {op:?}, and {with_and}"
                );
            }
        }
    }
}

/// A permutation scatters its values into place; positions that are not
/// one (a position twice, a null one, one out of range, one too few) give
/// `None`.
fn check_scatter_permutation<B: JoinBackend>(tested: &B, rng: &mut StdRng, rows: usize) {
    let mut permutation: Vec<u32> = (0..rows as u32).collect();
    permutation.shuffle(rng);
    let values: Vec<u32> = (0..rows).map(|_| rng.random()).collect();
    let scatter = |positions: &[u32], values: &[u32], len: usize| {
        let scattered = tested
            .scatter_permutation(&tested.upload(positions).unwrap(), &tested.upload(values).unwrap(), len)
            .unwrap();
        scattered.map(|scattered| tested.download(&scattered).unwrap())
    };
    let mut expected = vec![0; rows];
    permutation.iter().zip(&values).for_each(|(&p, &v)| expected[p as usize] = v);
    assert_eq!(scatter(&permutation, &values, rows), Some(expected), "scatter_permutation, {rows} rows");
    if rows < 2 {
        return;
    }
    let (first, second) = (rng.random_range(0..rows), rng.random_range(0..rows - 1));
    let second = second + usize::from(second >= first);
    let mut twice = permutation.clone();
    twice[second] = twice[first];
    assert_eq!(scatter(&twice, &values, rows), None, "a position twice, {rows} rows");
    let mut with_null = permutation.clone();
    with_null[first] = NULL_POSITION;
    assert_eq!(scatter(&with_null, &values, rows), None, "a null position, {rows} rows");
    let mut out_of_range = permutation.clone();
    out_of_range[first] = rows as u32;
    assert_eq!(scatter(&out_of_range, &values, rows), None, "a position out of range, {rows} rows");
    let short = &permutation[..rows - 1];
    assert_eq!(scatter(short, &values[..rows - 1], rows), None, "one position too few, {rows} rows");
}

/// A foreign-key join, every probe row matching one build row: the probe
/// side's matched positions are its rows in order, which a backend may use
/// to skip the probe side's gathers. Gathering by them must still give the
/// probe payload row for row, and each probe row's build match must hold
/// its key.
fn check_foreign_key_gathers<B: JoinBackend>(device: &B::Device, rng: &mut StdRng) {
    let tested = open::<B>(device);
    // Up to the sizes where every work unit shape occurs; the transform and
    // match at the largest sizes are checked above.
    for &rows in sizes().iter().filter(|&&rows| rows > 0 && rows <= LARGE_ROWS) {
        let build_keys = keys::<u32>(rng, rows, Keys::DenseUnique);
        let probe_keys: Vec<u32> = (0..rows * 2 + 1).map(|_| build_keys[rng.random_range(0..rows)]).collect();
        let partitioned = Layout::Partitioned(PartitionSpec::for_build_rows(rows, tested.partition_target_rows()));
        for layout in [partitioned, Layout::Sorted(tight_sort(&[&build_keys, &probe_keys]))] {
            let build = transform(&tested, &build_keys, &payload(rng, rows), layout);
            let probe_payload = payload(rng, probe_keys.len());
            let probe = transform(&tested, &probe_keys, &probe_payload, layout);
            let matches = find_matches(&tested, &build, None, &probe, (Space::Transformed, Space::Transformed));
            let positions = tested.download(&matches.probe).unwrap();
            assert_eq!(positions.len(), probe_keys.len(), "{rows} rows, {layout:?}: every probe row matches once");
            let gathered = tested.gather_column(&probe.payloads[0], &matches.probe, false).unwrap();
            let transformed = tested.download_column(&probe.payloads[0]).unwrap();
            let expected = take(transformed.as_ref(), &UInt32Array::from(positions.clone()), None).unwrap();
            assert_eq!(tested.download_column(&gathered).unwrap().as_ref(), expected.as_ref(), "{rows} rows");
            let (build_sorted, probe_sorted) =
                (tested.download(&build.keys).unwrap(), tested.download(&probe.keys).unwrap());
            let build_positions = tested.download(&matches.build).unwrap();
            for (b, p) in build_positions.iter().zip(&positions) {
                assert_eq!(
                    build_sorted[*b as usize], probe_sorted[*p as usize],
                    "{rows} rows, {layout:?}: keys differ"
                );
            }
            // In original probe rows the matched positions are a
            // permutation, which scatters the build positions into probe
            // order (on a device, without checking when its match knows).
            let matches = find_matches(&tested, &build, None, &probe, (Space::Transformed, Space::Original));
            let in_probe_order = tested
                .scatter_permutation(&matches.probe, &matches.build, probe_keys.len())
                .unwrap()
                .expect("every probe row matches once");
            for (row, b) in tested.download(&in_probe_order).unwrap().into_iter().enumerate() {
                assert_eq!(build_sorted[b as usize], probe_keys[row], "{rows} rows, {layout:?}: probe row {row}");
            }
        }
    }
}

/// Uploads from many streams at once, of lengths from under a megabyte to
/// tens of them (whole and partial 16 MiB steps), come back as sent: no
/// pinned memory one upload fills is written again while another stream's
/// transfer still reads it.
fn check_concurrent_uploads<B: JoinBackend>(device: &B::Device, rng: &mut StdRng) {
    const STEP_VALUES: usize = (16 << 20) / size_of::<u32>();
    let lengths: Vec<usize> = (0..12)
        .map(|i| match i % 3 {
            0 => STEP_VALUES * rng.random_range(1..4),
            1 => STEP_VALUES * rng.random_range(0..3) + rng.random_range(1..STEP_VALUES),
            _ => rng.random_range(0..STEP_VALUES / 4),
        })
        .collect();
    std::thread::scope(|scope| {
        for (stream, &len) in lengths.iter().enumerate() {
            scope.spawn(move || {
                let backend = open::<B>(device);
                for round in 0..2u32 {
                    let mark = (stream as u32).wrapping_mul(7919).wrapping_add(round);
                    let values: Vec<u32> = (0..len as u32).map(|i| i.wrapping_mul(2_654_435_761) ^ mark).collect();
                    let back = backend.download(&backend.upload(&values).unwrap()).unwrap();
                    assert!(back == values, "stream {stream}, round {round}: {len} values came back changed");
                }
            });
        }
    });
}

/// A generator seeded afresh for one check, its seed printed so that a
/// failure can be replayed.
fn fresh_rng(check: &str) -> StdRng {
    let seed = seed();
    println!("primitives, {check}: seed {seed} (GPU_JOIN_PRIMITIVE_SEED), up to {} rows", max_rows());
    StdRng::seed_from_u64(seed)
}

/// Runs `$check` with `$backend` the type of the backend under test and
/// `$device` its device. One test per check, so that the largest sizes run
/// side by side, and one can be run alone.
macro_rules! on_test_backend {
    ($backend:ident, $device:ident => $check:expr) => {
        match test_backend() {
            BackendHandle::Cpu => {
                type $backend = CpuBackend;
                let $device = &();
                $check
            }
            BackendHandle::Cuda(device) => {
                type $backend = CudaBackend;
                let $device = &device;
                $check
            }
        }
    };
}

#[test]
fn transform_and_match_32_bit_keys() {
    let mut rng = fresh_rng("transform and match, 32-bit keys");
    on_test_backend!(B, device => check_transform_and_match::<B, u32>(device, &mut rng, "32-bit keys"));
}

#[test]
fn transform_and_match_64_bit_keys() {
    let mut rng = fresh_rng("transform and match, 64-bit keys");
    on_test_backend!(B, device => check_transform_and_match::<B, u64>(device, &mut rng, "64-bit keys"));
}

#[test]
fn gathers_and_flags() {
    let mut rng = fresh_rng("gathers and flags");
    on_test_backend!(B, device => check_gathers_and_flags::<B>(device, &mut rng));
}

#[test]
fn join_filter_comparisons() {
    let mut rng = fresh_rng("join filter comparisons");
    on_test_backend!(B, device => check_compare_rows::<B>(device, &mut rng));
}

#[test]
fn foreign_key_gathers() {
    let mut rng = fresh_rng("foreign-key gathers");
    on_test_backend!(B, device => check_foreign_key_gathers::<B>(device, &mut rng));
}

#[test]
fn concurrent_uploads() {
    let mut rng = fresh_rng("concurrent uploads");
    on_test_backend!(B, device => check_concurrent_uploads::<B>(device, &mut rng));
}
