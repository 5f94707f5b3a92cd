#!/usr/bin/env bash
# Runs the packed suites on a GPU machine with the CUDA backend forced.
#
#   run.sh LOG_DIR [STEP ...]
#
# Steps (default: all, in this order):
#   tests             every integration test on the CUDA backend
#   primitives-large  primitive differential tests up to 2^27 rows
#   memcheck          compute-sanitizer memcheck on the primitives, the fuzz test and the
#                     aggregations grouped on the device
#   bench             the kernel benchmark (GFTR paper workload)
#   sweep             the kernel benchmark's sweep of algorithm = auto
#   operator          the operator benchmark: GPU session against DataFusion
#   pruned            a star join over Parquet, the probe scan pruned by the build side's keys
#   stress            16 concurrent queries for GPU_JOIN_STRESS_SECONDS (default 180)
#   tpch              TPC-H SF 1 against the official answers and DataFusion
#   tpch-parquet      the same from Parquet files
#   tpch-parquet-10   TPC-H SF 10 from Parquet against DataFusion, the session's defaults
#   tpch-10           TPC-H SF 10 in memory against DataFusion, the session's defaults
#   tpch-parquet-100  TPC-H SF 100 from Parquet against DataFusion and DuckDB, the
#                     session's defaults, each session's time by operator;
#                     TPCH100_QUERIES (comma-separated) spreads the queries over calls,
#                     TPCH100_WARMUPS=0 runs them without a warm-up;
#                     TPCH100_SET (NAME=VALUE, gpu_join options) sets one for the GPU session,
#                     TPCH100_VARIANT one for a second GPU session beside it
#   cluster-10        TPC-H SF 10 from Parquet on clusters of WORKERS (default 2)
#                     workers on this host, against the single-node GPU session
#                     and single-node DataFusion
#   cluster-100       the same at SF 100 under the session's defaults, one pass
#                     without a warm-up; TPCH100_QUERIES as above
#   tpcds             TPC-DS SF 1 against DataFusion, every join the GPU join takes on it
#   tpcds-10          TPC-DS SF 10 against DataFusion, the session's defaults
#   tpcds-parquet     TPC-DS SF 1 from Parquet files, every join the GPU join takes on it
#   tpcds-parquet-10  TPC-DS SF 10 from Parquet files, the session's defaults
#   tpcds-parquet-100 TPC-DS SF 100 from Parquet files (about 35 GB: not beside
#                     TPC-H SF 100's 34 GB on a 64 GiB disk) against DataFusion and
#                     DuckDB, one run after a warm-up (TPCDS100_WARMUPS=0: none);
#                     TPCDS100_QUERIES (comma-separated) spreads the queries over calls
#   filters-10        the queries whose joins have filters (TPC-DS 16, 94, 95
#                     and TPC-H 21) at SF 10 from Parquet, filters evaluated
#                     on the host, then on the backend
# The TPC-DS steps read the query files packed with the TPC-H job
# (GPU_BUNDLE_TPCDS_QUERIES in gpu-bundle.sh). They leave out query 72,
# on which DataFusion alone runs out of this machine's 128 GiB at SF 1,
# and at SF 10 query 21 too, which DataFusion alone does not finish in
# 100 s there (docs/benchmarks.md). TPCDS10_QUERIES (comma-separated)
# runs only those queries in the SF 10 steps, to spread them over calls.
# The Parquet steps write their files under PARQUET_DIR (default: a fresh
# folder of this run), where a later run on the same machine finds them.
# DuckDB comes from the wheel unpacked beside the TPC-H job
# (GPU_BUNDLE_DUCKDB_WHEEL in gpu-bundle.sh), for this machine's python3.
# Each step writes LOG_DIR/STEP.log (and the TPC-H steps with --csv
# LOG_DIR/STEP.csv); LOG_DIR/summary.txt lists exit codes.
# STEP_TIMEOUT (seconds, default 3600) bounds each step.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
logs=${1:?usage: run.sh LOG_DIR [STEP ...]}
shift
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
work=$(mktemp -d)
tar -xJf "$here/bundle.tar.xz" -C "$work"
cd "$work"
[ -d "$work/site" ] && export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"

export GPU_JOIN_TEST_BACKEND=cuda
export DATAFUSION_SQLLOGICTEST_FILES="$work/datafusion-test-files"
export GPU_JOIN_KERNEL_CACHE="$work/kernel-cache"
export RUST_BACKTRACE=1
sanitizer=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")

parquet=${PARQUET_DIR:-$work/parquet}
tpcds10_queries=${TPCDS10_QUERIES:-$(seq -s, 1 20),$(seq -s, 22 71),$(seq -s, 73 99)}

status=0
step() {
    local name=$1
    shift
    echo "== $name: $*" | tee -a "$logs/summary.txt"
    local start=$SECONDS
    timeout "${STEP_TIMEOUT:-3600}" "$@" >"$logs/$name.log" 2>&1
    local code=$?
    echo "== $name: exit $code after $((SECONDS - start)) s" | tee -a "$logs/summary.txt"
    [ "$code" -eq 0 ] || status=1
}

