"""Plots the operator benchmark: DataFusion, the GPU session and the GPU
join alone, against the PCIe floor, for each version of the code measured.

    python3 scripts/plot_operator.py docs/data/operator-h100-2026-11-21.csv docs/operator-h100.png

The CSV holds the medians the `operator` benchmark prints (one row per
version and workload, all from the same machine kind; see docs/benchmarks.md).
"""
import csv
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

SERIES = [
    ("datafusion_ms", "DataFusion (same run)"),
    ("gpu_session_ms", "GPU session"),
    ("join_ms", "GPU join operator alone"),
    ("floor_ms", "PCIe floor (the workload's bytes each way / 55 GB/s)"),
]


def main(source, target):
    rows = list(csv.DictReader(open(source)))
    # Workload, then the code's name and its commit, on lines of their own.
    # Names wrapped so that neighbouring labels do not run into each other.
    labels = [
        r["workload"] + "\n" + "\n".join(textwrap.wrap(r["code"].split(" (")[0], 14)) + "\n(" + r["code"].split(" (")[1]
        for r in rows
    ]
    # Wide enough that each version's wrapped label keeps to its own slot.
    figure, axis = plt.subplots(figsize=(max(15, 0.9 * len(rows)), 6))
    width = 0.8 / len(SERIES)
    for i, (column, name) in enumerate(SERIES):
        x = [j + (i - (len(SERIES) - 1) / 2) * width for j in range(len(rows))]
        values = [float(r[column]) for r in rows]
        bars = axis.bar(x, values, width, label=name)
        axis.bar_label(bars, labels=[f"{v:.0f}" for v in values], fontsize=7, padding=2)
    axis.set_xticks(range(len(rows)), labels, fontsize=7)
    axis.set_yscale("log")
    axis.set_ylabel("ms, median (log scale)")
    axis.set_title("Operator benchmark, H100: R = 2^27, S = 2^28 rows in host memory, 16 partitions")
    axis.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=4)
    figure.tight_layout()
    figure.savefig(target, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
