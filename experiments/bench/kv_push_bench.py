#!/usr/bin/python3
"""KV push TTFT benchmark: a turn-2 request (prefix + new suffix) served with the
prefix (a) in the engine's local cache, (b) pushed from a peer that holds it, (c) recomputed.

Starts two kvf-engine processes (C holds the prefix, D receives) from engine/configs/engine.yaml
(qwen3-coder-30b-a3b on H20, link 200 Gbps / 50 us from the profile) with worker ports on
127.0.0.1, at time_scale 1 so wall time is modelled time. For each prefix size and repetition:
warm C with the prefix (turn 1), send turn 2 to D with kv_transfer_params.source = C (pushed),
then to C (local), then a never-seen prompt of the same size to D (recomputed). TTFT is the
engine's modelled TTFT (vllm:time_to_first_token_seconds_sum delta) and the client's wall time to
the first streamed token. Prints a Markdown table. Run with Debian's /usr/bin/python3.

Usage: experiments/bench/kv_push_bench.py [--sizes 4000,25000,100000] [--suffix 2048]
       [--reps 3] [--layerwise true|false] [--bin build/bin]
"""
import argparse
import http.client
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(tmp, layerwise):
    src = os.path.join(ROOT, "engine/configs/engine.yaml")
    text = open(src).read()
    profile = os.path.join(ROOT, "engine/profiles/qwen3-coder-30b-a3b-h20.yaml")
    text = re.sub(r"^profile:.*$", "profile: " + profile, text, flags=re.M)
    text = re.sub(r"^kv_events:\n(  .*\n)*", "kv_events: {enabled: false}\n", text, flags=re.M)
    # The bench plays the router and sends kv_transfer_params straight to the engines, unsigned:
    # insecure workers accept them (loopback only; docs/security.md).
    text += "worker: {insecure: true, layerwise: %s}\n" % ("true" if layerwise else "false")
    path = os.path.join(tmp, "engine.yaml")
    open(path, "w").write(text)
    return path


class Engine:
    def __init__(self, binary, config, name, tmp):
        self.port, self.worker_port = free_port(), free_port()
        self.log = os.path.join(tmp, name + ".log")
        self.proc = subprocess.Popen(
            [binary, "--config", config, "--port", str(self.port), "--instance_id", name,
             "--worker_port", str(self.worker_port), "--time_scale", "1"],
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
            env={k: v for k, v in os.environ.items() if k != "KVF_WORKER_TOKEN"})
        deadline = time.time() + 30
        while "kvf-engine ready" not in open(self.log).read():
            if time.time() > deadline or self.proc.poll() is not None:
                sys.exit("engine %s did not start:\n%s" % (name, open(self.log).read()))
            time.sleep(0.05)
        self.worker_url = "http://127.0.0.1:%d" % self.worker_port

    def stop(self):
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def ttft_sum(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        m = re.search(r"^vllm:time_to_first_token_seconds_sum\{[^}]*\} (\S+)$", text, re.M)
        return float(m.group(1))

    def complete(self, prompt, extra=None):
        """Streams a completion; returns (wall TTFT, modelled TTFT, final chunk)."""
        body = {"prompt": prompt, "max_tokens": 2, "stream": True}
        if extra:
            body.update(extra)
        before = self.ttft_sum()
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        t0 = time.perf_counter()
        c.request("POST", "/v1/completions", json.dumps(body),
                  {"Content-Type": "application/json"})
        resp = c.getresponse()
        first, last = None, None
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if first is None:
                first = time.perf_counter() - t0
            last = json.loads(line[6:])
        modelled = self.ttft_sum() - before
        return first, modelled, last


def tokens(n, salt):
    return [1000 + (i * 7 + salt * 7919) % 140000 for i in range(n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="4000,25000,100000")
    ap.add_argument("--suffix", type=int, default=2048, help="new tokens of turn 2")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--layerwise", default="true")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/bin"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kvf_push_bench.")
    config = write_config(tmp, args.layerwise == "true")
    binary = os.path.join(args.bin, "kvf-engine")
    c = Engine(binary, config, "C", tmp)
    d = Engine(binary, config, "D", tmp)
    rows = []
    salt = 1
    try:
        for size in [int(s) for s in args.sizes.split(",")]:
            res = {"local": [], "pushed": [], "recomputed": [], "wall_local": [],
                   "wall_pushed": [], "wall_recomputed": []}
            for rep in range(args.reps):
                salt += 1
                prefix = tokens(size, salt)
                turn2 = prefix + tokens(args.suffix, salt + 100000)
                c.complete(prefix)  # turn 1 on C: the prefix is now cached there
                w, m, last = d.complete(turn2, {"kv_transfer_params": {"source": c.worker_url}})
                kv = last.get("kv_transfer_result", {})
                if kv.get("status") not in ("ok", "partial"):
                    sys.exit("push failed: %s" % kv)
                res["pushed"].append(m)
                res["wall_pushed"].append(w)
                w, m, _ = c.complete(turn2)
                res["local"].append(m)
                res["wall_local"].append(w)
                salt += 1
                cold = tokens(size, salt) + tokens(args.suffix, salt + 100000)
                w, m, _ = d.complete(cold)
                res["recomputed"].append(m)
                res["wall_recomputed"].append(w)
                print("size %d rep %d: local %.4f pushed %.4f (%s tokens) recomputed %.4f" %
                      (size, rep, res["local"][-1], res["pushed"][-1], kv.get("pushed_tokens"),
                       res["recomputed"][-1]), file=sys.stderr, flush=True)
            med = {k: statistics.median(v) for k, v in res.items()}
            rows.append((size, med))
    finally:
        c.stop()
        d.stop()
    print("| prefix tokens | local TTFT s | pushed TTFT s | pushed / local | recomputed TTFT s |"
          " wall (local / pushed / recomputed) s |")
    print("|---:|---:|---:|---:|---:|---|")
    for size, m in rows:
        print("| %d | %.4f | %.4f | %.3fx | %.3f | %.4f / %.4f / %.3f |" %
              (size, m["local"], m["pushed"], m["pushed"] / m["local"], m["recomputed"],
               m["wall_local"], m["wall_pushed"], m["wall_recomputed"]))


if __name__ == "__main__":
    main()
