#!/usr/bin/python3
"""Sweep plots for `kvf-experiment sim`: one PNG per swept parameter (DIR/plots/sweep_<k>.png)
with TTFT p50, TTFT p90, E2E p50 and the cluster prefix-cache hit ratio against the swept
value, one line per base arm and its unswept value as a dashed reference. The panels share the
swept axis, the two TTFT panels share their latency axis, and the legend sits outside the data.
Reads DIR/data/sweep.csv. Needs Debian's python3-matplotlib (run with /usr/bin/python3)."""
import argparse
import csv
import os
import sys
from collections import OrderedDict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

VERSION = "@KVF_VERSION@"  # filled in when the build installs the script

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
        fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
        axes[0, 1].sharey(axes[0, 0])  # TTFT p50 and p90 on one latency scale
        handles = OrderedDict()
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
                handles.setdefault(base, line)
                ref = [r for r in base_rows if r["value"] == "base"]
                if ref:
                    ax.axhline(scale * float(ref[0][column]), color=line.get_color(),
                               linestyle="--", linewidth=0.8)
            if not numeric:
                ax.set_xticks(range(len(labels)))
                ax.set_xticklabels(labels)
            ax.set_ylabel(title)
            ax.grid(True, alpha=0.3)
        for ax in axes[1]:
            ax.set_xlabel(param)
        fig.legend(list(handles.values()), list(handles.keys()), title="arm", fontsize=8,
                   loc="center left", bbox_to_anchor=(1.0, 0.5))
        fig.suptitle(f"Sweep of {param} (dashed: the arm as configured)")
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"sweep_{k}.png"), dpi=110, bbox_inches="tight")
        plt.close(fig)


def parse_args(argv):
    prog = os.path.basename(argv[0]) if argv else "kvf-plot-sweep.py"
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit status: 0 plots written, 1 the data could not be read, 2 a bad command line.")
    parser.add_argument("result_dir", metavar="RESULT_DIR",
                        help="a result directory of kvf-experiment sim with a sweep")
    version = VERSION if not VERSION.startswith("@") else "(not installed by the build)"
    parser.add_argument("--version", action="version", version=f"{prog} {version}")
    return parser.parse_args(argv[1:])


if __name__ == "__main__":
    main(parse_args(sys.argv).result_dir)
