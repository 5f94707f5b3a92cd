#!/usr/bin/env bash
# Builds the integration tests, the kernel and operator benchmarks and the TPC-H job for a
# GPU machine (which has no Rust toolchain) and packs them, with the files
# they read, into gpu-bundle/ (ignored by git): bundle.tar.xz and run.sh.
# See docs/development.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

messages=$(mktemp)
stage=$(mktemp -d)
trap 'rm -rf "$stage" "$messages"' EXIT

cargo build --profile device --tests --benches --examples --message-format=json-render-diagnostics >"$messages"

# The executables cargo reports for the targets that run on the GPU. Four
# DataFusion binaries pack to more than 64 MiB: with GPU_BUNDLE_TPCH=1 the
# TPC-H job is also packed, stripped, into an archive of its own
# (gpu-bundle/tpch/tpch.tar.xz), to be carried alone or beside the rest,
# with the TPC-DS query files of GPU_BUNDLE_TPCDS_QUERIES (a folder of
# queryN.sql, see docs/benchmarks.md) where that is set, and DuckDB's
# runner (scripts/duckdb-queries.py) with the wheel GPU_BUNDLE_DUCKDB_WHEEL
# names, for the GPU machine's Python, where that is set. The wheel makes
# that archive about 51 MB: carry it alone then.
python3 - "$messages" "$stage/bin" <<'PY'
import json, os, shutil, sys
wanted = {("test", "integration"), ("bench", "kernels"), ("bench", "operator")}
if os.environ.get("GPU_BUNDLE_TPCH"):
    wanted.add(("example", "tpch"))
os.makedirs(sys.argv[2], exist_ok=True)
found = set()
for line in open(sys.argv[1]):
    message = json.loads(line)
    target = message.get("target", {})
    if message.get("reason") != "compiler-artifact" or not message.get("executable"):
        continue
    for kind in target.get("kind", []):
        if (kind, target["name"]) in wanted:
            folder = sys.argv[2] if kind != "example" else sys.argv[2] + "-tpch"
            os.makedirs(folder, exist_ok=True)
            shutil.copy(message["executable"], os.path.join(folder, target["name"]))
            found.add((kind, target["name"]))
missing = wanted - found
if missing:
    sys.exit(f"not built: {sorted(missing)}")
PY

# What the suites read: the project's .slt files and DataFusion's join suites.
cp -r sqllogictests "$stage/sqllogictests"
slt_dir=$(cargo metadata --format-version 1 | python3 -c '
import json, os, sys
packages = json.load(sys.stdin)["packages"]
print(next(os.path.dirname(p["manifest_path"]) for p in packages if p["name"] == "datafusion-sqllogictest"))')
mkdir -p "$stage/datafusion-test-files"
for name in joins.slt join_only.slt join.slt.part join_disable_repartition_joins.slt join_is_not_distinct_from.slt \
    null_aware_anti_join.slt join_limit_pushdown.slt lateral_join.slt sort_merge_join.slt; do
    cp "$slt_dir/test_files/$name" "$stage/datafusion-test-files/"
done

rm -rf gpu-bundle
mkdir -p gpu-bundle
tpch_bin="$stage/bin-tpch"
if [ -d "$tpch_bin" ]; then
    mv "$tpch_bin" "$stage.tpch-bin"
    strip "$stage.tpch-bin/tpch"
    mkdir -p gpu-bundle/tpch "$stage.tpch/bin"
    mv "$stage.tpch-bin/tpch" "$stage.tpch/bin/tpch"
    if [ -n "${GPU_BUNDLE_TPCDS_QUERIES:-}" ]; then
        mkdir -p "$stage.tpch/tpcds-queries"
        cp "$GPU_BUNDLE_TPCDS_QUERIES"/query*.sql "$stage.tpch/tpcds-queries/"
    fi
    cp scripts/duckdb-queries.py "$stage.tpch/"
    if [ -n "${GPU_BUNDLE_DUCKDB_WHEEL:-}" ]; then
        mkdir -p "$stage.tpch/duckdb"
        cp "$GPU_BUNDLE_DUCKDB_WHEEL" "$stage.tpch/duckdb/"
    fi
    tar -C "$stage.tpch" -cf - . | xz -T2 -6 >gpu-bundle/tpch/tpch.tar.xz
    rm -rf "$stage.tpch" "$stage.tpch-bin"
fi
tar -C "$stage" -cf - . | xz -T2 -6 >gpu-bundle/bundle.tar.xz
cp scripts/gpu-run.sh gpu-bundle/run.sh
ls -l gpu-bundle
