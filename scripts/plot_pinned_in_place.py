"""Plots the GPU join alone per process on the H200 machines, before and
after a pinned build side's columns went up where they lie whatever
their blocks' addresses (`c60d04b`), beside 1.5 times the PCIe floor.

    python3 scripts/plot_pinned_in_place.py docs/data/operator-pinned-in-place-h200-2026-11-28.csv \
        docs/operator-pinned-in-place-h200.png

The CSV holds the medians the `operator` benchmark prints, one row per
process and workload (see docs/benchmarks.md, "Where the pinned join's
time goes").
"""
import csv
import sys

from join_alone_plot import plot


def label(row):
    return f"{row['call']}.{row['process']}\n" + ("after" if row["code"] == "c60d04b" else "before")


def main(source, target):
    plot(
        list(csv.DictReader(open(source))),
        label,
        lambda row: "tab:blue" if row["code"] == "c60d04b" else "tab:gray",
        lambda row: "" if row["tables"] == "pinned" else "//",
        "call.process; c60d04b (blue, after) and the code before it (grey); hatched: tables as made, H200, 2026-11-28",
        target,
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
