#!/usr/bin/python3
"""Independent KV-event subscriber for engine_kv_events_test (python3-zmq + python3-msgpack).

Drives a running kvf-engine over HTTP, decodes its live PUB stream and its replay socket, and
checks vLLM's wire format: [topic, seq(8B BE), msgpack [ts, [events]]], BlockStored /
BlockRemoved / AllBlocksCleared layouts, consecutive sequence numbers, seq 0 = AllBlocksCleared,
replay = live bytes, end marker -1. Exits 0 on success, 1 with a message otherwise.
Usage: engine_kv_events_subscriber.py HTTP_PORT PUB_ENDPOINT REPLAY_ENDPOINT BLOCK_SIZE
"""
import json
import sys
import time
import urllib.request

import msgpack
import zmq

TOPIC = b""  # vLLM's default topic (vllm/config/kv_events.py)
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def fail(msg):
    print("FAIL:", msg, flush=True)
    sys.exit(1)


def complete(port, prompt, max_tokens):
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def check_event(ev, block_size):
    if not isinstance(ev, list) or not ev or not isinstance(ev[0], str):
        fail(f"event is not a tagged array: {ev!r}")
    tag = ev[0]
    if tag == "BlockStored":
        if len(ev) != 7:
            fail(f"BlockStored has {len(ev)} fields")
        _, hashes, parent, tokens, bs, lora, medium = ev
        if not hashes or not all(isinstance(h, int) and 0 <= h < 2**64 for h in hashes):
            fail(f"bad block_hashes {hashes!r}")
        if parent is not None and not isinstance(parent, int):
            fail(f"bad parent {parent!r}")
        if bs != block_size or len(tokens) != len(hashes) * block_size:
            fail(f"token_ids {len(tokens)} vs {len(hashes)} blocks of {bs}")
        if lora is not None or medium != "GPU":
            fail(f"lora/medium {lora!r} {medium!r}")
    elif tag == "BlockRemoved":
        if len(ev) != 3 or not ev[1] or ev[2] != "GPU":
            fail(f"bad BlockRemoved {ev!r}")
    elif tag == "AllBlocksCleared":
        if len(ev) != 1:
            fail(f"bad AllBlocksCleared {ev!r}")
    else:
        fail(f"unknown tag {tag!r}")


def decode(payload, block_size):
    batch = msgpack.unpackb(payload, raw=False)
    if not isinstance(batch, list) or len(batch) != 2 or not isinstance(batch[0], float):
        fail(f"EventBatch is not [ts, events]: {batch!r}")
    if abs(batch[0] - time.time()) > 3600:
        fail(f"timestamp {batch[0]} is not seconds since the epoch")
    for ev in batch[1]:
        check_event(ev, block_size)
    return batch[1]


def main():
    port, pub, replay, block_size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
    sub.connect(pub)
    live = {}  # seq -> payload

    def drain(timeout_ms):
        got = 0
        while sub.poll(timeout_ms):
            parts = sub.recv_multipart()
            if len(parts) != 3 or parts[0] != TOPIC or len(parts[1]) != 8:
                fail(f"bad multipart frame layout: {[len(p) for p in parts]}")
            live[int.from_bytes(parts[1], "big")] = parts[2]
            got += 1
            timeout_ms = 200
        return got

    # Slow joiner: send small unique requests until the subscription delivers something.
    deadline = time.time() + 20
    salt = 0
    while not live:
        if time.time() > deadline:
            fail("no live event within 20 s")
        salt += 1
        complete(port, [50000 + salt * 100 + i for i in range(block_size)], 1)
        drain(300)

    # A: 4 full blocks. Its stored tokens must be exactly the prompt.
    prompt_a = [1000 + i for i in range(4 * block_size)]
    r = complete(port, prompt_a, 2)
    if r["usage"]["prompt_tokens_details"]["cached_tokens"] != 0:
        fail("first request reported cached tokens")
    r2 = complete(port, prompt_a, 2)
    if r2["usage"]["prompt_tokens_details"]["cached_tokens"] != 3 * block_size:
        fail(f"repeat cached_tokens {r2['usage']}")
    drain(500)
    stored, removed = {}, []
    for seq in sorted(live):
        for ev in decode(live[seq], block_size):
            if ev[0] == "BlockStored":
                for i, h in enumerate(ev[1]):
                    stored[h] = ev[3][i * block_size:(i + 1) * block_size]
            elif ev[0] == "BlockRemoved":
                removed.extend(ev[1])
    a_blocks = [h for h, toks in stored.items() if toks and toks[0] >= 1000 and toks[0] < 2000]
    if len(a_blocks) != 4:
        fail(f"expected 4 stored blocks for prompt A, got {len(a_blocks)}")
    got_tokens = sorted(t for h in a_blocks for t in stored[h])
    if got_tokens != prompt_a:
        fail("BlockStored token_ids do not match prompt A")

    # B: larger than the free pool, so A's cached blocks get evicted.
    prompt_b = [20000 + i for i in range(18 * block_size)]
    complete(port, prompt_b, 2)
    drain(500)
    for seq in sorted(live):
        for ev in decode(live[seq], block_size):
            if ev[0] == "BlockRemoved":
                removed.extend(ev[1])
    removed_a = set(removed) & set(a_blocks)
    if not removed_a:
        fail("no BlockRemoved for prompt A's blocks after pressure")
    unknown = set(removed) - set(stored) - set()
    # Removed hashes must have been stored before (blocks stored before we subscribed aside).
    seqs = sorted(live)
    if seqs != list(range(seqs[0], seqs[-1] + 1)):
        fail(f"live sequence numbers are not consecutive: {seqs}")

    # Replay from 0: every batch, seq 0 first = [AllBlocksCleared], same bytes as live, end -1.
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(replay)
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    replayed = {}
    while True:
        if not dealer.poll(10000):
            fail("replay timed out")
        parts = dealer.recv_multipart()
        if len(parts) != 3 or parts[0] != b"":
            fail(f"bad replay frame layout {[len(p) for p in parts]}")
        if parts[1] == END_SEQ:
            if parts[2] != b"":
                fail("end marker has a payload")
            break
        replayed[int.from_bytes(parts[1], "big")] = parts[2]
    rs = sorted(replayed)
    if not rs or rs[0] != 0 or rs != list(range(0, rs[-1] + 1)):
        fail(f"replay sequence {rs[:5]}...")
    first = decode(replayed[0], block_size)
    if first != [["AllBlocksCleared"]]:
        fail(f"seq 0 is {first!r}")
    for seq, payload in live.items():
        if replayed.get(seq) != payload:
            fail(f"replayed seq {seq} differs from the live batch")
    # Every removed hash was announced as stored first (in the full replayed history).
    all_stored = set()
    for seq in rs:
        for ev in decode(replayed[seq], block_size):
            if ev[0] == "BlockStored":
                all_stored.update(ev[1])
            elif ev[0] == "BlockRemoved":
                for h in ev[1]:
                    if h not in all_stored:
                        fail(f"BlockRemoved for never-stored hash {h}")
                    all_stored.discard(h)
    del unknown
    print(f"OK live={len(live)} replayed={len(replayed)} stored_a=4 removed_a={len(removed_a)}",
          flush=True)


if __name__ == "__main__":
    main()
