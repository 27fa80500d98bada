#!/usr/bin/python3
"""Router replicas against one router, from `kvf-experiment sim` or `run` result directories:
per arm, the token hit ratio (cached / prompt tokens over the requests) and TTFT p90 of each
finished repetition (one with a DONE marker), their mean, and the difference from the baseline
arm (the first in arms.txt) paired by repetition (sim: the same seed and jitter draws; run: the
arms alternate repetition by repetition), with a 95% t-interval over the repetitions.

usage: replica_summary.py DIR [DIR ...]     (each DIR: experiments/results/<name>)
"""
import json
import math
import os
import sys

import numpy as np

# Two-sided 95% quantiles of Student's t by degrees of freedom.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def rep_figures(path):
    cached = prompt = 0
    ttft = []
    errors = 0
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("error"):
                errors += 1
                continue
            if r.get("ttft_s", -1) >= 0:
                ttft.append(r["ttft_s"])
            if r.get("cached_tokens", -1) >= 0 and r.get("prompt_tokens", -1) > 0:
                cached += r["cached_tokens"]
                prompt += r["prompt_tokens"]
    return cached / prompt, float(np.percentile(ttft, 90)), errors, len(ttft)


def interval(values):
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return float(v.mean()), math.nan
    return float(v.mean()), T95.get(len(v) - 1, 1.96) * float(v.std(ddof=1)) / math.sqrt(len(v))


def summarize(d):
    with open(os.path.join(d, "arms.txt")) as f:
        arms = [a.strip() for a in f if a.strip()]
    figures = {}
    for arm in arms:
        reps = sorted(r for r in os.listdir(os.path.join(d, "arms", arm))
                      if os.path.isdir(os.path.join(d, "arms", arm, r)) and
                      os.path.exists(os.path.join(d, "arms", arm, r, "DONE")))
        figures[arm] = [rep_figures(os.path.join(d, "arms", arm, r, "results.jsonl")) for r in reps]
    base = figures[arms[0]]
    print(f"## {d}")
    print("| arm | reps | hit ratio (mean) | hit - baseline, points (95%) | TTFT p90 s (mean) "
          "| TTFT p90 vs baseline (95%) | errors |")
    print("|---|---|---|---|---|---|---|")
    for arm in arms:
        f = figures[arm]
        n = min(len(f), len(base))
        hit_mean, _ = interval([x[0] for x in f])
        p90_mean, _ = interval([x[1] for x in f])
        dh, dh_ci = interval([100 * (f[i][0] - base[i][0]) for i in range(n)])
        dp, dp_ci = interval([100 * (f[i][1] / base[i][1] - 1) for i in range(n)])
        print(f"| {arm} | {len(f)} | {hit_mean:.4f} | {dh:+.2f} ± {dh_ci:.2f} | {p90_mean:.3f} "
              f"| {dp:+.1f}% ± {dp_ci:.1f} | {sum(x[2] for x in f)} |")
    print()


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(sys.argv) >= 2 else 2
    for d in sys.argv[1:]:
        summarize(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
