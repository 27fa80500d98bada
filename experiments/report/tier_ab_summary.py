#!/usr/bin/python3
"""Summary of the KV-tier A/B (experiments/configs/tiers/agentic_*.yaml, run once per trace seed
by experiments/sim/tier_ab.sh): per arm, the mean over seeds of the cluster hit ratio, its split
by tier (GPU, host memory, disk) and the TTFT/E2E percentiles, each arm's difference to the
G1-only baseline paired by seed with a 95% t-interval, and how many routing decisions found a
lower-tier run.

Usage: tier_ab_summary.py BASELINE_DIRS DIRS ...   where each DIRS is comma-separated result
directories of kvf-experiment sim, one per seed in the same order for every argument; every arm
of each directory is reported (repetitions within a directory count as further samples)."""
import json
import math
import os
import statistics
import sys

T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26,
       10: 2.23, 11: 2.20, 12: 2.18, 13: 2.16, 14: 2.14, 15: 2.13, 16: 2.12, 17: 2.11, 18: 2.10,
       19: 2.09, 24: 2.06, 29: 2.05, 39: 2.02}


def pct(values, q):
    v = sorted(values)
    if not v:
        return float("nan")
    k = (len(v) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def rep_stats(rep_dir):
    rows = [json.loads(l) for l in open(os.path.join(rep_dir, "results.jsonl")) if l.strip()]
    ok = [r for r in rows if r.get("ok")]
    ttft = [r["ttft_s"] for r in ok]
    e2e = [r["e2e_s"] for r in ok]
    prompt = sum(r["prompt_tokens"] for r in ok)
    cached = sum(r["cached_tokens"] for r in ok)
    # Of the cached tokens, those the engines onboarded from host memory and from disk.
    cpu = sum(r.get("cpu_cached_tokens", 0) for r in ok)
    disk = sum(r.get("disk_cached_tokens", 0) for r in ok)
    tiered = 0
    dec = os.path.join(rep_dir, "decisions.jsonl")
    if os.path.exists(dec):
        tiered = sum(1 for l in open(dec) if '"tier_tokens"' in l)
    share = (lambda n: n / prompt) if prompt else (lambda n: 0)
    return {"errors": len(rows) - len(ok), "hit": share(cached),
            "hit_gpu": share(cached - cpu - disk), "hit_cpu": share(cpu), "hit_disk": share(disk),
            "ttft_p50": pct(ttft, 0.5), "ttft_p90": pct(ttft, 0.9), "ttft_p99": pct(ttft, 0.99),
            "e2e_p50": pct(e2e, 0.5), "e2e_p90": pct(e2e, 0.9), "tier_decisions": tiered}


def arms(spec):
    dirs = spec.split(",")
    base = os.path.join(dirs[0], "arms")
    for name in sorted(os.listdir(base)):
        samples = []
        for d in dirs:
            arm_dir = os.path.join(d, "arms", name)
            for r in sorted(x for x in os.listdir(arm_dir) if x.startswith("rep")):
                samples.append(rep_stats(os.path.join(arm_dir, r)))
        group = os.path.basename(dirs[0].rstrip("/")).rsplit("-seed", 1)[0]
        yield f"{group}:{name}", samples


def interval(diffs):
    m = statistics.mean(diffs)
    if len(diffs) < 2:
        return m, float("nan")
    return m, T95.get(len(diffs) - 1, 2.0) * statistics.stdev(diffs) / math.sqrt(len(diffs))


def main():
    if len(sys.argv) < 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help") else 2
    base_label, base = next(arms(sys.argv[1]))
    keys = ["hit", "ttft_p50", "ttft_p90", "ttft_p99", "e2e_p50", "e2e_p90"]
    print("| arm | errors | hit ratio | of it GPU / host / disk | TTFT p50 | TTFT p90 | TTFT p99 |"
          " E2E p50 | E2E p90 | decisions with a tier run |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for spec in sys.argv[1:]:
        for label, reps in arms(spec):
            cells = []
            for k in keys:
                mean = statistics.mean(r[k] for r in reps)
                if k == "ttft_p50":  # the hit ratio's split by tier, after the hit ratio
                    split = [statistics.mean(r[t] for r in reps)
                             for t in ("hit_gpu", "hit_cpu", "hit_disk")]
                    cells.append(" / ".join(f"{v:.1%}" for v in split))
                if label == base_label or len(reps) != len(base):
                    cells.append(f"{mean:.1%}" if k == "hit" else f"{mean:.2f}")
                    continue
                if k == "hit":
                    m, h = interval([(r[k] - b[k]) * 100 for r, b in zip(reps, base)])
                    cells.append(f"{mean:.1%} ({m:+.1f} ± {h:.1f} pt)")
                else:
                    m, h = interval([(r[k] / b[k] - 1) * 100 for r, b in zip(reps, base)])
                    cells.append(f"{mean:.2f} ({m:+.0f}% ± {h:.0f})")
            errors = sum(r["errors"] for r in reps)
            tiered = sum(r["tier_decisions"] for r in reps)
            print(f"| {label} | {errors} | " + " | ".join(cells) + f" | {tiered} |")
    print(f"\nBaseline {base_label}; {len(base)} samples (trace seeds x jitter draws) per arm; "
          "differences paired by seed and draw, 95% t-intervals; seconds.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
