#!/usr/bin/python3
"""Independent vLLM-format KV-event publisher for router_kv_subscriber_test.

Binds a PUB and a ROUTER (replay) socket on 127.0.0.1, prints "<pub_port> <replay_port>",
then follows commands on stdin, one per line:
  probe            publish an empty batch (until the subscriber shows it is connected)
  store <first_token> <blocks> <parent|-> <hash...>   BlockStored, newer map encoding, bytes hashes
  store_array <first_token> <blocks> <parent|-> <hash...>   older array encoding, int hashes
  remove <hash...> BlockRemoved (map encoding, bytes hashes)
  drop             the next batch is buffered for replay but not published (a gap)
  fixture <name>   publish tests/fixtures/vllm/kv_events/<name>.bin as it is (bytes written by
                   the fixtures' own encoder from vLLM's structs)
  garbage          publish a payload that is not msgpack
  seq <n>          the next batch gets sequence number n (0: an engine restart; n > 0 before
                   anything was sent: a late join); answers "ok"
  rank <r>         the following batches go out on data-parallel rank r's socket; answers "ok"
  quit
With --ranks N (argument), N PUB sockets are bound on consecutive ports (rank r on the first
port + r, as vLLM offsets them) and the first port is printed.
Block i of a store holds tokens first_token + 16*i ... + 16*i + 15.
"""
import os
import struct
import sys
import threading
import time

import msgpack
import zmq

BLOCK = 16
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "vllm",
                        "kv_events")
RANKS = int(sys.argv[sys.argv.index("--ranks") + 1]) if "--ranks" in sys.argv else 1
ctx = zmq.Context()


def bind_consecutive(n):
    for _ in range(100):
        first = ctx.socket(zmq.PUB)
        port = first.bind_to_random_port("tcp://127.0.0.1", min_port=20000, max_port=60000)
        socks = [first]
        try:
            for r in range(1, n):
                s = ctx.socket(zmq.PUB)
                s.bind("tcp://127.0.0.1:%d" % (port + r))
                socks.append(s)
            return port, socks
        except zmq.ZMQError:
            for s in socks:
                s.close(0)
    raise SystemExit("no %d consecutive free ports" % n)


pub_port, pubs = bind_consecutive(RANKS)
pub = pubs[0]
router = ctx.socket(zmq.ROUTER)
replay_port = router.bind_to_random_port("tcp://127.0.0.1")
buffer = {}
lock = threading.Lock()
stop = threading.Event()


def as_bytes(h):
    return int(h).to_bytes(32, "big")


def serve_replay():
    while not stop.is_set():
        if not router.poll(20):
            continue
        frames = router.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            continue
        start = struct.unpack(">Q", frames[2])[0]
        with lock:
            for seq in sorted(s for s in buffer if s >= start):
                router.send_multipart([frames[0], b"", struct.pack(">Q", seq), buffer[seq]])
            router.send_multipart([frames[0], b"", struct.pack(">Q", 2**64 - 1), b""])


threading.Thread(target=serve_replay, daemon=True).start()
print(pub_port, replay_port, flush=True)
seq = 0
drop_next = False
deadline = time.time() + 60
for line in sys.stdin:
    if time.time() > deadline:
        break
    words = line.split()
    if not words:
        continue
    cmd = words[0]
    if cmd == "quit":
        break
    if cmd == "drop":
        drop_next = True
        print("ok", flush=True)
        continue
    if cmd == "seq":
        seq = int(words[1])
        print("ok", flush=True)
        continue
    if cmd == "rank":
        pub = pubs[int(words[1])]
        print("ok", flush=True)
        continue
    events = []
    payload = None
    if cmd == "fixture":
        with open(os.path.join(FIXTURES, words[1] + ".bin"), "rb") as f:
            payload = f.read()
    elif cmd == "garbage":
        payload = b"\xc1 not msgpack"

    elif cmd in ("store", "store_array"):
        first, blocks, parent = int(words[1]), int(words[2]), words[3]
        hashes = [int(h) for h in words[4:]]
        tokens = list(range(first, first + BLOCK * blocks))
        if cmd == "store":
            events.append({"type": "BlockStored", "block_hashes": [as_bytes(h) for h in hashes],
                           "parent_block_hash": None if parent == "-" else as_bytes(parent),
                           "token_ids": tokens, "block_size": BLOCK, "lora_id": None,
                           "medium": "GPU"})
        else:
            events.append(["BlockStored", hashes, None if parent == "-" else int(parent),
                           tokens, BLOCK, None, "GPU"])
    elif cmd == "remove":
        events.append({"type": "BlockRemoved",
                       "block_hashes": [as_bytes(h) for h in words[1:]], "medium": "GPU"})
    if payload is None:
        payload = msgpack.packb([time.time(), events, None], use_bin_type=True)
    with lock:
        buffer[seq] = payload
    if not drop_next:
        pub.send_multipart([b"kv-events", struct.pack(">Q", seq), payload])
    drop_next = False
    seq += 1
    print("sent", seq - 1, flush=True)
stop.set()
