"""Draws the plots of docs/benchmarks.md from the CSV files in docs/data.

    python3 scripts/plot.py PLOT [CSV [PNG]]

PLOT is one of:

    kernels   docs/data/kernels-h200.csv      -> docs/kernels-h200.png
    operator  docs/data/operator-h200.csv     -> docs/operator-h200.png
    tpch      docs/data/tpch-sf10-h200.csv    -> docs/tpch-sf10-h200.png
    tpcds     docs/data/tpcds-sf10-h100.csv   -> docs/tpcds-sf10-h100.png
    engines   docs/data/tpch-parquet-sf100-h100.csv -> docs/tpch-sf100-h100.png
    tpcds100  docs/data/tpcds-parquet-sf100-h200.csv -> docs/tpcds-sf100-h200.png
    all       every plot above, from its default files

CSV and PNG replace the default files, for a new measurement of the same
workload. The machine and the commit in each title come from the CSV's
`machine` and `code` columns. Needs matplotlib.
"""
import csv
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

DOCS = Path(__file__).resolve().parent.parent / "docs"

DEFAULTS = {
    "kernels": ("data/kernels-h200.csv", "kernels-h200.png"),
    "operator": ("data/operator-h200.csv", "operator-h200.png"),
    "tpch": ("data/tpch-sf10-h200.csv", "tpch-sf10-h200.png"),
    "tpcds": ("data/tpcds-sf10-h100.csv", "tpcds-sf10-h100.png"),
    "engines": ("data/tpch-parquet-sf100-h100.csv", "tpch-sf100-h100.png"),
    "tpcds100": ("data/tpcds-parquet-sf100-h200.csv", "tpcds-sf100-h200.png"),
}


def read(source):
    with open(source, newline="") as f:
        return list(csv.DictReader(f))


def one(rows, column):
    """The one value `column` takes in `rows`, or the values joined."""
    return ", ".join(sorted({row[column] for row in rows}))


def kernels(rows, target):
    """One bar per workload and algorithm, split into its three phases
    where the run recorded them, beside the GFTR artifact's total."""
    phases = [("transform_ms", "transform"), ("match_ms", "match"), ("materialize_ms", "materialize")]
    colours = ["tab:blue", "tab:orange", "tab:green"]
    figure, axis = plt.subplots(figsize=(12, 5.5))
    for i, row in enumerate(rows):
        total = float(row["total_ms"])
        if row["transform_ms"]:
            bottom = 0.0
            for (column, name), colour in zip(phases, colours):
                value = float(row[column])
                axis.bar(i - 0.2, value, 0.4, bottom=bottom, color=colour, label=f"this crate: {name}" if i == 0 else None)
                bottom += value
        else:
            axis.bar(i - 0.2, total, 0.4, color="white", edgecolor="tab:blue", hatch="//",
                     label="this crate: total (phases not recorded)" if not any(r["transform_ms"] == "" for r in rows[:i]) else None)
        axis.text(i - 0.2, total + 0.8, f"{total:.1f}", ha="center", fontsize=8)
        if row["gftr_artifact_ms"]:
            artifact = float(row["gftr_artifact_ms"])
            axis.bar(i + 0.2, artifact, 0.4, color="grey",
                     label="GFTR artifact: total" if not any(r["gftr_artifact_ms"] for r in rows[:i]) else None)
            axis.text(i + 0.2, artifact + 0.8, f"{artifact:.1f}", ha="center", fontsize=8, color="dimgrey")
    axis.set_xticks(range(len(rows)), [f"{r['workload']}\n{r['algorithm']}" for r in rows], fontsize=9)
    axis.set_ylabel("ms, median (inputs and outputs in device memory)")
    axis.set_ylim(0, 1.15 * max(max(float(r["total_ms"]), float(r["gftr_artifact_ms"] or 0)) for r in rows))
    axis.set_title(
        f"Kernels, R = 2^27, S = 2^28 rows; {one(rows, 'machine')}, code {one(rows, 'code')}; "
        "the GFTR artifact is a reference measurement",
        fontsize=10,
    )
    axis.legend(fontsize=8, loc="upper left")
    figure.tight_layout()
    figure.savefig(target, dpi=110)


