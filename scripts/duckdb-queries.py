#!/usr/bin/env python3
"""DuckDB on the Parquet files the `tpch` job writes, for its `--duckdb` column.

    python3 scripts/duckdb-queries.py FOLDER

FOLDER holds one folder of `part-NNN.parquet` files per table, as the job's
`--parquet` writes them; each becomes a view of the same name, so that
DuckDB reads the files DataFusion reads, on the same host. The job starts
this script once and sends it one JSON line per query on standard input:

    {"statements": ["select ...", ...], "warmups": 1, "iterations": 3}

It runs the statements `warmups` times (once where not given) untimed and
then `iterations` times, and
answers one JSON line: the median time in milliseconds of a run (all its
statements), and the rows of the statements that return rows, or the
error DuckDB gave. DuckDB runs the statements as the job gives them, the
TPC-H (or TPC-DS) queries as DataFusion runs them, with no rewriting.

DuckDB's memory is capped at DUCKDB_MEMORY_LIMIT (a DuckDB size such as
`48GB`; by default two fifths of the host's memory). DuckDB's own default,
four fifths, leaves too little beside the job's two sessions, whose process
keeps the memory of its last query when DuckDB's turn comes: with it,
TPC-H SF 100 stalled on a 128 GiB host with no swap.

DuckDB comes from its PyPI wheel (`pip install duckdb`); on a machine
without network, install the wheel carried there (`pip install --no-index
--target DIR duckdb-*.whl` and `PYTHONPATH=DIR`).
"""

import json
import os
import sys
import time

import duckdb


def views(connection, folder):
    for table in sorted(os.listdir(folder)):
        files = os.path.join(folder, table)
        if not os.path.isdir(files) or table.endswith(".writing"):
            continue
        if not any(name.endswith(".parquet") for name in os.listdir(files)):
            continue
        pattern = os.path.join(files, "*.parquet").replace("'", "''")
        connection.execute(f"create or replace view {table} as select * from read_parquet('{pattern}')")


def memory_limit():
    configured = os.environ.get("DUCKDB_MEMORY_LIMIT")
    if configured:
        return configured
    host_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return f"{host_bytes * 2 // 5 // 2**30}GiB"


def returns_rows(statement):
    return statement.lstrip().lower().startswith(("select", "with", "("))


def run(connection, statements):
    """The rows of every statement that returns rows, counted together, as
    the job counts its sessions' (TPC-DS files such as query14.sql hold two
    queries)."""
    rows = 0
    for statement in statements:
        result = connection.execute(statement)
        if returns_rows(statement):
            rows += len(result.fetchall())
    return rows


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.exit("usage: duckdb-queries.py FOLDER (the tables' folder that the tpch job's --parquet wrote)")
    connection = duckdb.connect(config={"memory_limit": memory_limit()})
    views(connection, sys.argv[1])
    print(json.dumps({"ready": duckdb.__version__}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            for _ in range(request.get("warmups", 1)):
                rows = run(connection, request["statements"])
            times = []
            for _ in range(max(1, request.get("iterations", 1))):
                start = time.perf_counter()
                rows = run(connection, request["statements"])
                times.append((time.perf_counter() - start) * 1e3)
            # The upper median, as the job takes its own.
            answer = {"ms": sorted(times)[len(times) // 2], "rows": rows}
        except duckdb.Error as error:
            answer = {"error": str(error).splitlines()[0]}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
