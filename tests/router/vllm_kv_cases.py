#!/usr/bin/python3
"""kvf-router against publishers that behave like stock vLLM, one case per instance.

Usage: vllm_kv_cases.py --router BIN     (exit 0: every case holds; each failure printed)

Publishers are Python (pyzmq + msgpack) sending the fixture bytes of
tests/fixtures/vllm/kv_events (an encoder of vLLM's structs we did not write) or batches
encoded here, over real ZMQ; each instance has a minimal HTTP face (/health, /metrics,
/v1/completions). The router is observed through its admin API and /metrics only:
- hybrid KV cache groups (g6, g7): only the full-attention group is indexed, and another
  group's removal of a shared hash does not erase it;
- tiers (g3 OffloadingConnector, g9 STORAGE): kept per medium and shown, not GPU hits;
- a prefix offloaded to CPU (OffloadingConnector's hash-only BlockStored, medium "CPU") and
  then evicted from the GPU is credited by the policy: the decision log shows the CPU run;
- LoRA (g4): an adapter's blocks match requests for that adapter only;
- unknown fields and event types: skipped and counted, the batch kept;
- data parallelism: two ranks on port and port + 1, one stream each: a removal or a restart
  on one rank leaves what the other holds;
- re-admission after an ejection empties the instance's index at once;
- a subscribed instance that serves requests while its stream is silent is flagged (admin,
  kvfabric_router_kv_events_state, log).
"""
import argparse
import http.server
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import msgpack
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures", "vllm", "kv_events")
TOKEN = "cases-token"
DEADLINE_S = 20
ctx = zmq.Context()
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def fixture(name):
    with open(os.path.join(FIXTURES, name + ".bin"), "rb") as f:
        return f.read()


def fixture_tokens(name, event=0):
    with open(os.path.join(FIXTURES, name + ".json")) as f:
        return json.load(f)["events"][event]["token_ids"]


class Face:
    """An engine's HTTP side: health that can be switched off, metrics, completions."""

    def __init__(self):
        self.healthy = True
        face = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def reply(self, code, body):
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/health":
                    self.reply(200 if face.healthy else 503, b"{}")
                else:
                    self.reply(200, b"vllm:num_requests_waiting 0.0\n")

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.reply(200, json.dumps({
                    "id": "cmpl-1", "object": "text_completion", "model": "m",
                    "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 40, "completion_tokens": 1, "total_tokens": 41,
                              "prompt_tokens_details": {"cached_tokens": 0}}}).encode())

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = "http://127.0.0.1:%d" % self.server.server_port


class Publisher:
    """vLLM's PUB side for `ranks` data-parallel ranks on consecutive ports."""

    def __init__(self, ranks=1):
        for _ in range(100):
            first = ctx.socket(zmq.PUB)
            self.port = first.bind_to_random_port("tcp://127.0.0.1", 20000, 60000)
            self.socks = [first]
            try:
                for r in range(1, ranks):
                    s = ctx.socket(zmq.PUB)
                    s.bind("tcp://127.0.0.1:%d" % (self.port + r))
                    self.socks.append(s)
                break
            except zmq.ZMQError:
                for s in self.socks:
                    s.close(0)
        self.seq = [0] * ranks

    def send(self, payload, rank=0):
        self.socks[rank].send_multipart([b"", struct.pack(">Q", self.seq[rank]), payload])
        self.seq[rank] += 1


def batch(events, rank=0):
    return msgpack.packb([time.time(), events, rank], use_bin_type=True)


def stored(hashes, tokens, parent=None):
    return ["BlockStored", hashes, parent, tokens, 16, None, "GPU"]


