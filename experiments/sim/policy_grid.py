#!/usr/bin/python3
"""The policy grid: every arm of each grid experiment (experiments/configs/grid/) simulated on
its validate half at each offered utilisation, then one table per trace and utilisation of
TTFT and E2E p50/p90/p99 with 95% intervals, hit ratio and KV moves, and the goal checks of
docs/results.md ("Policy grid").

Intervals: two-level bootstrap (resample the jittered repetitions, then the requests within
each drawn repetition; 1,000 resamples by default), percentile method.

With --tune FILE (experiments/configs/grid/tune.yaml), each trace is first tuned: the
candidate settings of each listed arm run on the trace's TUNE half at --tune_utilisation, the
candidate with the smallest worst-case ratio to the best candidate over TTFT and E2E
p50/p90/p99 wins, and the validate grid runs the winner beside the defaults as
"<arm>-tuned" (not added when the defaults win). Only the validate half is reported as the
result; the tune table says what won and by how much.

usage: policy_grid.py [--bin build/bin/kvf-experiment] [--out experiments/results/grid]
                      [--utilisations 0.3,0.6,0.9,1.2] [--jobs 2] [--markdown FILE]
                      [--tune FILE] [--tune_utilisation 0.9] [--analyse-only] CONFIG...
"""
import argparse
import csv
import json
import os
import subprocess
import sys
from collections import defaultdict

import numpy as np
import yaml

DEFAULT_ARM = "hybrid"
BASELINE_ARM = "round_robin"
MOVING = {"unified", "elastic"}
TUNED = "-tuned"


def base_arm(name):
    return name[:-len(TUNED)] if name.endswith(TUNED) else name
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


def run_point(args, config, name, u, out=None):
    out = out or os.path.join(args.out, name, f"u{u}")
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


def merge(dst, src):
    """src merged over dst key by key (maps recursively); returns dst"""
    for k, v in (src or {}).items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            merge(dst[k], v)
        else:
            dst[k] = yaml.safe_load(yaml.safe_dump(v))
    return dst


def derived_config(config, path, half, arms):
    """the grid config with another half and arm list, written to path; relative paths made
    absolute (they are relative to the original file)"""
    with open(config) as f:
        doc = yaml.safe_load(f)
    here = os.path.dirname(os.path.abspath(config))
    for section, key in (("trace", "path"), ("cluster", "engine_config")):
        value = doc.get(section, {}).get(key)
        if value and "${" not in value and not os.path.isabs(value):
            doc[section][key] = os.path.normpath(os.path.join(here, value))
    doc.setdefault("split", {})["half"] = half
    doc["arms"] = arms
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    return path


def candidate_arm(arm, candidate):
    out = {"name": f"{arm['name']}~{candidate['name']}",
           "policy": merge(yaml.safe_load(yaml.safe_dump(arm["policy"])), candidate.get("policy"))}
    router = merge(yaml.safe_load(yaml.safe_dump(arm.get("router") or {})), candidate.get("router"))
    if router:
        out["router"] = router
    return out


def point_figures(reps):
    pooled = {m: np.concatenate([r[i] for r in reps.values()]) for i, m in enumerate(("ttft", "e2e"))}
    return {(m, p): v for m in ("ttft", "e2e") for p, v in zip(PCTS, np.percentile(pooled[m], PCTS))}


