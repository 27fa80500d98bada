#!/usr/bin/python3
"""Per-arm KV-move figures of `kvf-experiment run` result directories: the A/B of two dialects
(kvfabric push against vLLM's NIXL pull) in docs/results.md.

Usage: experiments/report/move_ab.py [--resamples N] [--seed S] DIR [DIR ...]

For every arm of every DIR (DIR/arms/<arm>/rep<k>/, finished repetitions only) it prints one
Markdown table row per arm with:
  - TTFT p50 / p90 / p99 of every request and of the requests that moved KV (the replayer's
    results.jsonl, `decision` push_migrate or prefill_offload), in wall seconds, with 95%
    intervals: two-level bootstrap (the repetitions, then the requests within each drawn
    repetition; percentile method), as the harness's report does;
  - moves per repetition, and for the moves the decode instance reported a transfer for (the
    router's decisions.jsonl `transfer`): KV bytes per move (mean, with its interval), tokens
    per move, and the total bytes per repetition;
  - the first leg (P's prefill, or the NIXL holder's leg: decisions.jsonl `peer_leg_s`) and the
    rest of the move's time to first token (the router's ttft_s less the leg: D's queue, the
    transfer, D's prefill of what it still lacks), medians;
  - the engines' transport counters summed over the cluster and averaged per repetition:
    bytes written by puts (kvfabric push) and read by gets (NIXL pull).
Reads only; Python standard library.
"""
import argparse
import json
import pathlib
import random
import statistics
import sys

from compare_live_sim import percentile as quantile  # the report's nearest rank

MOVES = ("push_migrate", "prefill_offload")
QUANTILES = (0.5, 0.9, 0.99)


def jsonl(path):
    out = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            out.append(json.loads(line))
    return out


def metric_sum(rep, name):
    total = 0.0
    for f in rep.glob("engine_*.metrics"):
        for line in f.read_text().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
    return total


def bootstrap(groups, stat, resamples, rng):
    """95% interval of stat(pooled values) over repetitions, then requests within each."""
    groups = [g for g in groups if g]
    if not groups:
        return (float("nan"), float("nan"))
    draws = []
    for _ in range(resamples):
        pooled = []
        for g in (rng.choice(groups) for _ in groups):
            pooled.extend(rng.choice(g) for _ in g)
        draws.append(stat(pooled))
    draws.sort()
    return (draws[int(0.025 * len(draws))], draws[min(len(draws) - 1, int(0.975 * len(draws)))])


def fmt(point, interval, digits=3):
    if point != point:  # NaN
        return "-"
    return f"{point:.{digits}f} [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"


def arm_row(name, reps, resamples, rng):
    ttft_all, ttft_moved, move_bytes, move_tokens, legs, after = [], [], [], [], [], []
    moves, bytes_total, puts, gets = [], [], [], []
    for rep in reps:
        results = [r for r in jsonl(rep / "results.jsonl") if r.get("ok")]
        ttft_all.append([r["ttft_s"] for r in results])
        ttft_moved.append([r["ttft_s"] for r in results if r.get("decision") in MOVES])
        decisions = [d for d in jsonl(rep / "decisions.jsonl") if d.get("status") == 200]
        moved = [d for d in decisions if d.get("mode") in MOVES]
        moves.append(len(moved))
        transfers = [d["transfer"] for d in moved if d.get("transfer")]
        move_bytes.append([t["pushed_bytes"] for t in transfers])
        move_tokens.extend(t["pushed_tokens"] for t in transfers)
        bytes_total.append(sum(t["pushed_bytes"] for t in transfers))
        for d in moved:
            if d.get("peer_leg_s") is not None and d.get("ttft_s") is not None:
                legs.append(d["peer_leg_s"])
                after.append(d["ttft_s"] - d["peer_leg_s"])
        puts.append(metric_sum(rep, "kvfabric_transport_put_bytes_total"))
        gets.append(metric_sum(rep, "kvfabric_transport_get_bytes_total"))
    cells = [name, str(len(reps))]
    for groups in (ttft_all, ttft_moved):
        pooled = [v for g in groups for v in g]
        for q in QUANTILES:
            stat = lambda v, q=q: quantile(v, q)  # noqa: E731
            cells.append(fmt(stat(pooled), bootstrap(groups, stat, resamples, rng)))
    pooled_bytes = [v for g in move_bytes for v in g]
    mean = statistics.fmean(pooled_bytes) if pooled_bytes else float("nan")
    cells.append(f"{statistics.fmean(moves):.1f}")
    cells.append(fmt(mean, bootstrap(move_bytes, statistics.fmean, resamples, rng), 0))
    cells.append(f"{statistics.fmean(move_tokens):.0f}" if move_tokens else "-")
    cells.append(f"{statistics.fmean(bytes_total):.0f}")
    cells.append(f"{statistics.median(legs):.3f}" if legs else "-")
    cells.append(f"{statistics.median(after):.3f}" if after else "-")
    cells.append(f"{statistics.fmean(puts):.0f} / {statistics.fmean(gets):.0f}")
    return "| " + " | ".join(cells) + " |"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=pathlib.Path, help="kvf-experiment result dirs")
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=1, help="bootstrap seed")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    print("| arm | reps | TTFT p50 | TTFT p90 | TTFT p99 | moved TTFT p50 | moved TTFT p90 | "
          "moved TTFT p99 | moves/rep | bytes/move | tokens/move | bytes/rep | first leg p50 s | "
          "after the leg p50 s | put / get bytes per rep |")
    print("|---" * 15 + "|")
    for d in args.dirs:
        arms_dir = d / "arms"
        if not arms_dir.is_dir():
            sys.exit(f"{d}: no arms/ folder (not a kvf-experiment result directory)")
        for arm in sorted(p for p in arms_dir.iterdir() if p.is_dir()):
            reps = sorted(r for r in arm.glob("rep*") if (r / "DONE").exists())
            if reps:
                print(arm_row(arm.name, reps, args.resamples, rng))


if __name__ == "__main__":
    main()