class Router:
    def __init__(self, binary, instances, extra=""):
        self.tmp = tempfile.mkdtemp(prefix="kvf-cases-")
        config = os.path.join(self.tmp, "router.yaml")
        with open(config, "w") as f:
            f.write("listen: {host: 127.0.0.1, port: 0}\nadmin: {token: %s}\n" % TOKEN)
            f.write("lora_adapters: [sql-lora, chat-lora]\n")
            f.write("health: {interval_s: 0.1, timeout_s: 1, unhealthy_threshold: 1}\n")
            f.write(extra + "instances:\n")
            for inst in instances:
                f.write("  - " + json.dumps(inst) + "\n")
        ready = os.path.join(self.tmp, "ready")
        self.proc = subprocess.Popen([binary, "--config", config, "--ready_file", ready,
                                      "--log_level", "warn"])
        deadline = time.time() + DEADLINE_S
        while not os.path.exists(ready):
            if self.proc.poll() is not None or time.time() > deadline:
                raise SystemExit("kvf-router did not start")
            time.sleep(0.02)
        self.port = int(open(ready).read().split()[0])

    def call(self, method, path, body=None, auth=True):
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = "Bearer " + TOKEN
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), data=data,
                                     method=method, headers=headers)
        with urllib.request.urlopen(req, timeout=10) as r:
            raw = r.read()
        return json.loads(raw) if path != "/metrics" else raw.decode()

    def instance(self, name):
        for inst in self.call("GET", "/admin/instances")["instances"]:
            if inst["id"] == name:
                return inst
        raise KeyError(name)

    def wait(self, what, pred):
        deadline = time.time() + DEADLINE_S
        while time.time() < deadline:
            if pred():
                return True
            time.sleep(0.02)
        check(False, "timed out waiting: " + what)
        return False

    def batches(self, name):
        return self.instance(name)["kv_events"]["batches"]

    def predicted(self, name, model, tokens):
        got = self.call("POST", "/admin/match", {"model": model, "prompt": tokens})
        return got["instances"][name]["predicted_cached_tokens"]

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)


