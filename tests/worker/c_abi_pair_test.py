#!/usr/bin/python3
"""worker_c_abi_test: two Python engines (c_abi_engine.py), each its own process with its own KV
buffer, move KV blocks between them through libkvf_worker.so over UCX - no kvfabric executable
on either side. The holder's KV events are checked through its replay socket.

Usage: c_abi_pair_test.py LIBKVF_WORKER_SO TRANSPORTS NET_DEVICES ("-" for none) TIERS
TIERS "on": the holder serves the rest of a prefix from its host and disk tiers
(config.tiers); "off": it has the same tiers but does not hand them over (config.tiers NULL).
"""
import os
import select
import socket
import subprocess
import sys
import time

import msgpack
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
ENGINE = os.path.join(HERE, "c_abi_engine.py")


def read_line(proc, timeout):
    deadline = time.time() + timeout
    line = b""
    while time.time() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            line = proc.stdout.readline()
            if line.startswith(b"READY") or line.startswith(b"FAIL") or not line:
                return line.decode()
    return line.decode()


def check_events(replay_endpoint):
    """Replays the holder's KV-event stream from seq 0: [AllBlocksCleared], then BlockStored."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(replay_endpoint)
    sock.send_multipart([b"", (0).to_bytes(8, "big")])
    batches = []
    deadline = time.time() + 10
    while time.time() < deadline:
        if not sock.poll(200):
            continue
        frames = sock.recv_multipart()
        seq = int.from_bytes(frames[-2], "big")
        if seq == 2**64 - 1:
            break
        batches.append(msgpack.unpackb(frames[-1], raw=False))
    sock.close()
    ctx.term()
    events = [ev for batch in batches for ev in batch[1]]
    if not events or events[0] != ["AllBlocksCleared"]:
        return f"first event {events[:1]!r}"
    stored = [ev for ev in events if ev[0] == "BlockStored"]
    if len(stored) != 1 or len(stored[0][1]) != 24 or len(stored[0][3]) != 24 * 16:
        return f"BlockStored events {stored!r}"[:300]
    return None


def main():
    lib, transports, net_devices, tiers = sys.argv[1:5]
    if not os.path.exists(lib):
        print("FAIL: no library at", lib)
        return 1
    base = ["/usr/bin/python3", ENGINE, lib]
    # The receiver's port, known in advance: the holder pushes only to its advertised URL
    # (config.peers), which the receiver spells as http://localhost:PORT (config.advertise_url).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        receiver_port = s.getsockname()[1]
    peer_url = f"http://localhost:{receiver_port}"
    holder = subprocess.Popen(base + ["holder", transports, net_devices, tiers, peer_url],
                              stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    receiver = None
    try:
        ready = read_line(holder, 30)
        if not ready.startswith("READY"):
            print("FAIL: holder did not start:", ready, holder.stdout.read1(65536).decode())
            return 1
        _, url, _pub, replay = ready.split()
        problem = check_events(replay)
        if problem:
            print("FAIL: holder KV events:", problem)
            return 1
        receiver = subprocess.run(base + ["receiver", transports, net_devices, tiers, url,
                                          str(receiver_port)],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=90)
        out = receiver.stdout.decode()
        print(out)
        if receiver.returncode != 0 or "OK receiver" not in out:
            print("FAIL: receiver exited", receiver.returncode)
            return 1
        holder.stdin.write(b"quit\n")
        holder.stdin.flush()
        rest, _ = holder.communicate(timeout=30)
        print(rest.decode())
        if holder.returncode != 0 or b"OK holder" not in rest:
            print("FAIL: holder exited", holder.returncode)
            return 1
        print("OK c_abi_pair", transports, "tiers", tiers)
        return 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


if __name__ == "__main__":
    sys.exit(main())
