#!/usr/bin/python3
"""Sweep plots for `kvf-experiment sim`: one PNG per swept parameter (DIR/plots/sweep_<k>.png)
with TTFT p50, TTFT p90, E2E p50 and the cluster prefix-cache hit ratio against the swept
value, one line per base arm and its unswept value as a dashed reference. Reads
DIR/data/sweep.csv. Needs Debian's python3-matplotlib (run with /usr/bin/python3)."""
import csv
import os
import sys
from collections import OrderedDict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PANELS = (("ttft_p50", "TTFT p50 (s)"), ("ttft_p90", "TTFT p90 (s)"),
          ("e2e_p50", "E2E p50 (s)"), ("apc", "cluster prefix-cache hit ratio (%)"))


def as_number(text):
    try:
        return float(text)
    except ValueError:
        return None


def main(directory):
    with open(os.path.join(directory, "data", "sweep.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    out = os.path.join(directory, "plots")
    os.makedirs(out, exist_ok=True)
    sweeps = OrderedDict()
    for r in rows:
        sweeps.setdefault(r["sweep"], []).append(r)
    for k, sweep_rows in sweeps.items():
        param = sweep_rows[0]["param"]
        swept = [r for r in sweep_rows if r["value"] != "base"]
        numeric = all(as_number(r["value"]) is not None for r in swept)
        labels = []
        for r in swept:
            if r["value"] not in labels:
                labels.append(r["value"])
        fig, axes = plt.subplots(2, 2, figsize=(10, 7))
        for ax, (column, title) in zip(axes.flat, PANELS):
            scale = 100.0 if column == "apc" else 1.0
            bases = OrderedDict()
            for r in sweep_rows:
                bases.setdefault(r["base_arm"], []).append(r)
            for base, base_rows in bases.items():
                points = [r for r in base_rows if r["value"] != "base"]
                if numeric:
                    points.sort(key=lambda r: as_number(r["value"]))
                    xs = [as_number(r["value"]) for r in points]
                else:
                    xs = [labels.index(r["value"]) for r in points]
                ys = [scale * float(r[column]) for r in points]
                line, = ax.plot(xs, ys, marker="o", label=base)
                ref = [r for r in base_rows if r["value"] == "base"]
                if ref:
                    ax.axhline(scale * float(ref[0][column]), color=line.get_color(),
                               linestyle="--", linewidth=0.8)
            if not numeric:
                ax.set_xticks(range(len(labels)))
                ax.set_xticklabels(labels)
            ax.set_xlabel(param)
            ax.set_ylabel(title)
            ax.grid(True, alpha=0.3)
        axes.flat[0].legend(fontsize=8)
        fig.suptitle(f"Sweep of {param} (dashed: the arm as configured)")
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"sweep_{k}.png"), dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help"):
        print("usage: plot_sweep.py RESULT_DIR\n\n" + __doc__)
        sys.exit(0)
    if len(sys.argv) != 2:
        sys.exit("usage: plot_sweep.py RESULT_DIR")
    main(sys.argv[1])