def tune(args, config, name, tune_spec):
    """runs the candidates on the tune half; returns (validate config path, markdown lines)"""
    with open(config) as f:
        arms = yaml.safe_load(f)["arms"]
    by_name = {a["name"]: a for a in arms}
    cands = []
    for arm_name, candidates in tune_spec["candidates"].items():
        if arm_name in by_name:
            cands += [(arm_name, c, candidate_arm(by_name[arm_name], c)) for c in candidates]
    tune_config = derived_config(config, os.path.join(args.out, name, "tune.yaml"), "tune",
                                 [c[2] for c in cands])
    # A tune half that cannot offer --tune_utilisation (long sessions bound the rate) is tuned
    # at the next lower utilisation of the sweep, and its table says so.
    sweep = sorted({float(x) for x in args.utilisations.split(",")} | {args.tune_utilisation},
                   reverse=True)
    for u in [x for x in sweep if x <= args.tune_utilisation]:
        tune_out = os.path.join(args.out, name, f"tune_u{u}")
        if args.analyse_only:
            if done(tune_out):
                break
            continue
        try:
            run_point(args, tune_config, name, u, out=tune_out)
            break
        except subprocess.CalledProcessError:
            print(f"tuning {name} at {u} failed; trying a lower utilisation", file=sys.stderr)
    md = [f"\nTuned on the **tune half** at offered utilisation {u} "
          f"(`{os.path.relpath(tune_config)}`). Seconds; worst = the largest ratio to the best "
          "candidate of the same arm over the six figures; the smallest worst wins.\n",
          "| candidate | TTFT p50 | TTFT p90 | TTFT p99 | E2E p50 | E2E p90 | E2E p99 | errors | worst |",
          "|---|---|---|---|---|---|---|---|---|"]
    tuned = []
    if not done(tune_out):
        md.append("\n(tuning not run)\n")
    else:
        results = load_arms(tune_out)
        figs = {a: point_figures(d["reps"]) for a, d in results.items() if d["reps"]}
        for arm_name in tune_spec["candidates"]:
            group = [c for c in cands if c[0] == arm_name and c[2]["name"] in figs]
            if not group:
                continue
            best = {f: min(figs[c[2]["name"]][f] for c in group) for f in figs[group[0][2]["name"]]}
            worst = {c[2]["name"]: max(figs[c[2]["name"]][f] / best[f] for f in best if best[f] > 0)
                     for c in group}
            winner = min(group, key=lambda c: worst[c[2]["name"]])
            for c in group:
                n = c[2]["name"]
                mark = " **(won)**" if c is winner else ""
                md.append(f"| {n}{mark} | " + " | ".join(f"{figs[n][(m, p)]:.2f}" for m in ("ttft", "e2e")
                                                       for p in PCTS)
                          + f" | {results[n]['errors']} | {worst[n]:.2f} |")
            if winner[1]["name"] != "defaults":
                arm = dict(winner[2])
                arm["name"] = arm_name + TUNED
                tuned.append(arm)
    validate = derived_config(config, os.path.join(args.out, name, "validate.yaml"), "validate",
                              arms + tuned)
    md.append("")
    md.append("Run on the validate half: " + (", ".join(
        f"{a['name']} = {a['name'][:-len(TUNED)]} with " + json.dumps(
            {k: a[k] for k in ("policy", "router") if k in a}) for a in tuned)
        or "the defaults won every tuning; no tuned arm") + ".")
    return validate, md


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
    for default in (DEFAULT_ARM, DEFAULT_ARM + TUNED):
        if default not in stats:
            continue
        d = stats[default]
        far, lost = [], []
        for f in figures:
            best = min(stats[a][f][0] for a in names)
            best_arm = min(names, key=lambda a: stats[a][f][0])
            if d[f][0] > 1.05 * best:
                far.append(f"{label(f)} {d[f][0] / best - 1:+.0%} vs {best_arm}")
            if BASELINE_ARM in stats and not d[f][0] < stats[BASELINE_ARM][f][0]:
                lost.append(f"{label(f)} {d[f][0] / stats[BASELINE_ARM][f][0] - 1:+.0%}")
        lines.append(f"- default ({default}) within 5% of the best arm on all six: " +
                     ("**met**" if not far else "**not met** (" + "; ".join(far) + ")"))
        lines.append(f"- default ({default}) beats round robin on all six: " +
                     ("**met**" if not lost else "**not met** (" + "; ".join(lost) + ")"))
    fixed = [a for a in names if base_arm(a) not in MOVING]
    for a in sorted(a for a in names if base_arm(a) in MOVING):
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
    ap.add_argument("--tune", default="", help="candidates to tune on the tune half first")
    ap.add_argument("--tune_utilisation", type=float, default=0.9)
    ap.add_argument("--analyse-only", action="store_true")
    args = ap.parse_args()
    tune_spec = None
    if args.tune:
        with open(args.tune) as f:
            tune_spec = yaml.safe_load(f)
    rng = np.random.default_rng(1)
    md = []
    for config in args.configs:
        name = os.path.splitext(os.path.basename(config))[0]
        md.append(f"\n### {name}\n")
        if tune_spec:
            config, tune_md = tune(args, config, name, tune_spec)
            md.extend(tune_md)
            print("\n".join(tune_md), flush=True)
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
