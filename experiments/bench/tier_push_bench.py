#!/usr/bin/python3
"""Tier push benchmark: holder-side time of a KV push whose prefix the holder serves from its
pool (G1), from its host-memory tier (G2, zero-copy from the pinned slots) or from its disk
tier (G3, read into the bounce region and checked).

Starts three kvf-engine processes from engine/configs/engine.yaml with worker ports on
127.0.0.1 and --payload_kib of payload per block: C1 (a 64-block pool over a host tier that
holds every evicted block), C3 (the same pool over a 1 MiB host tier and a disk tier in a
temporary folder) and D (the receiver). Each repetition, for each tier: a fresh prefix of
--blocks blocks is served on the holder, then pushed out of the pool by fillers (G2: one, so it
sits in host memory; G3: two, so host memory turns over and it sits on disk only), then D asks
for it with kv_transfer_params.source = the holder. The figure is the holder's own time per push
(kvfabric_worker_push_seconds sum / count deltas: pin, disk read, claim, puts, unpin), mean and
95% interval over the repetitions; every push must carry the whole prefix. Prints a Markdown
table. Run with Debian's /usr/bin/python3.

Usage: experiments/bench/tier_push_bench.py [--blocks 48] [--payload_kib 64] [--reps 20]
       [--bin build/bin]
"""
import argparse
import http.client
import math
import os
import re
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kv_push_bench import ROOT, Engine, tokens  # noqa: E402

POOL_BLOCKS = 64
T95 = {5: 2.776, 10: 2.262, 20: 2.093, 30: 2.045}  # two-sided t, n - 1 degrees of freedom


def write_config(tmp, name, cache, tiers):
    text = open(os.path.join(ROOT, "engine/configs/engine.yaml")).read()
    profile = os.path.join(ROOT, "engine/profiles/qwen3-coder-30b-a3b-h20.yaml")
    text = re.sub(r"^profile:.*$", "profile: " + profile, text, flags=re.M)
    text = re.sub(r"^kv_events:\n(  .*\n)*", "kv_events: {enabled: false}\n", text, flags=re.M)
    text = re.sub(r"^cache:\n(  .*\n)*", "", text, flags=re.M)
    text = re.sub(r"^tiers:\n(  .*\n)*", "", text, flags=re.M)
    text += "cache: %s\n" % cache
    if tiers:
        text += "tiers: %s\n" % tiers
    # The bench plays the router and sends kv_transfer_params straight to the engines, unsigned:
    # insecure workers accept them (loopback only; docs/security.md).
    text += "worker: {insecure: true}\n"
    path = os.path.join(tmp, name + ".yaml")
    open(path, "w").write(text)
    return path


def push_seconds(engine):
    c = http.client.HTTPConnection("127.0.0.1", engine.port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    s = re.search(r"^kvfabric_worker_push_seconds_sum(?:\{[^}]*\})? (\S+)$", text, re.M)
    n = re.search(r"^kvfabric_worker_push_seconds_count(?:\{[^}]*\})? (\S+)$", text, re.M)
    return float(s.group(1)), float(n.group(1))


def interval(values):
    mean = statistics.mean(values)
    t = T95.get(len(values), 1.96)
    half = t * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0
    return mean, half


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=48, help="prefix blocks (< the 64-block pool)")
    ap.add_argument("--payload_kib", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/bin"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kvf_tier_push_bench.")
    payload = args.payload_kib * 1024
    cache = "{block_size: 16, num_gpu_blocks: %d, payload_bytes_per_block: %d}"
    host_mib = max(2, 4 * POOL_BLOCKS * max(args.payload_kib, 4) // 1024)
    binary = os.path.join(args.bin, "kvf-engine")
    c1 = Engine(binary, write_config(tmp, "C1", cache % (POOL_BLOCKS, payload),
                                     "{host: {capacity_mib: %d, pin: off}}" % host_mib),
                "C1", tmp)
    c3 = Engine(binary, write_config(
        tmp, "C3", cache % (POOL_BLOCKS, payload),
        "{host: {capacity_mib: 1, pin: off}, disk: {dir: %s, capacity_mib: %d, file_mib: 16}}" %
        (os.path.join(tmp, "disk"), 64 * host_mib)), "C3", tmp)
    d = Engine(binary, write_config(tmp, "D", cache % (2048, payload), None), "D", tmp)
    prefix_tokens = args.blocks * 16
    filler_tokens = POOL_BLOCKS * 16 - 8  # needs the whole pool
    res = {"G1 (pool)": [], "G2 (host memory)": [], "G3 (disk)": []}
    salt = 10
    try:
        for rep in range(args.reps):
            for tier, holder, fillers in (("G1 (pool)", c1, 0), ("G2 (host memory)", c1, 1),
                                          ("G3 (disk)", c3, 2)):
                salt += 10
                prefix = tokens(prefix_tokens, salt)
                holder.complete(prefix)
                for f in range(fillers):
                    holder.complete(tokens(filler_tokens, salt + 1 + f))
                before = push_seconds(holder)
                turn2 = prefix + tokens(64, salt + 5)
                _, _, last = d.complete(turn2, {"kv_transfer_params": {"source": holder.worker_url}})
                after = push_seconds(holder)
                kv = last.get("kv_transfer_result", {})
                if kv.get("pushed_tokens") != prefix_tokens:
                    sys.exit("rep %d %s: pushed %s of %d tokens: %s" %
                             (rep, tier, kv.get("pushed_tokens"), prefix_tokens, kv))
                if after[1] - before[1] != 1:
                    sys.exit("rep %d %s: %d pushes counted" % (rep, tier, after[1] - before[1]))
                res[tier].append(after[0] - before[0])
            print("rep %d: %s" % (rep, ", ".join("%s %.3f ms" % (k, v[-1] * 1e3)
                                                 for k, v in res.items())),
                  file=sys.stderr, flush=True)
    finally:
        for e in (c1, c3, d):
            e.stop()
    base, _ = interval(res["G1 (pool)"])
    mib = args.blocks * payload / 2**20
    print("%d blocks of %d KiB (%.2f MiB) per push, %d repetitions; holder time per push:" %
          (args.blocks, args.payload_kib, mib, args.reps))
    print()
    print("| served from | mean ms | 95% interval ms | median ms | min ms | us per block | vs G1 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for tier, values in res.items():
        mean, half = interval(values)
        print("| %s | %.3f | +/- %.3f | %.3f | %.3f | %.1f | %.2fx |" %
              (tier, mean * 1e3, half * 1e3, statistics.median(values) * 1e3, min(values) * 1e3,
               mean * 1e6 / args.blocks, mean / base))


if __name__ == "__main__":
    main()
