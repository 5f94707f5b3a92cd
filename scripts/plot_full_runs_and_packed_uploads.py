"""Plots the GPU join alone per process on the H200 machines of
2026-11-28's later calls: with uploads packed by frame of reference
(`0a61c90`, reverted) and without (`9a7209d`, whose GPU code the revert
keeps), taking turns, then full runs of `9a7209d`'s operator and of
`648cc5a`'s (the same GPU code), beside 1.5 times the PCIe floor.

    python3 scripts/plot_full_runs_and_packed_uploads.py \
        docs/data/operator-full-runs-and-packed-uploads-h200-2026-11-28.csv \
        docs/operator-full-runs-and-packed-uploads-h200.png

The CSV holds the medians the `operator` benchmark prints, one row per
process and workload (see docs/benchmarks.md, "Uploads packed by frame
of reference", "Every target in one run" and "Full runs of
`648cc5a`'s operator").
"""
import sys

from join_alone_plot import plot_by_code


if __name__ == "__main__":
    plot_by_code(
        sys.argv[1],
        sys.argv[2],
        {"9a7209d": "tab:green", "0a61c90": "tab:orange", "648cc5a": "tab:blue"},
        "call.process and code: 9a7209d, not packed (green), 0a61c90, packed uploads (orange), 648cc5a, 9a7209d's GPU code (blue);"
        " hatched: tables as made; call 2 GPU side only, the others full runs; H200, 2026-11-28",
    )