nvidia-smi >"$logs/nvidia-smi.txt" 2>&1
steps=${*:-tests primitives-large memcheck bench sweep operator stress tpch}
for name in $steps; do
    case $name in
    tests) step tests ./bin/integration --test-threads 2 ;;
    primitives-large) step primitives-large env GPU_JOIN_PRIMITIVE_MAX_ROWS=$((1 << 27)) \
        ./bin/integration --test-threads 3 primitives ;;
    memcheck) step memcheck env GPU_JOIN_FUZZ_CASES=150 "$sanitizer" --tool memcheck --error-exitcode 1 \
        ./bin/integration --test-threads 1 primitives fuzz aggregates ;;
    bench) step bench ./bin/kernels --bench ;;
    sweep) step sweep env GPU_JOIN_BENCH_SWEEP=1 ./bin/kernels --bench ;;
    operator) step operator ./bin/operator --bench ;;
    pruned) step pruned env GPU_JOIN_BENCH_ONLY=pruned ./bin/operator --bench ;;
    stress) step stress env GPU_JOIN_STRESS_SECONDS="${GPU_JOIN_STRESS_SECONDS:-180}" \
        ./bin/integration --nocapture reliability::concurrent ;;
    tpch) step tpch ./bin/tpch --sf 1 --validate --compare ;;
    tpch-parquet) step tpch-parquet ./bin/tpch --sf 1 --validate --compare --parquet "$parquet" ;;
    tpch-parquet-10) step tpch-parquet-10 ./bin/tpch --sf 10 --compare --iterations 3 \
        --min-rows 10000000 --min-build-rows 262144 --parquet "$parquet" ;;
    tpch-10) step tpch-10 ./bin/tpch --sf 10 --compare --iterations 3 \
        --min-rows 10000000 --min-build-rows 262144 ;;
    tpch-parquet-100) step tpch-parquet-100 ./bin/tpch --sf 100 --compare --iterations 1 \
        --min-rows 10000000 --min-build-rows 262144 --parquet "$parquet" --queries "${TPCH100_QUERIES:-$(seq -s, 1 22)}" \
        --duckdb "$work/duckdb-queries.py" --breakdown --csv "$logs/tpch-parquet-100.csv" \
        ${TPCH100_WARMUPS:+--warmups "$TPCH100_WARMUPS"} \
        ${TPCH100_SET:+--set "$TPCH100_SET"} ${TPCH100_VARIANT:+--variant "$TPCH100_VARIANT"} ;;
    cluster-10) step cluster-10 ./bin/tpch --sf 10 --parquet "$parquet" --workers "${WORKERS:-2}" --compare \
        --iterations 1 --breakdown --csv "$logs/cluster-10.csv" ;;
    cluster-100) step cluster-100 ./bin/tpch --sf 100 --parquet "$parquet" --workers "${WORKERS:-2}" --compare \
        --warmups 0 --iterations 1 --min-rows 10000000 --min-build-rows 262144 \
        --queries "${TPCH100_QUERIES:-$(seq -s, 1 22)}" --breakdown --csv "$logs/cluster-100.csv" ;;
    tpcds) step tpcds ./bin/tpch --tpcds "$work/tpcds-queries" --sf 1 --compare \
        --queries "$(seq -s, 1 71),$(seq -s, 73 99)" ;;
    tpcds-10) step tpcds-10 ./bin/tpch --tpcds "$work/tpcds-queries" --sf 10 --compare --iterations 3 \
        --min-rows 10000000 --min-build-rows 262144 \
        --queries "$tpcds10_queries" ;;
    tpcds-parquet) step tpcds-parquet ./bin/tpch --tpcds "$work/tpcds-queries" --sf 1 --compare \
        --parquet "$parquet" --queries "$(seq -s, 1 71),$(seq -s, 73 99)" ;;
    tpcds-parquet-10) step tpcds-parquet-10 ./bin/tpch --tpcds "$work/tpcds-queries" --sf 10 --compare \
        --iterations 3 --min-rows 10000000 --min-build-rows 262144 --parquet "$parquet" \
        --queries "$tpcds10_queries" ;;
    tpcds-parquet-100) step tpcds-parquet-100 ./bin/tpch --tpcds "$work/tpcds-queries" --sf 100 --compare \
        --iterations 1 --min-rows 10000000 --min-build-rows 262144 --parquet "$parquet" \
        --queries "${TPCDS100_QUERIES:-$tpcds10_queries}" --duckdb "$work/duckdb-queries.py" \
        ${TPCDS100_WARMUPS:+--warmups "$TPCDS100_WARMUPS"} \
        --csv "$logs/tpcds-parquet-100.csv" ;;
    filters-10)
        for on_backend in false true; do
            step "tpcds-filters-$on_backend" ./bin/tpch --tpcds "$work/tpcds-queries" --sf 10 --compare \
                --iterations 5 --min-rows 10000000 --min-build-rows 262144 --parquet "$parquet" \
                --queries 16,94,95 --explain --set "filter_on_backend=$on_backend"
            step "tpch-filters-$on_backend" ./bin/tpch --sf 10 --compare --iterations 5 --min-rows 10000000 \
                --min-build-rows 262144 --parquet "$parquet" --queries 21 --explain \
                --set "filter_on_backend=$on_backend"
        done ;;
    *) echo "unknown step $name" | tee -a "$logs/summary.txt"; status=1 ;;
    esac
done
exit $status
