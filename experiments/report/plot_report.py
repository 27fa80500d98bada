#!/usr/bin/python3
"""Plots for `kvf-experiment report DIR`: TTFT and E2E CDFs per arm, per-instance prefix-cache
hit ratio bars, and requests in flight per instance over time (one panel per arm on shared
axes). Reads DIR/data/*.csv written by the report and writes DIR/plots/*.png. Legends sit
outside the data. Needs Debian's python3-matplotlib (run with /usr/bin/python3)."""
import argparse
import csv
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

VERSION = "@KVF_VERSION@"  # filled in when the build installs the script


def legend_outside(ax, **kwargs):
    """A legend to the right of the axes, so it never covers a line."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, **kwargs)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def cdf(ax, values, label):
    values = sorted(values)
    if not values:
        return
    n = len(values)
    ax.plot(values, [(i + 1) / n for i in range(n)], label=label)


def main(directory):
    data = os.path.join(directory, "data")
    out = os.path.join(directory, "plots")
    os.makedirs(out, exist_ok=True)
    rows = read_csv(os.path.join(data, "latencies.csv"))
    arms = []
    for r in rows:
        if r["arm"] not in arms:
            arms.append(r["arm"])

    for metric, title in (("ttft_s", "TTFT"), ("e2e_s", "E2E latency")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for arm in arms:
            vals = [float(r[metric]) for r in rows if r["arm"] == arm and r["ok"] == "1"
                    and float(r[metric]) >= 0]
            cdf(ax, vals, arm)
        ax.set_xscale("log")
        ax.set_xlabel(f"{title} (s, log scale)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{title} CDF per arm")
        ax.grid(True, which="both", alpha=0.3)
        legend_outside(ax)
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"{metric.split('_')[0]}_cdf.png"), dpi=110,
                    bbox_inches="tight")
        plt.close(fig)

    cache = read_csv(os.path.join(data, "instance_cache.csv"))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    instances = sorted({r["instance"] for r in cache}, key=lambda s: (len(s), s))
    width = 0.8 / max(1, len(arms))
    for k, arm in enumerate(arms):
        ratio = {}
        for r in cache:
            if r["arm"] == arm:
                q = float(r["queries"])
                ratio[r["instance"]] = 100.0 * float(r["hits"]) / q if q > 0 else 0.0
        xs = [i + k * width for i in range(len(instances))]
        ax.bar(xs, [ratio.get(i, 0.0) for i in instances], width=width, label=arm)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(instances))])
    ax.set_xticklabels([f"inst_{i}" for i in instances])
    ax.set_ylabel("prefix-cache hit ratio (%)")
    ax.set_title("Per-instance prefix-cache hit ratio")
    if arms:
        legend_outside(ax)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "instance_apc.png"), dpi=110, bbox_inches="tight")
    plt.close(fig)

    # One panel per arm on shared axes, so the arms' load compares at a glance; one legend of
    # instances (the same colour is the same instance in every panel) outside the panels.
    fig, axes = plt.subplots(len(arms), 1, figsize=(9, 2.4 * max(1, len(arms)) + 0.6),
                             squeeze=False, sharex=True, sharey=True)
    instance_names = sorted({r["instance"] or "?" for r in rows}, key=lambda s: (len(s), s))
    colours = {inst: f"C{k % 10}" for k, inst in enumerate(instance_names)}
    handles = {}
    for ax, arm in zip(axes[:, 0], arms):
        per_instance = defaultdict(list)
        for r in rows:
            if r["arm"] != arm or r["rep"] != "0" or r["ok"] != "1":
                continue
            start = float(r["sent_s"])
            per_instance[r["instance"] or "?"].append((start, start + float(r["e2e_s"])))
        for inst in sorted(per_instance, key=lambda s: (len(s), s)):
            events = []
            for s, e in per_instance[inst]:
                events += [(s, 1), (e, -1)]
            events.sort()
            xs, ys, level = [], [], 0
            for t, d in events:
                level += d
                xs.append(t)
                ys.append(level)
            line, = ax.step(xs, ys, where="post", linewidth=0.9, color=colours[inst])
            handles.setdefault(inst, line)
        ax.set_title(f"{arm}: requests in flight per instance (repetition 0)", fontsize=10)
        ax.set_ylabel("in flight")
        ax.grid(True, alpha=0.3)
    axes[-1, 0].set_xlabel("time since replay start (s)")
    if handles:
        names = [i for i in instance_names if i in handles]
        fig.legend([handles[i] for i in names], [f"inst_{i}" for i in names], title="instance",
                   loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "load.png"), dpi=110, bbox_inches="tight")
    plt.close(fig)


def parse_args(argv):
    prog = os.path.basename(argv[0]) if argv else "kvf-plot-report.py"
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit status: 0 plots written, 1 the data could not be read, 2 a bad command line.")
    parser.add_argument("result_dir", metavar="RESULT_DIR",
                        help="an experiment's result directory (kvf-experiment run or sim)")
    version = VERSION if not VERSION.startswith("@") else "(not installed by the build)"
    parser.add_argument("--version", action="version", version=f"{prog} {version}")
    return parser.parse_args(argv[1:])


if __name__ == "__main__":
    main(parse_args(sys.argv).result_dir)
