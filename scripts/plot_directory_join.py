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

from join_alone_plot import plot


def label(row):
    return (
        f"call {row['call']}, p{row['process']}\n{row['strategy'].split(' ')[0]}\n"
        + ("pinned" if row["tables"] == "pinned" else "as made")
        + ("" if "algorithm =" in row["strategy"] else "\n(auto)")
    )


def main(source, target):
    plot(
        list(csv.DictReader(open(source))),
        label,
        lambda row: "tab:blue" if row["strategy"].startswith("DIR") else "tab:gray",
        lambda row: "" if row["tables"] == "pinned" else "//",
        "Directory join (blue) and partitioned hash join (grey); hatched: tables as made, H100, 2026-11-28",
        target,
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
