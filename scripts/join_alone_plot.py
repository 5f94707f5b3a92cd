"""The bar chart shared by the per-process plots of the GPU join alone
(plot_pinned_tables.py, plot_directory_join.py, plot_pinned_in_place.py,
plot_full_runs_and_packed_uploads.py):
one panel per workload, one bar per process, beside the PCIe floor and
1.5 times it (the target).
"""
import csv

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def plot(rows, label, colour, hatch, title, target):
    """Draws `rows` (the CSV's dicts) with each bar's label, colour and
    hatch given by the functions of a row, and saves the figure."""
    workloads = [w for w in ("narrow", "wide") if any(r["workload"] == w for r in rows)]
    figure, axes = plt.subplots(1, len(workloads), figsize=(15, 5.5), sharey=True, squeeze=False)
    axes = axes[0]
    for axis, workload in zip(axes, workloads):
        mine = [r for r in rows if r["workload"] == workload]
        values = [float(r["join_alone_ms"]) for r in mine]
        bars = axis.bar(
            range(len(mine)), values, color=[colour(r) for r in mine], hatch=[hatch(r) for r in mine]
        )
        axis.bar_label(bars, labels=[f"{v:.0f}" for v in values], fontsize=8, padding=2)
        floor = float(mine[0]["pcie_floor_ms"])
        axis.axhline(1.5 * floor, color="tab:red", linestyle="--", label=f"1.5 x PCIe floor ({1.5 * floor:.0f} ms)")
        axis.axhline(floor, color="black", linestyle=":", label=f"PCIe floor ({floor:.0f} ms)")
        axis.set_xticks(range(len(mine)), [label(r) for r in mine], fontsize=7)
        axis.set_title(f"{workload}: GPU join alone, ms (per process)")
        axis.legend(fontsize=8, loc="upper left")
    # Room above the tallest bar, so that the legends hide no bar's label.
    tallest = max(max(float(r["join_alone_ms"]), 1.5 * float(r["pcie_floor_ms"])) for r in rows)
    axes[0].set_ylim(0, 1.3 * tallest)
    axes[0].set_ylabel("ms")
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(target, dpi=110)


def plot_by_code(source, target, colours, title):
    """Draws the CSV `source` with one bar per call and process, coloured
    by the row's code (`colours`, grey for others), hatched where the
    tables were as made."""
    plot(
        list(csv.DictReader(open(source))),
        lambda row: f"{row['call']}.{row['process']}",
        lambda row: colours.get(row["code"], "tab:gray"),
        lambda row: "" if row["tables"] == "pinned" else "//",
        title,
        target,
    )