def connect(router, pub, name, ranks=1):
    """Publishes empty batches on every rank until the router has seen one from each (ZMQ's
    slow joiner drops messages sent before the subscription is connected)."""
    for rank in range(ranks):
        before = router.batches(name)
        router.wait("%s rank %d connected" % (name, rank),
                    lambda: (pub.send(batch([], rank), rank) or True)
                    and router.batches(name) > before)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--router", required=True)
    args = ap.parse_args()
    names = ["groups6", "groups7", "tiers", "lora", "unknown", "dp", "tiercpu", "quiet"]
    faces = {n: Face() for n in names}
    pubs = {n: Publisher(2 if n == "dp" else 1) for n in names}
    instances = []
    for n in names:
        kv = {"endpoint": "tcp://127.0.0.1:%d" % pubs[n].port}
        if n == "dp":
            kv["data_parallel_size"] = 2
        instances.append({"id": n, "url": faces[n].url, "kv_events": kv})
    router = Router(args.router, instances, "kv_events: {silent_after_s: 1}\n")
    try:
        for n in names:
            if n != "quiet":
                connect(router, pubs[n], n, 2 if n == "dp" else 1)

        def gpu_after(name, payloads, rank=0):
            before = router.batches(name)
            for p in payloads:
                pubs[name].send(p, rank)
            router.wait(name + " applied", lambda: router.batches(name) >= before + len(payloads))
            return router.instance(name)["kv_events"]

        # g6: the same hashes in groups 0 and 1, removed from group 1: group 0 keeps all four.
        kv = gpu_after("groups6", [fixture("g6_v0.20.0_groups")])
        check(kv["tier_blocks"]["GPU"] == 4, "g6: group 1's removal leaves group 0's 4 blocks "
              "(got %s)" % kv["tier_blocks"])
        toks = fixture_tokens("g6_v0.20.0_groups")
        check(router.predicted("groups6", "base", toks + [1]) == 64, "g6: 64 tokens predicted")
        # g7: group 0 full attention (4 blocks, block 0 later removed), group 1 sliding window
        # stores and removes block 3's hash: 3 blocks stay, none leads.
        kv = gpu_after("groups7", [fixture("g7_v0.22.0_hybrid_groups")])
        check(kv["tier_blocks"]["GPU"] == 3 and kv["indexed_group"] == [0],
              "g7: full-attention group indexed, 3 blocks (got %s, group %s)"
              % (kv["tier_blocks"], kv["indexed_group"]))
        # Tiers: CPU placeholders (stored then removed), STORAGE (2 stored, 1 removed).
        kv = gpu_after("tiers", [fixture("g3_v0.11.0_cpu_offload"),
                                 fixture("g9_main_storage_locality")])
        check(kv["tier_blocks"].get("GPU") == 4 and kv["tier_blocks"].get("CPU") == 0
              and kv["tier_blocks"].get("STORAGE") == 1,
              "tiers kept per medium: GPU 4, CPU 0, STORAGE 1 (got %s)" % kv["tier_blocks"])
        metrics = router.call("GET", "/metrics")
        check('kvfabric_router_instance_tier_blocks{instance="tiers",medium="STORAGE"} 1'
              in metrics, "tier blocks exported per medium")
        # LoRA: the adapter's blocks 0-1 (block 1 later removed) and a base-model block 0 with
        # the same tokens.
        gpu_after("lora", [fixture("g4_v0.14.0_lora_name")])
        toks = fixture_tokens("g4_v0.14.0_lora_name")
        check(router.predicted("lora", "sql-lora", toks[:32] + [1]) == 16,
              "LoRA: the adapter's block 0 hits for the adapter")
        check(router.predicted("lora", "base", toks[:32] + [1]) == 16,
              "LoRA: the base model's own copy of block 0 hits for the base model")
        check(router.predicted("lora", "chat-lora", toks[:32] + [1]) == 0,
              "LoRA: another adapter hits nothing")
        # Unknown fields and event types: skipped and counted, the known events applied.
        kv = gpu_after("unknown", [fixture("unknown_fields_map"),
                                   fixture("unknown_event_type_array")])
        metrics = router.call("GET", "/metrics")
        check('kvfabric_router_kv_events_skipped_total{reason="unknown_field"} 4' in metrics
              and 'kvfabric_router_kv_events_skipped_total{reason="unknown_type"} 1' in metrics,
              "unknown fields (4) and event types (1) counted")
        check(kv["tier_blocks"]["GPU"] > 0, "the rest of those batches applied")
        # Data parallelism: both ranks cache blocks 0-1 under the same hashes.
        toks = list(range(1000, 1032))
        store = batch([stored([11, 12], toks)])
        gpu_after("dp", [store], rank=0)
        gpu_after("dp", [store], rank=1)
        gpu_after("dp", [batch([["BlockRemoved", [12], "GPU"]])], rank=0)
        check(router.predicted("dp", "base", toks + [1]) == 32,
              "DP: rank 0's removal leaves rank 1's copy")
        pubs["dp"].seq[1] = 0  # rank 1 restarts: its stream begins again at seq 0
        gpu_after("dp", [batch([["AllBlocksCleared"]], 1)], rank=1)
        check(router.predicted("dp", "base", toks + [1]) == 16,
              "DP: rank 1's restart leaves rank 0's block 0 (got %d)"
              % router.predicted("dp", "base", toks + [1]))
        # A prefix cached on the GPU, offloaded to CPU as vLLM's OffloadingConnector reports it
        # (array layout in vLLM's field order: block_hashes, parent_block_hash, token_ids,
        # block_size, lora_id, medium; hashes only), then evicted from the GPU: only the CPU
        # copy is left, and the policy credits it.
        toks = list(range(5000, 5128))
        hashes = [71, 72, 73, 74, 75, 76, 77, 78]
        gpu_after("tiercpu", [batch([stored(hashes, toks)]),
                              batch([["BlockStored", hashes, None, [], 16, None, "CPU"]]),
                              batch([["BlockRemoved", hashes, "GPU"]])])
        kv = router.instance("tiercpu")["kv_events"]
        check(kv["tier_blocks"].get("GPU") == 0 and kv["tier_blocks"].get("CPU") == 8
              and kv["tier_unresolved_blocks"] == 0,
              "CPU offload placed on the prompt's chain: GPU 0, CPU 8 (got %s, unresolved %s)"
              % (kv["tier_blocks"], kv["tier_unresolved_blocks"]))
        router.call("POST", "/v1/completions", {"model": "base", "prompt": toks + [1],
                                                "max_tokens": 1}, auth=False)
        last = router.call("GET", "/admin/decisions")["decisions"][-1]
        tier = last.get("tier_tokens") or {}
        check(last["instance"] == "tiercpu" and last["reason"] == "cache_gate"
              and tier.get("CPU") == 128 and 0 < tier.get("credited", 0) < 128,
              "the CPU run is credited in the decision (got %s, %s, %s)"
              % (last["instance"], last["reason"], tier))
        # Re-admission after an ejection: the index starts empty at once.
        faces["lora"].healthy = False
        router.wait("lora ejected", lambda: not router.instance("lora")["admitted"])
        faces["lora"].healthy = True
        router.wait("lora re-admitted", lambda: router.instance("lora")["admitted"])
        kv = router.instance("lora")["kv_events"]
        check(kv["tier_blocks"]["GPU"] == 0 and kv["last_reset"] == "readmitted",
              "re-admission empties the index (got %s, %s)" % (kv["tier_blocks"], kv["last_reset"]))
        # A subscribed instance serving traffic with a silent stream is flagged.
        for n in names:
            if n != "quiet":
                router.call("POST", "/admin/instances/%s/drain" % n)
        router.call("POST", "/v1/completions", {"model": "base", "prompt": list(range(40)),
                                                "max_tokens": 1}, auth=False)
        router.wait("quiet flagged silent",
                    lambda: router.instance("quiet")["kv_events"]["events_silent"])
        metrics = router.call("GET", "/metrics")
        check('kvfabric_router_kv_events_state{instance="quiet",state="silent"} 1' in metrics,
              "silent state exported")
    finally:
        router.close()
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
