#!/usr/bin/python3
"""The policy grid: every arm of each grid experiment (experiments/configs/grid/) simulated on
its validate half at each offered utilisation, then one table per trace and utilisation of
TTFT and E2E p50/p90/p99 with 95% intervals, hit ratio and KV moves, and the goal checks of
docs/results.md ("Policy grid").

Intervals: two-level bootstrap (resample the jittered repetitions, then the requests within
each drawn repetition; 1,000 resamples by default), percentile method.

usage: policy_grid.py [--bin build/bin/kvf-experiment] [--out experiments/results/grid]
                      [--utilisations 0.3,0.6,0.9,1.2] [--jobs 2] [--markdown FILE]
                      [--analyse-only] CONFIG...
"""
import argparse
import csv
import json
import os
import subprocess
import sys
from collections import defaultdict

import numpy as np

DEFAULT_ARM = "hybrid"
BASELINE_ARM = "round_robin"
MOVING = {"unified", "elastic"}
PCTS = (50, 90, 99)


def done(out):
    """every arm and repetition of the point finished (kvf-experiment writes arms.txt first)"""
    arms_txt = os.path.join(out, "arms.txt")
    if not os.path.exists(os.path.join(out, "load.yaml")) or not os.path.exists(arms_txt):
        return False
    with open(arms_txt) as f:
        names = [line.strip() for line in f if line.strip()]
    return all(os.path.isdir(os.path.join(out, "arms", a)) and
               any(os.path.exists(os.path.join(out, "arms", a, r, "DONE"))
                   for r in os.listdir(os.path.join(out, "arms", a))) for a in names)


def run_point(args, config, name, u):
    out = os.path.join(args.out, name, f"u{u}")
    if done(out):
        return out
    cmd = [args.bin, "sim", config, "--utilisation", str(u), "--output_dir", out,
           "--jobs", str(args.jobs), "--plots=false", "--report=false"]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


def read_load(out):
    values = {}
    with open(os.path.join(out, "load.yaml")) as f:
        for line in f:
            if ":" in line:
                k, v = line.split(":", 1)
                values[k.strip()] = v.strip()
    return values


def load_arms(out):
    """arm -> {'reps': {rep: (ttft array, e2e array)}, 'errors', 'moves', 'hits', 'queries',
    'per_instance'}"""
    arms = {}
    with open(os.path.join(out, "arms.txt")) as f:
        names = [line.strip() for line in f if line.strip()]
    for arm in names:
        reps, errors, moves, prompt, cached = {}, 0, 0, 0, 0
        per_instance = defaultdict(int)
        arm_dir = os.path.join(out, "arms", arm)
        for rep in sorted(os.listdir(arm_dir)):
            path = os.path.join(arm_dir, rep, "results.jsonl")
            if not rep.startswith("rep") or not os.path.exists(path):
                continue
            ttft, e2e = [], []
            with open(path) as f:
                for line in f:
                    r = json.loads(line)
                    if not r.get("ok"):
                        errors += 1
                        continue
                    ttft.append(r["ttft_s"])
                    e2e.append(r["e2e_s"])
                    if r.get("decision") not in ("", "local", None):
                        moves += 1
                    prompt += max(r.get("prompt_tokens", 0), 0)
                    cached += max(r.get("cached_tokens", 0), 0)
                    per_instance[(rep, r.get("instance", ""))] += 1
            reps[rep] = (np.array(ttft), np.array(e2e))
        counts = defaultdict(list)
        for (rep, _), n in per_instance.items():
            counts[rep].append(n)
        imbalance = np.mean([max(c) * 8 / sum(c) for c in counts.values()]) if counts else 0
        arms[arm] = dict(reps=reps, errors=errors, moves=moves / max(1, len(reps)),
                         hit=cached / prompt if prompt else 0, imbalance=imbalance)
    return arms


def bootstrap(reps, resamples, rng):
    """point and 95% interval of each percentile of TTFT and E2E: {('ttft', 50): (v, lo, hi)}"""
    keys = sorted(reps)
    pooled = {m: np.concatenate([reps[k][i] for k in keys]) for i, m in enumerate(("ttft", "e2e"))}
    out = {}
    draws = {(m, p): [] for m in ("ttft", "e2e") for p in PCTS}
    for _ in range(resamples):
        chosen = rng.integers(0, len(keys), len(keys))
        parts = {"ttft": [], "e2e": []}
        for c in chosen:
            t, e = reps[keys[c]]
            idx = rng.integers(0, len(t), len(t))
            parts["ttft"].append(t[idx])
            parts["e2e"].append(e[idx])
        for m in ("ttft", "e2e"):
            values = np.percentile(np.concatenate(parts[m]), PCTS)
            for p, v in zip(PCTS, values):
                draws[(m, p)].append(v)
    for m in ("ttft", "e2e"):
        point = np.percentile(pooled[m], PCTS)
        for p, v in zip(PCTS, point):
            lo, hi = np.percentile(draws[(m, p)], [2.5, 97.5])
            out[(m, p)] = (v, lo, hi)
    return out


