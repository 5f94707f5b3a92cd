"""Plots, per query, each process's ratio of two sessions' times after
planning, one marker per process, coloured by which sessions it compared:
the GPU session against DataFusion, and two identical sessions against each
other, whose spread is what a ratio can show at all.

    python3 scripts/plot_noise_floor.py CSV PNG TITLE ITERATIONS

The CSV has a row per process and query (`process`, `command`,
`sessions`, `query`, `ratio_after_planning`); only the rows whose command
ran `--iterations ITERATIONS` are drawn. The plot in docs/:

    python3 scripts/plot_noise_floor.py docs/data/tpcds-sf10-h100-2026-11-27-sessions-against-themselves.csv \
        docs/tpcds-sf10-noise-floor-h100.png \
        "TPC-DS SF 10 on the H100 machine: the GPU session against DataFusion, and sessions against themselves" 5
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

STYLE = {
    "GPU session / DataFusion": dict(color="tab:green", marker="o", zorder=3),
    "DataFusion / DataFusion": dict(color="tab:gray", marker="_", zorder=2),
    "GPU session / GPU session": dict(color="tab:blue", marker="_", zorder=2),
}


def main(source, target, title, iterations):
    rows = [r for r in csv.DictReader(open(source)) if f"--iterations {iterations} " in r["command"]]
    queries = sorted({r["query"] for r in rows}, key=int)
    place = {query: i for i, query in enumerate(queries)}
    figure, axes = plt.subplots(figsize=(13, 5))
    for sessions, style in STYLE.items():
        mine = [r for r in rows if r["sessions"] == sessions]
        if not mine:
            continue
        processes = len({r["process"] for r in mine})
        axes.scatter([place[r["query"]] for r in mine], [float(r["ratio_after_planning"]) for r in mine], s=22,
                     label=f"{sessions} ({processes} processes)", **style)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(range(len(queries)))
    axes.set_xticklabels([f"Q{int(q)}" for q in queries], rotation=90, fontsize=7)
    axes.set_ylabel("time after planning, first session / second")
    axes.set_title(title, fontsize=10)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(target, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:])
