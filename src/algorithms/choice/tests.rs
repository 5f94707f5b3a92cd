use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::{JoinType, NullEquality};
use datafusion::physical_expr::expressions::Column;

use super::*;
use crate::algorithms::OutputColumn;
use crate::backend::cpu::CpuBackend;
use crate::backend::{DeviceCounters, JoinBackend};
use crate::config::ProbeOrderChoice;

/// Costs of the order an H100 shows: radix passes and clustered gathers
/// cheap per byte, gathers by row id ten to a hundred times dearer per
/// value, a step through a run of equal keys in a hash table a
/// shared-memory access.
fn profile() -> CostProfile {
    CostProfile {
        partition_row_ns: 0.005,
        partition_byte_ns: 0.0025,
        sort_row_ns: 0.005,
        sort_byte_ns: 0.0025,
        hash_row_ns: 0.01,
        hash_step_ns: 0.002,
        merge_row_ns: 0.005,
        merge_pair_ns: 0.002,
        directory_row_ns: 0.004,
        clustered_byte_ns: 0.0008,
        random_value_ns: [0.01, 0.03, 0.06],
    }
}

fn shape(build_rows: usize, probe_rows: usize, payloads: usize, keys: KeyEstimates) -> JoinShape {
    JoinShape {
        build_rows,
        probe_rows,
        key_bytes: 4,
        partition_passes: 2,
        sort_passes: 4,
        build_payloads: vec![4; payloads],
        probe_payloads: vec![4; payloads],
        row_ids_anyway: (false, false),
        keys,
    }
}

fn definition(algorithm: AlgorithmChoice, materialization: MaterializationChoice) -> JoinDefinition {
    let schema =
        Arc::new(Schema::new(vec![Field::new("p", DataType::Int32, false), Field::new("q", DataType::Int32, false)]));
    JoinDefinition {
        join_type: JoinType::Inner,
        build_keys: vec![Arc::new(Column::new("k", 0))],
        probe_keys: vec![Arc::new(Column::new("k", 0))],
        null_equality: NullEquality::NullEqualsNothing,
        null_aware: false,
        filter: None,
        pair_filter: None,
        output_schema: schema,
        output_columns: vec![OutputColumn::Build(1), OutputColumn::Probe(1)],
        probe_order_required: false,
        keep_probe_order: ProbeOrderChoice::Auto,
        algorithm,
        materialization,
        probe_device_gather_ratio: 0.25,
        planned: PlannedSizes::default(),
        key_order: None,
    }
}

#[test]
fn a_wide_foreign_key_join_gathers_from_partitioned_relations() {
    let choice = weigh(&profile(), &shape(1 << 27, 1 << 28, 2, KeyEstimates::FOREIGN_KEY), &every_strategy());
    assert_eq!(choice.map(|c| c.strategy.label()).as_deref(), Some("PHJ-OM"));
}

#[test]
fn long_runs_of_equal_build_keys_choose_the_sort_merge_join() {
    let runs = KeyEstimates { match_ratio: 1.0, matches_per_match: 16_777.0 };
    let choice = weigh(&profile(), &shape(1 << 24, 1 << 12, 1, runs), &every_strategy());
    assert_eq!(choice.map(|c| c.strategy.algorithm), Some(Algorithm::SortMerge));
}

#[test]
fn few_matches_gather_by_row_id() {
    let few = KeyEstimates { match_ratio: 1.0 / 16.0, ..KeyEstimates::FOREIGN_KEY };
    let choice = weigh(&profile(), &shape(1 << 27, 1 << 28, 2, few), &every_strategy());
    let strategy = choice.map(|c| c.strategy);
    assert_eq!(strategy.map(|s| (s.algorithm, s.build_space)), Some((Algorithm::PartitionedHash, Space::Original)));
}

#[test]
fn the_reason_names_the_estimates_and_the_shape() {
    let choice = weigh(&profile(), &shape(1000, 2000, 1, KeyEstimates::FOREIGN_KEY), &every_strategy());
    let reason = choice.map(|c| c.reason).unwrap_or_default();
    assert!(reason.starts_with("estimated "), "{reason}");
    for part in ["next ", "1000 build rows", "2000 probe rows", "1+1 payload columns", "match ratio 1.00"] {
        assert!(reason.contains(part), "{part} missing from {reason}");
    }
}

#[test]
fn settings_that_leave_one_candidate_decide_without_observing() -> Result<()> {
    let fixed = definition(AlgorithmChoice::SortMerge, MaterializationChoice::Untransformed);
    let unobserved = || datafusion::common::internal_err!("the shape was observed");
    let choice = choose(Some(Ok(profile())), Space::Transformed, &fixed, Some(1 << 10), unobserved)?;
    assert_eq!(choice.strategy.label(), "SMJ-UM");
    assert_eq!(planned(Space::Transformed, &fixed, true), Some(choice.strategy));
    Ok(())
}

#[test]
fn without_a_profile_auto_keeps_the_fixed_rule() -> Result<()> {
    let auto = definition(AlgorithmChoice::Auto, MaterializationChoice::Auto);
    let unobserved = || datafusion::common::internal_err!("the shape was observed");
    let choice = choose(None, Space::Original, &auto, None, unobserved)?;
    assert_eq!(choice.strategy.label(), "PHJ-UM");
    let failed = choose(Some(Err("device full".into())), Space::Transformed, &auto, None, unobserved)?;
    assert_eq!((failed.strategy.label().as_str(), failed.reason.as_str()), ("PHJ-OM", "fixed rule: device full"));
    let dense = choose(None, Space::Transformed, &auto, Some(1 << 10), unobserved)?;
    assert_eq!((dense.strategy.label().as_str(), dense.reason.as_str()), ("DIR-OM/UM", "fixed rule; 1024 key codes"));
    // Whether a directory join runs is known once the build side's keys are.
    assert_eq!(planned(Space::Transformed, &auto, true), None);
    assert_eq!(planned(Space::Transformed, &auto, false), None);
    let hash = definition(AlgorithmChoice::Hash, MaterializationChoice::Auto);
    assert_eq!(planned(Space::Transformed, &hash, false).map(|s| s.label()).as_deref(), Some("PHJ-OM"));
    Ok(())
}

