#!/usr/bin/python3
"""Independent vLLM-format KV-event publisher for router_kv_subscriber_test.

Binds a PUB and a ROUTER (replay) socket on 127.0.0.1, prints "<pub_port> <replay_port>",
then follows commands on stdin, one per line:
  probe            publish an empty batch (until the subscriber shows it is connected)
  store <first_token> <blocks> <parent|-> <hash...>   BlockStored, newer map encoding, bytes hashes
  store_array <first_token> <blocks> <parent|-> <hash...>   older array encoding, int hashes
  remove <hash...> BlockRemoved (map encoding, bytes hashes)
  drop             the next batch is buffered for replay but not published (a gap)
  quit
Block i of a store holds tokens first_token + 16*i ... + 16*i + 15.
"""
import struct
import sys
import threading
import time

import msgpack
import zmq

BLOCK = 16
ctx = zmq.Context()
pub = ctx.socket(zmq.PUB)
pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
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
    events = []
    if cmd in ("store", "store_array"):
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
    payload = msgpack.packb([time.time(), events, None], use_bin_type=True)
    with lock:
        buffer[seq] = payload
    if not drop_next:
        pub.send_multipart([b"kv-events", struct.pack(">Q", seq), payload])
    drop_next = False
    seq += 1
    print("sent", seq - 1, flush=True)
stop.set()
