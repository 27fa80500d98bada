#!/usr/bin/python3
"""Replays vLLM's KV-event stream fixture through real ZMQ into kvf-router and compares the
router's predicted cached tokens with what the engines report (the goal: 0 tokens of error).

Usage: vllm_stream_replay.py --router BIN [--stream DIR] [--json OUT] [--router_joins_late]

The publishers are written here in Python from the fixture bytes (tests/fixtures/vllm/
kv_events/stream/frames.jsonl: every [topic, seq, payload] message two vLLM v0.24 engines
published), never by kvfabric: one ZMQ PUB per engine with vLLM's replay socket (ROUTER, v0.25
framing), and a minimal HTTP face per engine (/health, and /metrics with
vllm:cache_config_info so the router learns each engine's KV capacity). kvf-router runs on its
defaults plus the instance list and the LoRA adapters. Each publisher is an XPUB socket (on the
wire a PUB to the router's SUB) so that it can hold its first frame until the router's
subscription has arrived: a PUB drops what it sends before then, and a router that joins a
silent stream late only learns the missed batches on the next one, which this fixture never
sends. With --router_joins_late the first checkpoint's frames are all published before the
router starts (nobody hears them): the router must learn them from the replay sockets on first
contact. At each checkpoint of expected.json the
frames published before it are sent, the router is polled until it applied them, and every
follow-up request goes to POST /admin/match; its prediction per engine is compared with the
cached tokens vLLM's own prefix-cache rules give (vllm_prefix_cache.py). Exit 0 when every
prediction is exact; prints one JSON summary line (and writes it to --json).
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

import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_STREAM = os.path.join(HERE, "..", "fixtures", "vllm", "kv_events", "stream")
TOKEN = "replay-token"
DEADLINE_S = 60


class Engine:
    """One engine's publisher: PUB + replay ROUTER + a tiny HTTP face."""

    def __init__(self, ctx, name, num_gpu_blocks):
        self.name = name
        # XPUB: PUB on the wire, but the router's subscription is visible (wait_subscribed).
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.SNDHWM, 0)
        self.subscribed = False
        self.pub_port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.replay = ctx.socket(zmq.ROUTER)
        self.replay_port = self.replay.bind_to_random_port("tcp://127.0.0.1")
        self.sent = []  # (topic, seq, payload) as published, for replay
        self.lock = threading.Lock()
        metrics = ('vllm:cache_config_info{block_size="16",num_gpu_blocks="%d"} 1.0\n'
                   "vllm:num_requests_waiting 0.0\n" % num_gpu_blocks).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = metrics if self.path == "/metrics" else b"{}"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def wait_subscribed(self, deadline):
        while not self.subscribed:
            if time.time() > deadline:
                raise SystemExit("kvf-router never subscribed to %s's events" % self.name)
            if self.pub.poll(50):
                self.subscribed = self.pub.recv()[:1] == b"\x01"

    def publish(self, topic, seq, payload):
        with self.lock:
            self.sent.append((topic, seq, payload))
        self.pub.send_multipart([topic, seq, payload])

    def serve_replay(self, stop):
        # vLLM v0.25: one (topic, seq, payload) per buffered batch from the asked seq, then
        # (b"", -1, b""). Runs on its own thread (the only user of the replay socket) from before
        # the router starts, so no request waits on the test's main loop.
        while not stop.is_set():
            if self.replay.poll(50):
                self.answer_replay()

    def answer_replay(self):
        frames = self.replay.recv_multipart()
        if len(frames) < 2 or len(frames[-1]) != 8:
            return
        start = struct.unpack(">Q", frames[-1])[0]
        head = frames[:-1]
        with self.lock:
            batches = [b for b in self.sent if struct.unpack(">Q", b[1])[0] >= start]
        for topic, seq, payload in batches:
            self.replay.send_multipart(head + [topic, seq, payload])
        self.replay.send_multipart(head + [b"", struct.pack(">Q", 2**64 - 1), b""])


