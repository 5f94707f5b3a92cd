"""Plots the kernel benchmark against the GFTR paper's artifact.

    python3 scripts/plot_kernels.py docs/data/kernels-h100-2026-11-21.csv docs/kernels-h100.png
    python3 scripts/plot_kernels.py docs/data/kernels-smj-h100-2026-11-22.csv docs/kernels-smj-h100.png

The CSV holds the table the `kernels` benchmark prints. The artifact's times
below were measured on the same kind of H100 machine on 2026-11-21, same
workloads, sum of the three phases, median of 3 (see docs/benchmarks.md).
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# GFTR artifact on the H100 (transform + match + materialize, ms).
ARTIFACT = {
    ("narrow", "PHJ-OM"): 18.9,
    ("narrow", "PHJ-UM"): 21.5,
    ("wide", "PHJ-OM"): 31.9,
    ("wide", "PHJ-UM"): 56.1,
    ("wide, match ratio 1/8", "PHJ-OM"): 19.7,
    ("wide, match ratio 1/8", "PHJ-UM"): 18.1,
    ("wide, zipf 1.0, R = S rows", "PHJ-OM"): 17.8,
    ("wide, zipf 1.0, R = S rows", "PHJ-UM"): 23.6,
    ("narrow, 8-byte keys and payloads", "PHJ-OM"): 29.5,
    ("narrow, 8-byte keys and payloads", "PHJ-UM"): 34.9,
    ("wide, 8-byte keys and payloads", "PHJ-OM"): 53.3,
    ("wide, 8-byte keys and payloads", "PHJ-UM"): 71.5,
    ("narrow", "SMJ-OM"): 24.3,
    ("narrow", "SMJ-UM"): 24.3,
    ("wide", "SMJ-OM"): 42.1,
    ("wide", "SMJ-UM"): 58.7,
}


def main(source, target):
    rows = list(csv.DictReader(open(source)))
    labels = [f"{r['workload']}\n{r['algorithm']}" for r in rows]
    phases = [("transform_ms", "transform"), ("match_ms", "match"), ("materialize_ms", "materialize")]
    figure, axis = plt.subplots(figsize=(13, 6))
    x = range(len(rows))
    bottom = [0.0] * len(rows)
    for column, name in phases:
        values = [float(r[column]) for r in rows]
        axis.bar([i - 0.2 for i in x], values, 0.4, bottom=bottom, label=f"this crate: {name}")
        bottom = [b + v for b, v in zip(bottom, values)]
    artifact = [ARTIFACT.get((r["workload"], r["algorithm"]), 0.0) for r in rows]
    axis.bar([i + 0.2 for i in x], artifact, 0.4, color="grey", label="GFTR artifact (total)")
    axis.set_xticks(list(x))
    axis.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
    axis.set_ylabel("ms (inputs and outputs in device memory)")
    algorithms = sorted({r["algorithm"][:3] for r in rows})
    names = {"PHJ": "Partitioned hash join", "SMJ": "sort-merge join"}
    joined = " and ".join(names.get(a, a) for a in algorithms)
    axis.set_title(f"{joined[0].upper()}{joined[1:]} on an H100: R = 2^27, S = 2^28 rows unless noted")
    axis.legend()
    figure.tight_layout()
    figure.savefig(target, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
