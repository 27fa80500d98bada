#!/usr/bin/python3
"""Where two runs of the same trace slice part ways: two repetition folders (live `kvf-experiment
run` or `sim`, e.g. DIR/arms/hybrid/rep0) of one experiment, compared request by request in the
order the first run sent them. Prints the first request routed to a different instance (with
both routers' per-instance scores at that decision), the cluster hit ratio and its host-memory /
disk share before and after that request in each run, the sessions whose host share moved most,
and per engine whether the requests' host-memory tokens add up to the blocks the engine's tiers
onboarded (kvfabric_tier_onboarded_blocks_total, engine_N.metrics minus engine_N.before.prom).

  /usr/bin/python3 experiments/report/live_divergence.py REP_A REP_B [--block-size 16]
"""
import argparse
import collections
import json
import os
import re
import sys


def load_results(rep):
    rows = {}
    path = os.path.join(rep, "results.jsonl")
    if not os.path.exists(path):
        sys.exit(f"{rep}: no results.jsonl (give a repetition folder, e.g. DIR/arms/ARM/rep0)")
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{rep}/results.jsonl line {line_no}: {e}")
            rows[r["request_id"]] = r
    return rows


def load_scores(rep):
    """Per session, the routers' score maps in decision order (decisions.jsonl has no trace id)."""
    path = os.path.join(rep, "decisions.jsonl")
    out = collections.defaultdict(list)
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                if d.get("attempt", 1) == 1:  # a retry is not a turn of its own
                    out[d.get("session")].append(d.get("scores"))
    return out


def onboarded_host(rep, engine):
    def read(name):
        path = os.path.join(rep, name)
        if not os.path.exists(path):
            return None
        with open(path) as f:
            m = re.search(r'^kvfabric_tier_onboarded_blocks_total\{tier="host"\} (\S+)$', f.read(),
                          re.M)
        return float(m.group(1)) if m else None

    after = read(f"engine_{engine}.metrics")
    before = read(f"engine_{engine}.before.prom") or 0.0
    return None if after is None else after - before


def shares(rows, keys):
    prompt = sum(rows[k]["prompt_tokens"] for k in keys)
    if prompt == 0:
        return "no requests"
    cached = sum(rows[k]["cached_tokens"] for k in keys)
    cpu = sum(rows[k].get("cpu_cached_tokens", 0) for k in keys)
    disk = sum(rows[k].get("disk_cached_tokens", 0) for k in keys)
    return (f"{len(keys)} requests, hit {100 * cached / prompt:.2f}% (GPU "
            f"{100 * (cached - cpu - disk) / prompt:.2f} / host {100 * cpu / prompt:.2f} / disk "
            f"{100 * disk / prompt:.2f})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rep_a")
    ap.add_argument("rep_b")
    ap.add_argument("--block-size", type=int, default=16, help="tokens per engine KV block")
    args = ap.parse_args()
    a, b = load_results(args.rep_a), load_results(args.rep_b)
    common = [k for k in a if k in b and a[k].get("ok") and b[k].get("ok")]
    if not common:
        sys.exit("the two runs share no successful request")
    order = sorted(common, key=lambda k: (a[k]["sent_s"], k))
    first = next((i for i, k in enumerate(order) if a[k]["instance"] != b[k]["instance"]), None)
    print(f"A: {args.rep_a}\nB: {args.rep_b}\n{len(order)} requests in both, in A's send order")
    if first is None:
        print("every request went to the same instance in both runs")
    else:
        k = order[first]
        print(f"first routed differently: #{first} {k} (A sent {a[k]['sent_s']:.3f} s -> "
              f"instance {a[k]['instance']}, B sent {b[k]['sent_s']:.3f} s -> {b[k]['instance']})")
        session, turn = a[k]["session_id"], a[k].get("turn")
        for name, rep in (("A", args.rep_a), ("B", args.rep_b)):
            scores = load_scores(rep).get(session, [])
            if turn is not None and 0 < turn <= len(scores):
                print(f"  {name}'s scores at that decision: {scores[turn - 1]}")
        # Requests sent just before it, where a few milliseconds decide what the router saw.
        for j in range(max(0, first - 3), first):
            p = order[j]
            print(f"  before it: {p} on {a[p]['instance']}: A sent {a[p]['sent_s']:.3f} s, "
                  f"B sent {b[p]['sent_s']:.3f} s")
    cut = len(order) if first is None else first
    for name, rows in (("A", a), ("B", b)):
        print(f"{name} before: {shares(rows, order[:cut])}")
        print(f"{name} after:  {shares(rows, order[cut:])}")

    moved = collections.Counter()
    for k in order:
        moved[a[k]["session_id"]] += b[k].get("cpu_cached_tokens", 0) - a[k].get(
            "cpu_cached_tokens", 0)
    print("sessions whose host-memory tokens moved most (B - A):")
    for session, d in sorted(moved.items(), key=lambda kv: -abs(kv[1]))[:8]:
        engines_a = sorted({a[k]["instance"] for k in order if a[k]["session_id"] == session})
        engines_b = sorted({b[k]["instance"] for k in order if b[k]["session_id"] == session})
        print(f"  {session}: {d:+d} tokens, instances A {engines_a} B {engines_b}")

    print("per engine: host tokens / block size against the tiers' host onboards")
    for name, rows, rep in (("A", a, args.rep_a), ("B", b, args.rep_b)):
        per = collections.Counter()
        for r in rows.values():
            if r.get("ok"):
                per[r["instance"]] += r.get("cpu_cached_tokens", 0)
        for engine in sorted(per, key=lambda e: int(e) if e.isdigit() else e):
            counted = onboarded_host(rep, engine)
            counted_s = "n/a" if counted is None else f"{counted:.0f}"
            print(f"  {name} engine {engine}: {per[engine] / args.block_size:.0f} blocks in the "
                  f"results, {counted_s} onboarded")


if __name__ == "__main__":
    main()