#[test]
fn a_directory_join_needs_dense_keys() -> Result<()> {
    assert_eq!(directory_codes(Some(1 << 20), 1 << 18), Some(1 << 20));
    assert_eq!(directory_codes(Some(1 << 21), 1 << 18), None);
    assert_eq!(directory_codes(None, 1 << 18), None);
    let auto = definition(AlgorithmChoice::Auto, MaterializationChoice::Auto);
    let labels = |dense| candidates(&auto, dense).iter().map(|s| s.label()).collect::<Vec<_>>();
    // Dense keys leave the directory join alone, its build side either way.
    assert_eq!(labels(true), ["DIR-OM/UM", "DIR-UM"]);
    assert!(!labels(false).iter().any(|l| l.starts_with("DIR")));
    let hash = definition(AlgorithmChoice::Hash, MaterializationChoice::Auto);
    assert!(candidates(&hash, true).iter().all(|s| s.algorithm == Algorithm::PartitionedHash));
    // Set by the session: a directory join where the keys are dense, the
    // partitioned hash join, and why, where they are not.
    let direct = definition(AlgorithmChoice::Direct, MaterializationChoice::Untransformed);
    let unobserved = || datafusion::common::internal_err!("the shape was observed");
    let dense = choose(Some(Ok(profile())), Space::Transformed, &direct, Some(1 << 10), unobserved)?;
    assert_eq!(dense.strategy.label(), "DIR-UM");
    let sparse = choose(Some(Ok(profile())), Space::Transformed, &direct, None, unobserved)?;
    assert_eq!(sparse.strategy.label(), "PHJ-UM");
    assert!(sparse.reason.ends_with("too sparse for a directory join"), "{}", sparse.reason);
    Ok(())
}

/// A directory join transforms its build side only, and gathers that side
/// anywhere in it: from where it lies in the sorted relation, or by row id
/// after reading the row id.
#[test]
fn a_directory_join_leaves_its_probe_side_and_gathers_its_build_side_anywhere() {
    let shape = shape(1 << 27, 1 << 28, 1, KeyEstimates::FOREIGN_KEY);
    let strategy = |algorithm, build_space| Strategy { algorithm, build_space, probe_space: Space::Original };
    let direct = estimate(&profile(), &shape, strategy(Algorithm::Direct, Space::Transformed));
    let hash = estimate(&profile(), &shape, strategy(Algorithm::PartitionedHash, Space::Transformed));
    assert!(direct.transform < hash.transform, "{direct:?} against {hash:?}");
    let by_row_id = estimate(&profile(), &shape, strategy(Algorithm::Direct, Space::Original));
    assert!(direct.materialize < by_row_id.materialize, "{direct:?} against {by_row_id:?}");
    let candidates = [strategy(Algorithm::Direct, Space::Original), strategy(Algorithm::Direct, Space::Transformed)];
    let choice = weigh(&profile(), &shape, &candidates);
    assert_eq!(choice.map(|c| c.strategy.label()).as_deref(), Some("DIR-OM/UM"));
}

#[test]
fn kept_probe_order_leaves_only_row_id_gathers_on_the_probe_side() {
    let mut ordered = definition(AlgorithmChoice::Auto, MaterializationChoice::Auto);
    ordered.probe_order_required = true;
    for (dense, count) in [(false, 4), (true, 2)] {
        assert!(candidates(&ordered, dense).iter().all(|s| s.probe_space == Space::Original));
        assert_eq!(candidates(&ordered, dense).len(), count);
    }
}

#[test]
fn a_profile_survives_its_text_and_belongs_to_its_device() {
    let text = profile().to_text("GPU A, kernels 1");
    assert_eq!(CostProfile::from_text(&text, "GPU A, kernels 1"), Some(profile()));
    assert_eq!(CostProfile::from_text(&text, "GPU B, kernels 1"), None);
    let truncated: String = text.lines().take(5).map(|l| format!("{l}\n")).collect();
    assert_eq!(CostProfile::from_text(&truncated, "GPU A, kernels 1"), None);
}

#[test]
fn gathers_by_row_id_cost_more_from_larger_sources() {
    let p = profile();
    assert_eq!(p.random_value_ns(1.0), 0.01);
    assert_eq!(p.random_value_ns(1e12), 0.06);
    let mid = p.random_value_ns(16.0 * (1 << 20) as f64);
    assert!(0.01 < mid && mid < 0.03, "{mid}");
}

#[test]
fn the_profile_measures_on_any_backend() -> Result<()> {
    let cpu = CpuBackend::open(&(), Arc::new(DeviceCounters::default()))?;
    let measured = measure(&cpu, 1 << 12)?;
    let text = measured.to_text("cpu");
    assert_eq!(CostProfile::from_text(&text, "cpu"), Some(measured));
    assert!(measured.random_value_ns.iter().all(|v| *v > 0.0), "{measured:?}");
    Ok(())
}
