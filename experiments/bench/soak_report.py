#!/usr/bin/python3
"""Judges a soak's samples (experiments/bench/soak.sh): per process, the mean RSS and open fds
of the first minute after warm-up against the mean of the last minute, and the maximum after
warm-up; PASS when the end is within the bound of the start. Draws RSS and fds against time.

Usage: soak_report.py SAMPLES.csv [--warmup S] [--bound PCT] [--plot PNG] [--markdown]
Exit status: 0 every process within the bound, 1 one is not, 2 bad input.
"""
import argparse
import csv
import sys

import numpy as np

WINDOW_S = 60


def load(path):
    """Returns {process: (t, rss_kb, fds)} as numpy arrays in time order."""
    rows = {}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        want = {"t_s", "process", "pid", "rss_kb", "fds"}
        if not reader.fieldnames or not want <= set(reader.fieldnames):
            raise ValueError(f"{path}: header must have {sorted(want)}")
        for line, row in enumerate(reader, start=2):
            try:
                rows.setdefault(row["process"], []).append(
                    (float(row["t_s"]), float(row["rss_kb"]), float(row["fds"])))
            except (TypeError, ValueError):
                raise ValueError(f"{path}:{line}: t_s, rss_kb and fds must be numbers")
    if not rows:
        raise ValueError(f"{path}: no samples")
    out = {}
    for name, values in rows.items():
        a = np.array(sorted(values))
        out[name] = (a[:, 0], a[:, 1], a[:, 2])
    return out


def judge(t, values, warmup):
    """(start mean, end mean, max after warm-up, end change %, max change %)."""
    end_t = t.max()
    after = t >= warmup
    first = after & (t < warmup + WINDOW_S)
    last = t > end_t - WINDOW_S
    if not first.any() or not last.any():
        raise ValueError(f"no samples in the first minute after warm-up ({warmup} s) or the last")
    start, end, peak = values[first].mean(), values[last].mean(), values[after].max()
    return start, end, peak, 100 * (end - start) / start, 100 * (peak - start) / start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("samples", help="samples.csv written by soak.sh (t_s,process,pid,rss_kb,fds)")
    ap.add_argument("--warmup", type=float, default=300, help="seconds before the judged start")
    ap.add_argument("--bound", type=float, default=5, help="allowed end change in percent")
    ap.add_argument("--plot", default="", help="write the RSS and fds plot to this PNG")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = ap.parse_args()
    try:
        data = load(args.samples)
        results = []
        for name in sorted(data, key=lambda n: (n != "router", n)):
            t, rss, fds = data[name]
            results.append((name, judge(t, rss / 1024, args.warmup), judge(t, fds, args.warmup)))
    except (OSError, ValueError) as e:
        print(f"soak_report.py: {e}", file=sys.stderr)
        return 2

    ok = True
    if args.markdown:
        print("| process | RSS start -> end MiB (max) | change | fds start -> end (max) | change |")
        print("|---|---|---|---|---|")
    else:
        print(f"{'process':8} {'RSS start':>10} {'end':>8} {'max':>8} {'end %':>7} {'max %':>7}"
              f" | {'fds start':>9} {'end':>6} {'max':>5} {'end %':>7} {'max %':>7}  verdict")
    for name, r, f in results:
        passed = abs(r[3]) <= args.bound and abs(f[3]) <= args.bound
        ok &= passed
        if args.markdown:
            print(f"| {name} | {r[0]:.1f} -> {r[1]:.1f} ({r[2]:.1f}) | {r[3]:+.1f}% "
                  f"| {f[0]:.1f} -> {f[1]:.1f} ({f[2]:.0f}) | {f[3]:+.1f}% |")
        else:
            print(f"{name:8} {r[0]:10.1f} {r[1]:8.1f} {r[2]:8.1f} {r[3]:+7.1f} {r[4]:+7.1f}"
                  f" | {f[0]:9.1f} {f[1]:6.1f} {f[2]:5.0f} {f[3]:+7.1f} {f[4]:+7.1f}  "
                  f"{'PASS' if passed else 'FAIL'}")
    if not args.markdown:
        print(f"RSS in MiB; start = mean of the first minute after {args.warmup:.0f} s, end = mean "
              f"of the last minute, max = after warm-up; PASS = end within {args.bound:g}% of "
              f"start: {'all PASS' if ok else 'FAIL'}")

    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (ax_rss, ax_fds) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
        for name, _, _ in results:
            t, rss, fds = data[name]
            ax_rss.plot(t / 60, rss / 1024, label=name)
            ax_fds.plot(t / 60, fds, label=name)
        for ax in (ax_rss, ax_fds):
            ax.axvline(args.warmup / 60, color="grey", linestyle="--", linewidth=0.8)
            ax.grid(alpha=0.3)
        ax_rss.set_ylabel("RSS (MiB)")
        ax_fds.set_ylabel("open fds")
        ax_fds.set_xlabel("minutes (dashed: end of warm-up)")
        ax_rss.set_title("Soak: RSS and open file descriptors per process")
        ax_rss.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
