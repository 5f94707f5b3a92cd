"""Plots the GPU session's time over DataFusion's, per query, from what the
TPC-H job (`tpch --compare`) prints.

    python3 scripts/plot_query_ratios.py CSV PNG TITLE [RUN ...]

The CSV has a row per query (`query`, `gpu_session_ms`, `datafusion_ms`),
and, where it holds several runs, a `run` column: each RUN named is one
series. A query is a number (shown as Q1, Q2, ...) or a label of its own
(DS95, H21). The plots in docs/:

    python3 scripts/plot_query_ratios.py docs/data/tpch-parquet-h100-2026-11-24.csv docs/tpch-parquet-h100.png \
        "TPC-H from Parquet on the H100 machine, a session's defaults, sessions taking turns" \
        "G: SF 10, turns" "I: SF 30, turns, each first every other run"
    python3 scripts/plot_query_ratios.py docs/data/tpcds-sf10-h100-2026-11-24.csv docs/tpcds-sf10-h100.png \
        "TPC-DS SF 10 in memory on the H100 machine, a session's defaults, sessions taking turns"
    python3 scripts/plot_query_ratios.py docs/data/tpcds-sf10-h100-2026-11-25.csv docs/tpcds-sf10-h100-2026-11-25.png \
        "TPC-DS SF 10 in memory on the H100 machine, a session's defaults, sessions taking turns, code 8e63243"
    python3 scripts/plot_query_ratios.py docs/data/tpcds-sf10-h100-2026-11-26.csv docs/tpcds-sf10-h100-2026-11-26.png \
        "TPC-DS SF 10 in memory on the H100 machine, a session's defaults, sessions taking turns" \
        "before: faaa24d" "after: 40d6974"
    python3 scripts/plot_query_ratios.py docs/data/tpcds-sf10-h100-2026-11-26-c73c8f6.csv docs/tpcds-sf10-ab-h100-2026-11-26.png \
        "TPC-DS SF 10 on the H100: joins whose build side cannot reach min_build_rows, wrapped (8008554) or left as planned (c73c8f6), two rounds" \
        "A/B round 1: before" "A/B round 1: after" "A/B round 2: after" "A/B round 2: before"
    python3 scripts/plot_query_ratios.py docs/data/tpcds-parquet-sf10-h100-2026-11-25.csv docs/tpcds-parquet-sf10-h100.png \
        "TPC-DS SF 10 from Parquet on the H100 machine, a session's defaults, sessions taking turns" \
        "before: 9c90254" "after: 3c23cf0"
    python3 scripts/plot_query_ratios.py docs/data/join-filters-h100-2026-11-25.csv docs/join-filters-h100.png \
        "Queries whose joins have filters, SF 10 from Parquet, H100, a session's defaults" \
        "run 1, filters on the host" "run 1, filters on the backend" \
        "run 2, filters on the host" "run 2, filters on the backend"
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(source, target, title, *runs):
    rows = list(csv.DictReader(open(source)))
    series = [(run, [r for r in rows if r["run"] == run]) for run in runs] or [(None, rows)]
    order = lambda query: (not query.isdigit(), int(query) if query.isdigit() else 0, query)
    queries = sorted({r["query"] for _, mine in series for r in mine}, key=order)
    place = {query: i for i, query in enumerate(queries)}
    figure, axes = plt.subplots(figsize=(13, 5) if len(queries) > 10 else (8, 5))
    width = 0.8 / len(series)
    for i, (run, mine) in enumerate(series):
        ratios = [(place[r["query"]], float(r["gpu_session_ms"]) / float(r["datafusion_ms"])) for r in mine]
        axes.bar([x + (i - (len(series) - 1) / 2) * width for x, _ in ratios], [ratio for _, ratio in ratios],
                 width, label=run)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(range(len(queries)))
    many = len(queries) > 30
    labels = [f"Q{q}" if q.isdigit() else q for q in queries]
    axes.set_xticklabels(labels, rotation=90 if many else 0, fontsize=7 if many else None)
    axes.set_ylabel("GPU session / DataFusion (time)")
    heights = [p.get_height() for p in axes.patches]
    axes.set_ylim(min(0.6, min(heights) - 0.05), max(1.3, max(heights) + 0.05))
    axes.set_title(title)
    if runs:
        axes.legend()
    figure.tight_layout()
    figure.savefig(target, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:])
