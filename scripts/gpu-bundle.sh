#!/usr/bin/env bash
# Builds the programs a GPU machine (which has no Rust toolchain) runs and
# packs them, with the files they read, into gpu-bundle/ (ignored by git):
# bundle.tar.xz and run.sh. See docs/development.md.
#
# GPU_BUNDLE_PROGRAMS (default "integration kernels operator") names the
# programs: the integration tests, the kernel and operator benchmarks and
# the TPC-H job (tpch). With tpch come the TPC-DS query files of
# GPU_BUNDLE_TPCDS_QUERIES (a folder of queryN.sql, see docs/benchmarks.md)
# where that is set, and DuckDB's runner (scripts/duckdb-queries.py) with
# the wheel GPU_BUNDLE_DUCKDB_WHEEL names, unpacked for the GPU machine's
# Python, where that is set.
#
# The programs share most of their code (DataFusion's), so the archive is
# compressed with a dictionary that spans them all: each program after the
# first then adds little. The integration tests and the TPC-H job with
# DuckDB come to about 52 MB, under the 64 MiB one call carries.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
programs=${GPU_BUNDLE_PROGRAMS:-integration kernels operator}

messages=$(mktemp)
stage=$(mktemp -d)
trap 'rm -rf "$stage" "$messages"' EXIT

cargo build --profile device --tests --benches --examples --message-format=json-render-diagnostics >"$messages"

# The executables cargo reports for the programs asked for.
python3 - "$messages" "$stage/bin" "$programs" <<'PY'
import json, os, shutil, sys
kinds = {"integration": "test", "kernels": "bench", "operator": "bench", "tpch": "example"}
asked = sys.argv[3].split()
unknown = [name for name in asked if name not in kinds]
if unknown:
    sys.exit(f"unknown programs {unknown}: choose among {sorted(kinds)}")
wanted = {(kinds[name], name) for name in asked}
os.makedirs(sys.argv[2], exist_ok=True)
found = set()
for line in open(sys.argv[1]):
    message = json.loads(line)
    target = message.get("target", {})
    if message.get("reason") != "compiler-artifact" or not message.get("executable"):
        continue
    for kind in target.get("kind", []):
        if (kind, target["name"]) in wanted:
            shutil.copy(message["executable"], os.path.join(sys.argv[2], target["name"]))
            found.add((kind, target["name"]))
missing = wanted - found
if missing:
    sys.exit(f"not built: {sorted(missing)}")
PY
strip "$stage"/bin/*

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

if [ -f "$stage/bin/tpch" ]; then
    if [ -n "${GPU_BUNDLE_TPCDS_QUERIES:-}" ]; then
        mkdir -p "$stage/tpcds-queries"
        cp "$GPU_BUNDLE_TPCDS_QUERIES"/query*.sql "$stage/tpcds-queries/"
    fi
    cp scripts/duckdb-queries.py "$stage/"
    if [ -n "${GPU_BUNDLE_DUCKDB_WHEEL:-}" ]; then
        # A wheel of compiled code is a zip of what installing it puts in
        # place: unpacked, it compresses better and needs no pip there.
        python3 -m zipfile -e "$GPU_BUNDLE_DUCKDB_WHEEL" "$stage/site"
    fi
fi

# A dictionary as large as the archive, up to 1 GiB (compressing takes
# about eleven times the dictionary in memory).
size_mib=$(($(du -sm "$stage" | cut -f1) + 1))
dictionary=$((size_mib < 1024 ? size_mib : 1024))
rm -rf gpu-bundle
mkdir -p gpu-bundle
tar -C "$stage" -cf - . | xz -T1 --lzma2=preset=6,dict="${dictionary}MiB" >gpu-bundle/bundle.tar.xz
cp scripts/gpu-run.sh gpu-bundle/run.sh
ls -l gpu-bundle
