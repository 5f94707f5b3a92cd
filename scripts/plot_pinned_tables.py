"""Plots the GPU join alone with tables kept in pinned memory against the
same binary on the tables as made, per call and process, beside 1.5 times
the PCIe floor (the target).

    python3 scripts/plot_pinned_tables.py docs/data/operator-pinned-tables-h100-2026-11-28.csv \
        docs/operator-pinned-tables-h100.png

The CSV holds the medians the `operator` benchmark prints, one row per
process and workload (see docs/benchmarks.md, "Tables kept in pinned memory").
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

COLOURS = {"pinned": "tab:green", "pageable": "tab:gray"}


def main(source, target):
    rows = list(csv.DictReader(open(source)))
    workloads = ["narrow", "wide"]
    figure, axes = plt.subplots(1, len(workloads), figsize=(15, 5.5), sharey=True)
    for axis, workload in zip(axes, workloads):
        mine = [r for r in rows if r["workload"] == workload]
        labels = [
            f"call {r['call']}, p{r['process']}\n{'pinned' if r['tables'] == 'pinned' else 'as made'}"
            + ("\n+ copy in\nmatch" if "copied by the match" in r["code"] else "")
            for r in mine
        ]
        values = [float(r["join_alone_ms"]) for r in mine]
        bars = axis.bar(range(len(mine)), values, color=[COLOURS[r["tables"]] for r in mine])
        axis.bar_label(bars, labels=[f"{v:.0f}" for v in values], fontsize=8, padding=2)
        floor = float(mine[0]["pcie_floor_ms"])
        axis.axhline(1.5 * floor, color="tab:red", linestyle="--", label=f"1.5 x PCIe floor ({1.5 * floor:.0f} ms)")
        axis.axhline(floor, color="black", linestyle=":", label=f"PCIe floor ({floor:.0f} ms)")
        axis.set_xticks(range(len(mine)), labels, fontsize=7)
        axis.set_title(f"{workload}: GPU join alone, ms (per process)")
        axis.legend(fontsize=8, loc="upper left")
    axes[0].set_ylabel("ms")
    figure.suptitle("Tables in pinned memory (green) and as made (grey), H100, 2026-11-28", fontsize=10)
    figure.tight_layout()
    figure.savefig(target, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
