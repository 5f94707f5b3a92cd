"""Plots the GPU join alone under the directory join against the
partitioned hash join, per call and process, beside 1.5 times the PCIe
floor (the target).

    python3 scripts/plot_directory_join.py docs/data/operator-directory-join-h100-2026-11-28.csv \
        docs/operator-directory-join-h100.png

The CSV holds the medians the `operator` benchmark prints, one row per
process and workload (see docs/benchmarks.md, "The directory join").
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(source, target):
    rows = list(csv.DictReader(open(source)))
    workloads = ["narrow", "wide"]
    figure, axes = plt.subplots(1, len(workloads), figsize=(15, 5.5), sharey=True)
    for axis, workload in zip(axes, workloads):
        mine = [r for r in rows if r["workload"] == workload]
        labels = [
            f"call {r['call']}, p{r['process']}\n{r['strategy'].split(' ')[0]}\n"
            + ("pinned" if r["tables"] == "pinned" else "as made")
            + ("\n(auto)" if r["call"] == "2" else "")
            for r in mine
        ]
        values = [float(r["join_alone_ms"]) for r in mine]
        colours = ["tab:blue" if r["strategy"].startswith("DIR") else "tab:gray" for r in mine]
        hatches = ["" if r["tables"] == "pinned" else "//" for r in mine]
        bars = axis.bar(range(len(mine)), values, color=colours, hatch=hatches)
        axis.bar_label(bars, labels=[f"{v:.0f}" for v in values], fontsize=8, padding=2)
        floor = float(mine[0]["pcie_floor_ms"])
        axis.axhline(1.5 * floor, color="tab:red", linestyle="--", label=f"1.5 x PCIe floor ({1.5 * floor:.0f} ms)")
        axis.axhline(floor, color="black", linestyle=":", label=f"PCIe floor ({floor:.0f} ms)")
        axis.set_xticks(range(len(mine)), labels, fontsize=7)
        axis.set_title(f"{workload}: GPU join alone, ms (per process)")
        axis.legend(fontsize=8, loc="upper left")
    axes[0].set_ylabel("ms")
    figure.suptitle(
        "Directory join (blue) and partitioned hash join (grey); hatched: tables as made, H100, 2026-11-28",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(target, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
