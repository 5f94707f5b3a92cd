"""Plots the kernel benchmark's sweep of algorithm = auto.

    python3 scripts/plot_sweep.py docs/data/sweep-h100-2026-11-22.csv docs/sweep-h100.png

The CSV holds the table `GPU_JOIN_BENCH_SWEEP=1 cargo bench --bench kernels`
prints: per cell, the median total of each fixed strategy and of auto (ms),
what auto chose, and auto's time over the best fixed strategy's.
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

FIXED = ["PHJ-OM", "PHJ-UM", "SMJ-OM", "SMJ-UM"]


def main(source, target):
    rows = list(csv.DictReader(open(source)))
    figure, (times, ratio) = plt.subplots(2, 1, figsize=(14, 9), sharex=True, height_ratios=[3, 1])
    x = range(len(rows))
    width = 0.16
    for i, name in enumerate(FIXED + ["auto"]):
        best = [min(float(r[f]) for f in FIXED) for r in rows]
        values = [float(r[name]) / b for r, b in zip(rows, best)]
        times.bar([j + (i - 2) * width for j in x], values, width, label=name,
                  color="black" if name == "auto" else None)
    times.set_ylabel("time / best fixed strategy")
    times.set_yscale("log")
    times.axhline(1.1, color="red", linewidth=0.8, linestyle="--", label="best + 10%")
    times.legend(ncol=6, fontsize=8)
    times.set_title("algorithm = auto against every fixed strategy on an H100 "
                    "(R = 2^24, S = 2^25, two 4-byte payloads per side unless noted)")
    ratio.bar(list(x), [float(r["auto_over_best"]) for r in rows], 0.6, color="black")
    ratio.axhline(1.1, color="red", linewidth=0.8, linestyle="--")
    ratio.set_ylim(0.8, 1.2)
    ratio.set_ylabel("auto / best")
    for j, r in enumerate(rows):
        ratio.text(j, 0.82, r["chosen"], rotation=90, ha="center", va="bottom", fontsize=7, color="white")
    ratio.set_xticks(list(x))
    ratio.set_xticklabels([r["cell"] for r in rows], rotation=60, ha="right", fontsize=8)
    figure.tight_layout()
    figure.savefig(target, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
