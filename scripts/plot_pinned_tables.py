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

from join_alone_plot import plot

COLOURS = {"pinned": "tab:green", "pageable": "tab:gray"}


def label(row):
    return (
        f"call {row['call']}, p{row['process']}\n{'pinned' if row['tables'] == 'pinned' else 'as made'}"
        + ("\n+ copy in\nmatch" if "copied by the match" in row["code"] else "")
    )


def main(source, target):
    plot(
        list(csv.DictReader(open(source))),
        label,
        lambda row: COLOURS[row["tables"]],
        lambda row: "",
        "Tables in pinned memory (green) and as made (grey), H100, 2026-11-28",
        target,
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