def operator(rows, target):
    """The GPU join alone per process (bars), each process's transfer floor
    (black ticks), the PCIe floor and 1.5 times it; in each bar the
    session's speed-up over DataFusion in the same process."""
    workloads = [w for w in ("narrow", "wide") if any(r["workload"] == w for r in rows)]
    widths = [sum(r["workload"] == w for r in rows) for w in workloads]
    figure, axes = plt.subplots(1, len(workloads), figsize=(13, 5.5), sharey=True, squeeze=False,
                                gridspec_kw={"width_ratios": widths})
    tallest = max(max(float(r["join_alone_ms"]), float(r["transfer_floor_ms"]), 1.5 * float(r["pcie_floor_ms"]))
                  for r in rows)
    for axis, workload in zip(axes[0], workloads):
        mine = [r for r in rows if r["workload"] == workload]
        x = range(len(mine))
        values = [float(r["join_alone_ms"]) for r in mine]
        codes = sorted({r["code"] for r in rows})
        colour = {code: c for code, c in zip(codes, ["tab:gray", "tab:blue", "tab:green", "tab:purple"])}
        axis.bar(x, values, 0.6, color=[colour[r["code"]] for r in mine])
        for code in codes:
            axis.bar([0], [0], color=colour[code], label=f"code {code}")
        for i, (value, row) in enumerate(zip(values, mine)):
            axis.text(i, 4, f"{value:.0f} ms\n\n{float(row['speed_up']):.1f}x", ha="center", va="bottom", fontsize=8,
                      color="white", fontweight="bold")
        axis.scatter(x, [float(r["transfer_floor_ms"]) for r in mine], marker="_", s=500, color="black", zorder=3,
                     label="transfer floor of the process")
        floor = float(mine[0]["pcie_floor_ms"])
        axis.axhline(1.5 * floor, color="tab:red", linestyle="--", label=f"1.5 x PCIe floor ({1.5 * floor:.0f} ms)")
        axis.axhline(floor, color="black", linestyle=":", label=f"PCIe floor ({floor:.0f} ms)")
        axis.set_xticks(list(x), [f"{r['call']}.{r['process']}\n{r['code']}" for r in mine], fontsize=8)
        axis.set_xlim(-0.6, len(mine) - 0.4)
        axis.set_title(f"{workload}: the GPU join alone, one bar per process")
        axis.legend(fontsize=8, loc="upper left")
    axes[0][0].set_ylim(0, 1.35 * tallest)
    axes[0][0].set_ylabel("ms, median")
    figure.suptitle(
        f"Operator benchmark, {one(rows, 'machine')}, tables {one(rows, 'tables')}, one colour per code "
        f"({one(rows, 'code')}). In each bar: the join alone, and the session's speed-up over DataFusion",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(target, dpi=110)


def queries(rows, target, workload, placed, labels):
    """The GPU session's time over DataFusion's, per query, coloured by
    whether `placed` says a join of the query is on the GPU join; `labels`
    name the two colours."""
    order = sorted(rows, key=lambda r: int(r["query"]))
    ratios = [float(r["gpu_session_ms"]) / float(r["datafusion_ms"]) for r in order]
    on_gpu = [placed(r) for r in order]
    figure, axis = plt.subplots(figsize=(14 if len(order) > 30 else 9, 5))
    axis.bar(range(len(order)), ratios, 0.7, color=["tab:blue" if g else "tab:gray" for g in on_gpu])
    axis.axhline(1.0, color="black", linewidth=0.8)
    many = len(order) > 30
    axis.set_xticks(range(len(order)), [f"Q{int(r['query'])}" for r in order], rotation=90 if many else 0,
                    fontsize=7 if many else 9)
    axis.set_xlim(-0.7, len(order) - 0.3)
    axis.set_ylim(0, max(1.3, max(ratios) + 0.1))
    axis.set_ylabel("GPU session / DataFusion (time)")
    gpu = sum(float(r["gpu_session_ms"]) for r in order) / 1000
    datafusion = sum(float(r["datafusion_ms"]) for r in order) / 1000
    geometric = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    axis.set_title(
        f"{workload}, {one(rows, 'machine')}, code {one(rows, 'code')}\n{len(order)} queries: "
        f"{gpu:.2f} s against DataFusion's {datafusion:.2f} s, geometric mean of the ratios {geometric:.2f}",
        fontsize=10,
    )
    axis.bar([0], [0], color="tab:blue", label=labels[0])
    axis.bar([0], [0], color="tab:gray", label=labels[1])
    axis.legend(fontsize=8, loc="upper left")
    figure.tight_layout()
    figure.savefig(target, dpi=110)


def tpch(rows, target):
    queries(
        rows,
        target,
        "TPC-H SF 10 in memory, a session's defaults",
        lambda row: bool(row["gpu_join_algorithms"].strip()),
        ("a join planned on the GPU join", "no join planned on it: DataFusion's plan"),
    )


def tpcds(rows, target, workload="TPC-DS SF 10 in memory, a session's defaults"):
    queries(
        rows,
        target,
        workload,
        lambda row: int(row["joins_on_gpu_join"]) > 0,
        ("a join planned on the GPU join", "no join planned on it: DataFusion's plan"),
    )


def tpcds100(rows, target):
    tpcds(rows, target, "TPC-DS SF 100 from Parquet, a session's defaults, one run without a warm-up")


def seconds_per_query(rows, target, columns, workload):
    """Seconds per query, one bar per `columns` entry (CSV column, name,
    colour); an empty cell is a query that engine did not run, left out of
    its total."""
    figure, axis = plt.subplots(figsize=(14, 5))
    width = 0.8 / len(columns)
    for k, (column, name, colour) in enumerate(columns):
        seconds = [float(row[column]) / 1000 if row[column] else 0.0 for row in rows]
        ran = sum(1 for row in rows if row[column])
        total = f"{sum(seconds):.1f} s in all" if ran == len(rows) else f"{sum(seconds):.1f} s over its {ran} queries"
        offset = (k - (len(columns) - 1) / 2) * width
        axis.bar([i + offset for i in range(len(rows))], seconds, width, color=colour, label=f"{name}: {total}")
    axis.set_xticks(range(len(rows)), [row["query"] for row in rows], fontsize=9)
    axis.set_xlim(-0.6, len(rows) - 0.4)
    axis.set_ylabel("seconds")
    axis.set_title(f"{workload}, {one(rows, 'machine')}, code {one(rows, 'code')}", fontsize=10)
    axis.legend(fontsize=9, loc="upper left")
    figure.tight_layout()
    figure.savefig(target, dpi=110)


def engines(rows, target):
    """The three engines the `tpch` job's `--duckdb` runs side by side,
    from its `--csv` file."""
    columns = [("gpu_session_ms", "GPU session", "tab:blue"), ("datafusion_ms", "DataFusion", "tab:gray"),
               ("duckdb_ms", "DuckDB", "tab:orange")]
    seconds_per_query(rows, target, columns, "TPC-H SF 100 from Parquet, a session's defaults")


PLOTS = {
    "kernels": kernels,
    "operator": operator,
    "tpch": tpch,
    "tpcds": tpcds,
    "engines": engines,
    "tpcds100": tpcds100,
}


def main(arguments):
    if not arguments or arguments[0] not in [*PLOTS, "all"] or (arguments[0] == "all" and len(arguments) > 1):
        sys.exit(__doc__)
    names = list(PLOTS) if arguments[0] == "all" else [arguments[0]]
    for name in names:
        source, target = (DOCS / path for path in DEFAULTS[name])
        if len(arguments) > 1:
            source = Path(arguments[1])
        if len(arguments) > 2:
            target = Path(arguments[2])
        PLOTS[name](read(source), target)
        print(f"{name}: {source} -> {target}")


if __name__ == "__main__":
    main(sys.argv[1:])
