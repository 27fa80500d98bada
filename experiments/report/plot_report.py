#!/usr/bin/python3
"""Plots for `kvf-experiment report DIR`: TTFT and E2E CDFs per arm, per-instance prefix-cache
hit ratio bars, and requests in flight per instance over time. Reads DIR/data/*.csv written by
the report and writes DIR/plots/*.png. Needs Debian's python3-matplotlib (run with
/usr/bin/python3)."""
import csv
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


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
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"{metric.split('_')[0]}_cdf.png"), dpi=110)
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
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "instance_apc.png"), dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(len(arms), 1, figsize=(8, 2.6 * max(1, len(arms))), squeeze=False)
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
            ax.step(xs, ys, where="post", label=str(inst), linewidth=0.9)
        ax.set_title(f"{arm}: requests in flight per instance (repetition 0)")
        ax.set_xlabel("time since replay start (s)")
        ax.set_ylabel("in flight")
        ax.grid(True, alpha=0.3)
        if per_instance:
            ax.legend(fontsize=7, ncol=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "load.png"), dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help"):
        print("usage: plot_report.py RESULT_DIR\n\n" + __doc__)
        sys.exit(0)
    if len(sys.argv) != 2:
        sys.exit("usage: plot_report.py RESULT_DIR")
    main(sys.argv[1])