def checks(stats, arms):
    lines = []
    names = [a for a in stats if a in arms]
    figures = [(m, p) for m in ("ttft", "e2e") for p in PCTS]
    label = lambda f: f"{f[0].upper()} p{f[1]}"
    if DEFAULT_ARM in stats:
        d = stats[DEFAULT_ARM]
        far, lost = [], []
        for f in figures:
            best = min(stats[a][f][0] for a in names)
            best_arm = min(names, key=lambda a: stats[a][f][0])
            if d[f][0] > 1.05 * best:
                far.append(f"{label(f)} {d[f][0] / best - 1:+.0%} vs {best_arm}")
            if BASELINE_ARM in stats and not d[f][0] < stats[BASELINE_ARM][f][0]:
                lost.append(f"{label(f)} {d[f][0] / stats[BASELINE_ARM][f][0] - 1:+.0%}")
        lines.append("- default (hybrid) within 5% of the best arm on all six: " +
                     ("**met**" if not far else "**not met** (" + "; ".join(far) + ")"))
        lines.append("- default beats round robin on all six: " +
                     ("**met**" if not lost else "**not met** (" + "; ".join(lost) + ")"))
    fixed = [a for a in names if a not in MOVING]
    for a in sorted(MOVING & set(names)):
        if arms[a]["moves"] == 0:
            lines.append(f"- {a}: made no moves (nothing to check)")
            continue
        worse = []
        for f in figures:
            best = min(stats[b][f][0] for b in fixed)
            if stats[a][f][0] > 1.02 * best:
                worse.append(f"{label(f)} {stats[a][f][0] / best - 1:+.0%}")
        best99_arm = min(fixed, key=lambda b: stats[b][("ttft", 99)][0])
        change = stats[a][("ttft", 99)][0] / stats[best99_arm][("ttft", 99)][0] - 1
        ok = change <= -0.15 and not worse
        lines.append(
            f"- {a} ({arms[a]['moves']:.0f} moves/rep): TTFT p99 {change:+.0%} against the best "
            f"non-moving arm ({best99_arm}; goal -15% or better); worse by > 2% than the best "
            f"non-moving arm on: {', '.join(worse) or 'none'}: " + ("**met**" if ok else "**not met**"))
    return lines


def fmt(v):
    return f"{v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--bin", default="build/bin/kvf-experiment")
    ap.add_argument("--out", default="experiments/results/grid")
    ap.add_argument("--utilisations", default="0.3,0.6,0.9,1.2")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--markdown", default="")
    ap.add_argument("--analyse-only", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    md = []
    for config in args.configs:
        name = os.path.splitext(os.path.basename(config))[0]
        md.append(f"\n### {name}\n")
        for u in [float(x) for x in args.utilisations.split(",")]:
            out = os.path.join(args.out, name, f"u{u}")
            if not args.analyse_only:
                try:
                    out = run_point(args, config, name, u)
                except subprocess.CalledProcessError as e:
                    md.append(f"\n**u = {u}**: the simulation failed ({e}).\n")
                    continue
            if not done(out):
                md.append(f"\n**u = {u}**: not run.\n")
                continue
            load = read_load(out)
            arms = load_arms(out)
            stats = {a: bootstrap(d["reps"], args.resamples, rng) for a, d in arms.items()
                     if d["reps"] and all(len(r[0]) for r in d["reps"].values())}
            md.append(
                f"\n**Offered utilisation {float(load['offered_utilisation']):.2f}** "
                f"({load.get('requests')} requests of the {load.get('split', 'whole')} half, "
                f"{load.get('split_sessions', '?')} of {load.get('split_total_sessions', '?')} "
                f"sessions; arrivals x{float(load.get('arrival_factor', 1)):.3g}; "
                f"{len(next(iter(arms.values()))['reps'])} repetition(s)). Seconds; 95% intervals.\n")
            md.append("| arm | TTFT p50 | TTFT p90 | TTFT p99 | E2E p50 | E2E p90 | E2E p99 | "
                      "hit ratio | moves/rep | req max/mean | errors |")
            md.append("|---|---|---|---|---|---|---|---|---|---|---|")
            for a in arms:
                if a not in stats:
                    md.append(f"| {a} | (no completed requests) |||||||||")
                    continue
                s = stats[a]
                md.append(f"| {a} | " + " | ".join(fmt(s[(m, p)]) for m in ("ttft", "e2e") for p in PCTS)
                          + f" | {arms[a]['hit']:.1%} | {arms[a]['moves']:.0f} | "
                          f"{arms[a]['imbalance']:.2f} | {arms[a]['errors']} |")
            md.append("")
            md.extend(checks(stats, arms))
            print("\n".join(md[-len(arms) - 8:]), flush=True)
    text = "\n".join(md) + "\n"
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