def admin(port, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=data, method=method,
                                 headers={"Authorization": "Bearer " + TOKEN,
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise SystemExit("%s %s: HTTP %d %s" % (method, path, e.code, e.read().decode()))


def wait_applied(port, want_last_seq):
    deadline = time.time() + DEADLINE_S
    while time.time() < deadline:
        ok = True
        for inst in admin(port, "GET", "/admin/instances")["instances"]:
            want = want_last_seq.get(inst["id"])
            kv = inst["kv_events"]
            if want is not None and (kv["batches"] == 0 or kv["last_seq"][0] != want):
                ok = False
        if ok:
            return
        time.sleep(0.02)
    raise SystemExit("router did not apply the published batches in %d s" % DEADLINE_S)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--router", required=True, help="the kvf-router binary")
    ap.add_argument("--stream", default=DEFAULT_STREAM, help="the stream fixture folder")
    ap.add_argument("--json", help="also write the summary here")
    ap.add_argument("--router_joins_late", action="store_true",
                    help="publish the first checkpoint's frames before the router starts")
    args = ap.parse_args()

    expected = json.load(open(os.path.join(args.stream, "expected.json")))
    frames = [json.loads(l) for l in open(os.path.join(args.stream, "frames.jsonl"))]
    ctx = zmq.Context()
    engines = {name: Engine(ctx, name, e["num_gpu_blocks"])
               for name, e in expected["engines"].items()}
    base = expected["base_model"]
    adapters = [a["name"] for a in expected["lora_adapters"]]

    tmp = tempfile.mkdtemp(prefix="kvf-replay-")
    config = os.path.join(tmp, "router.yaml")
    with open(config, "w") as f:
        f.write("listen: {host: 127.0.0.1, port: 0}\nadmin: {token: %s}\n" % TOKEN)
        f.write("lora_adapters: [%s]\ninstances:\n" % ", ".join(adapters))
        for name, e in engines.items():
            f.write("  - {id: %s, url: 'http://127.0.0.1:%d', kv_events: {endpoint: "
                    "'tcp://127.0.0.1:%d', replay_endpoint: 'tcp://127.0.0.1:%d'}}\n"
                    % (name, e.http.server_port, e.pub_port, e.replay_port))
    published = {name: 0 for name in engines}
    next_frame = 0

    def publish_until(want, wait_for_router):
        nonlocal next_frame
        while next_frame < len(frames) and any(published[n] < want[n] for n in want):
            fr = frames[next_frame]
            next_frame += 1
            if wait_for_router:
                engines[fr["engine"]].wait_subscribed(time.time() + DEADLINE_S)
            engines[fr["engine"]].publish(bytes.fromhex(fr["topic_hex"]),
                                          bytes.fromhex(fr["seq_hex"]),
                                          bytes.fromhex(fr["payload_hex"]))
            published[fr["engine"]] += 1

    stop = threading.Event()
    for e in engines.values():
        threading.Thread(target=e.serve_replay, args=(stop,), daemon=True).start()
    if args.router_joins_late:
        publish_until(expected["checkpoints"][0]["frames_published"], False)
    ready = os.path.join(tmp, "ready")
    router = subprocess.Popen([args.router, "--config", config, "--ready_file", ready,
                               "--log_level", "warn"])
    results = []
    try:
        deadline = time.time() + DEADLINE_S
        while not os.path.exists(ready):
            if router.poll() is not None or time.time() > deadline:
                raise SystemExit("kvf-router did not start")
            time.sleep(0.02)
        port = int(open(ready).read().split()[0])

        for checkpoint in expected["checkpoints"]:
            publish_until(checkpoint["frames_published"], True)
            wait_applied(port, {n: c - 1 for n, c in published.items() if c > 0})
            for f in checkpoint["followups"]:
                body = {"model": f["model"], "prompt": f["prompt_token_ids"]}
                if f["cache_salt"]:
                    body["cache_salt"] = f["cache_salt"]
                got = admin(port, "POST", "/admin/match", body)["instances"]
                for name, want_tokens in f["expected_cached_tokens"].items():
                    predicted = got[name]["predicted_cached_tokens"]
                    results.append({"checkpoint": checkpoint["after_request"],
                                    "request": f["name"], "engine": name,
                                    "expected": want_tokens, "predicted": predicted,
                                    "error": predicted - want_tokens})
    finally:
        router.terminate()
        router.wait(timeout=10)
        stop.set()
    wrong = [r for r in results if r["error"] != 0]
    summary = {"predictions": len(results), "exact": len(results) - len(wrong),
               "abs_error_tokens_total": sum(abs(r["error"]) for r in results),
               "max_abs_error_tokens": max([abs(r["error"]) for r in results] or [0]),
               "expected_cached_tokens_total": sum(r["expected"] for r in results),
               "base_model": base, "wrong": wrong}
    line = json.dumps(summary)
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    return 0 if results and not wrong else 1


if __name__ == "__main__":
    sys.exit(main())
