"""Plots the GPU join alone per process on the H200 machines, before and
after a pinned build side's columns went up where they lie whatever
their blocks' addresses (`c60d04b`) and the build side was let go of off
the workers (`9a7209d`), beside 1.5 times the PCIe floor.

    python3 scripts/plot_pinned_in_place.py docs/data/operator-pinned-in-place-h200-2026-11-28.csv \
        docs/operator-pinned-in-place-h200.png

The CSV holds the medians the `operator` benchmark prints, one row per
process and workload (see docs/benchmarks.md, "Where the pinned join's
time goes").
"""
import sys

from join_alone_plot import plot_by_code


if __name__ == "__main__":
    plot_by_code(
        sys.argv[1],
        sys.argv[2],
        {"c60d04b": "tab:blue", "9a7209d": "tab:green"},
        "call.process and code: 2662b90 (grey), c60d04b (blue), 9a7209d (green); hatched: tables as made, H200, 2026-11-28",
    )
