"""Plots TPC-H from Parquet: the GPU session's time over DataFusion's, per query.

    python3 scripts/plot_tpch_parquet.py docs/data/tpch-parquet-h100-2026-11-24.csv docs/tpch-parquet-h100.png

The CSV holds what `tpch --compare --parquet DIR` prints, one row per query
and run; the plot shows the runs in RUNS: all 22 queries at scale factors
10 and 30, the two sessions taking turns run by run.
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

RUNS = ["G: SF 10, turns", "I: SF 30, turns, each first every other run"]


def main(source, target):
    rows = list(csv.DictReader(open(source)))
    figure, axes = plt.subplots(figsize=(13, 5))
    width = 0.8 / len(RUNS)
    for i, run in enumerate(RUNS):
        mine = sorted((int(r["query"]), float(r["gpu_session_ms"]) / float(r["datafusion_ms"]))
                      for r in rows if r["run"] == run)
        axes.bar([q + (i - (len(RUNS) - 1) / 2) * width for q, _ in mine], [ratio for _, ratio in mine],
                 width, label=run)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(range(1, 23))
    axes.set_xticklabels([f"Q{q}" for q in range(1, 23)])
    axes.set_ylabel("GPU session / DataFusion (time)")
    axes.set_ylim(0.6, 1.3)
    axes.set_title("TPC-H from Parquet on the H100 machine, a session's defaults, sessions taking turns")
    axes.legend()
    figure.tight_layout()
    figure.savefig(target, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:3])
