#!/usr/bin/python3
"""A minimal engine in Python that embeds the kvfabric worker through its C ABI (ctypes).

It owns its KV buffer (num_blocks blocks of BLOCK_BYTES bytes) and a hash -> block table with
pin counts, and talks to libkvf_worker.so only through worker/kvf_worker.h. Block content is a
function of the block hash (blake2b in counter mode), so a receiver checks every byte it got.

  c_abi_engine.py LIB holder TRANSPORTS NET_DEVICES PEER_URL
      caches BLOCKS blocks (hashes 7000.., scattered), holds a lease on the first 4, publishes
      BlockStored for them, prints "READY <url> <kv_pub> <kv_replay>", serves pushes (to
      PEER_URL only: config.peers) until "quit" on stdin, then checks that every pin was undone
      and exits 0.
  c_abi_engine.py LIB receiver TRANSPORTS NET_DEVICES URL PORT
      serves on PORT and advertises http://localhost:PORT (config.advertise_url, the holder's
      only peer), fetches the BLOCKS blocks from URL into landing blocks 100.. (naming the
      lease), checks the result and every byte, then fetches hashes the holder lacks (fallback)
      and exits 0.
Both first check the config's ABI sizes: the first release's struct_size is served with the
appended fields at their defaults, a longer one only while its unknown fields are unset.
Prints "FAIL: ..." and exits 1 on any error.
"""
import ctypes
import hashlib
import select
import sys
import time

BLOCK_SIZE = 16
BLOCK_BYTES = 4096
NUM_BLOCKS = 256
BLOCKS = 24
FIRST_HASH = 7000
TOKEN = b"abi-s3cret"


def fail(msg):
    print("FAIL:", msg, flush=True)
    sys.exit(1)


def content(h):
    out = bytearray()
    counter = 0
    while len(out) < BLOCK_BYTES:
        out += hashlib.blake2b(h.to_bytes(8, "little") + counter.to_bytes(4, "little")).digest()
        counter += 1
    return bytes(out[:BLOCK_BYTES])


class FetchResult(ctypes.Structure):
    _fields_ = [("fetch_id", ctypes.c_char_p), ("requested", ctypes.c_size_t),
                ("landed", ctypes.c_size_t), ("bytes", ctypes.c_uint64),
                ("writes_may_arrive", ctypes.c_int), ("reason", ctypes.c_char_p),
                ("elapsed_us", ctypes.c_int64)]


PIN = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64),
                       ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint32))
UNPIN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t)
DONE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(FetchResult))
RELEASE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)


class Callbacks(ctypes.Structure):
    _fields_ = [("user", ctypes.c_void_p), ("pin_leading_run", PIN), ("unpin", UNPIN),
                ("fetch_done", DONE), ("release_landing", RELEASE)]


class Config(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("instance_id", ctypes.c_char_p),
                ("host", ctypes.c_char_p), ("port", ctypes.c_uint16), ("token", ctypes.c_char_p),
                ("transports", ctypes.c_char_p), ("net_devices", ctypes.c_char_p),
                ("block_size", ctypes.c_int64), ("block_bytes", ctypes.c_uint64),
                ("num_blocks", ctypes.c_uint64), ("region", ctypes.c_void_p),
                ("region_bytes", ctypes.c_uint64), ("max_push_blocks", ctypes.c_uint64),
                ("kv_events_endpoint", ctypes.c_char_p),
                ("kv_events_replay_endpoint", ctypes.c_char_p),
                ("kv_events_topic", ctypes.c_char_p), ("insecure", ctypes.c_int32),
                # Appended after the first release (KVF_WORKER_CONFIG_SIZE_V1 ends before them).
                ("advertise_url", ctypes.c_char_p),
                ("peers", ctypes.POINTER(ctypes.c_char_p)), ("num_peers", ctypes.c_size_t)]


CONFIG_SIZE_V1 = Config.advertise_url.offset


class Engine:
    def __init__(self, lib_path, name, transports, net_devices, events, port=0,
                 advertise_url=None, peers=()):
        self.lib = ctypes.CDLL(lib_path)
        self.buffer = ctypes.create_string_buffer(NUM_BLOCKS * BLOCK_BYTES)
        self.table = {}  # hash -> block
        self.pins = {}  # hash -> count
        self.results = {}  # fetch id -> (landed, bytes, writes_may_arrive, reason)
        self.released = set()
        self.thread_calls_ok = True
        self.cb = Callbacks(None, PIN(self.pin), UNPIN(self.unpin), DONE(self.done),
                            RELEASE(self.release))
        cfg = Config()
        cfg.struct_size = ctypes.sizeof(Config)
        self.port = port
        cfg.instance_id = name.encode()
        cfg.host = b"127.0.0.1"
        cfg.port = port
        cfg.token = TOKEN
        cfg.transports = transports.encode()
        cfg.net_devices = net_devices.encode() if net_devices != "-" else None
        cfg.block_size = BLOCK_SIZE
        cfg.block_bytes = BLOCK_BYTES
        cfg.num_blocks = NUM_BLOCKS
        cfg.region = ctypes.cast(self.buffer, ctypes.c_void_p)
        cfg.region_bytes = NUM_BLOCKS * BLOCK_BYTES
        if events:
            cfg.kv_events_endpoint = b"tcp://127.0.0.1:*"
            cfg.kv_events_replay_endpoint = b"tcp://127.0.0.1:*"
        self.err = ctypes.create_string_buffer(512)
        self.worker = ctypes.c_void_p()
        lib = self.lib
        lib.kvf_worker_create.argtypes = [ctypes.POINTER(Config), ctypes.POINTER(Callbacks),
                                          ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p,
                                          ctypes.c_size_t]
        lib.kvf_worker_poll.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.kvf_worker_url.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.kvf_worker_kv_events_endpoints.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                                                       ctypes.c_size_t, ctypes.c_char_p,
                                                       ctypes.c_size_t]
        lib.kvf_worker_fetch.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                         ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64),
                                         ctypes.POINTER(ctypes.c_uint32), ctypes.c_size_t,
                                         ctypes.c_int64, ctypes.c_char_p, ctypes.c_size_t]
        lib.kvf_worker_hold_lease.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                                              ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t,
                                              ctypes.c_int64, ctypes.POINTER(ctypes.c_size_t),
                                              ctypes.c_char_p, ctypes.c_size_t]
        lib.kvf_worker_publish_stored.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64),
                                                  ctypes.c_size_t, ctypes.c_int, ctypes.c_uint64,
                                                  ctypes.POINTER(ctypes.c_uint32),
                                                  ctypes.c_size_t, ctypes.c_char_p,
                                                  ctypes.c_size_t]
        lib.kvf_worker_destroy.argtypes = [ctypes.c_void_p]
        lib.kvf_worker_port.argtypes = [ctypes.c_void_p]
        lib.kvf_worker_port.restype = ctypes.c_uint16
        lib.kvf_status_name.restype = ctypes.c_char_p
        # A config that is too small for this library is refused with a message naming it.
        bad = Config()
        bad.struct_size = 8
        code = lib.kvf_worker_create(ctypes.byref(bad), ctypes.byref(self.cb),
                                     ctypes.byref(self.worker), self.err, len(self.err))
        if code == 0 or b"struct_size" not in self.err.value:
            fail(f"a short config was not refused: {code} {self.err.value!r}")
        self.check_config_sizes(cfg)
        if advertise_url:
            cfg.advertise_url = advertise_url.encode()
        self.peer_strings = (ctypes.c_char_p * max(1, len(peers)))(*[p.encode() for p in peers])
        cfg.peers = ctypes.cast(self.peer_strings, ctypes.POINTER(ctypes.c_char_p))
        cfg.num_peers = len(peers)
        self.check(lib.kvf_worker_create(ctypes.byref(cfg), ctypes.byref(self.cb),
                                         ctypes.byref(self.worker), self.err, len(self.err)),
                   "kvf_worker_create")

    def check_config_sizes(self, cfg):
        """A caller built against the first header (struct_size KVF_WORKER_CONFIG_SIZE_V1) is
        served, and the library reads nothing past its struct: the appended fields hold values
        the full size refuses, and the V1-sized create takes their defaults."""
        lib = self.lib
        cfg.port = 0
        cfg.advertise_url = b"not-a-url"
        full = self.try_create(cfg)
        if full is not None or b"config.advertise_url" not in self.err.value:
            fail(f"a bad advertise_url was not refused: {self.err.value!r}")
        cfg.struct_size = CONFIG_SIZE_V1
        old = self.try_create(cfg)
        if old is None:
            fail(f"a V1-sized config ({CONFIG_SIZE_V1} bytes) was refused: {self.err.value!r}")
        buf = ctypes.create_string_buffer(256)
        self.check(lib.kvf_worker_url(old, buf, 256), "kvf_worker_url")
        port = lib.kvf_worker_port(old)
        lib.kvf_worker_destroy(old)
        if buf.value.decode() != f"http://127.0.0.1:{port}":
            fail(f"a V1-sized config read advertise_url: url {buf.value!r}")
        # A newer caller's extra bytes: refused when set, accepted when zero.
        class Longer(ctypes.Structure):
            _fields_ = [("config", Config), ("extra", ctypes.c_uint64)]
        longer = Longer(cfg, 0)
        longer.config.advertise_url = None
        longer.config.struct_size = ctypes.sizeof(Longer)
        newer = self.try_create(ctypes.cast(ctypes.byref(longer), ctypes.POINTER(Config)))
        if newer is None:
            fail(f"a longer config with unset extra fields was refused: {self.err.value!r}")
        lib.kvf_worker_destroy(newer)
        longer.extra = 1
        if self.try_create(ctypes.cast(ctypes.byref(longer), ctypes.POINTER(Config))) is not None:
            fail("a longer config with a set unknown field was accepted")
        cfg.struct_size = ctypes.sizeof(Config)
        cfg.advertise_url = None
        cfg.port = self.port

    def try_create(self, cfg):
        """kvf_worker_create with cfg (a Config or a pointer to one): the worker, or None."""
        worker = ctypes.c_void_p()
        ref = cfg if isinstance(cfg, ctypes._Pointer) else ctypes.byref(cfg)
        code = self.lib.kvf_worker_create(ref, ctypes.byref(self.cb), ctypes.byref(worker),
                                          self.err, len(self.err))
        return worker if code == 0 else None

    def check(self, code, what):
        if code != 0:
            fail(f"{what}: {self.lib.kvf_status_name(code).decode()}: {self.err.value.decode()}")

    def url(self):
        buf = ctypes.create_string_buffer(256)
        self.check(self.lib.kvf_worker_url(self.worker, buf, 256), "kvf_worker_url")
        return buf.value.decode()

    def endpoints(self):
        pub, replay = ctypes.create_string_buffer(256), ctypes.create_string_buffer(256)
        self.check(self.lib.kvf_worker_kv_events_endpoints(self.worker, pub, 256, replay, 256),
                   "kvf_worker_kv_events_endpoints")
        return pub.value.decode(), replay.value.decode()

    def block(self, b):
        return ctypes.string_at(ctypes.addressof(self.buffer) + b * BLOCK_BYTES, BLOCK_BYTES)

    def write_block(self, b, data):
        ctypes.memmove(ctypes.addressof(self.buffer) + b * BLOCK_BYTES, data, BLOCK_BYTES)

    # Callbacks: run inside kvf_worker_poll on this (the engine) thread.
    def pin(self, _user, hashes, n, out):
        run = 0
        for i in range(n):
            b = self.table.get(hashes[i])
            if b is None:
                break
            self.pins[hashes[i]] = self.pins.get(hashes[i], 0) + 1
            out[i] = b
            run += 1
        return run

    def unpin(self, _user, hashes, n):
        for i in range(n):
            if self.pins.get(hashes[i], 0) <= 0:
                print("FAIL: unpin of an unpinned block", flush=True)
                self.thread_calls_ok = False
            self.pins[hashes[i]] = self.pins.get(hashes[i], 0) - 1

    def done(self, _user, result):
        r = result.contents
        self.results[r.fetch_id.decode()] = (r.landed, r.bytes, r.writes_may_arrive,
                                             r.reason.decode())

    def release(self, _user, fetch_id):
        self.released.add(fetch_id.decode())

    def poll_until(self, cond, seconds):
        deadline = time.time() + seconds
        while not cond() and time.time() < deadline:
            self.lib.kvf_worker_poll(self.worker, 20)
        return cond()

    def fetch(self, fetch_id, hashes, blocks, lease=None, deadline_ms=5000):
        n = len(hashes)
        h = (ctypes.c_uint64 * n)(*hashes)
        b = (ctypes.c_uint32 * n)(*blocks)
        self.check(self.lib.kvf_worker_fetch(self.worker, fetch_id.encode(), self.source.encode(),
                                             lease.encode() if lease else None, h, b, n,
                                             deadline_ms, self.err, len(self.err)),
                   "kvf_worker_fetch")


def holder(engine):
    hashes = [FIRST_HASH + i for i in range(BLOCKS)]
    for i, h in enumerate(hashes):
        b = (i * 37 + 5) % NUM_BLOCKS  # scattered, so the holder's puts are not one range
        engine.table[h] = b
        engine.write_block(b, content(h))
    tokens = (ctypes.c_uint32 * (BLOCKS * BLOCK_SIZE))(*range(BLOCKS * BLOCK_SIZE))
    engine.check(engine.lib.kvf_worker_publish_stored(
        engine.worker, (ctypes.c_uint64 * BLOCKS)(*hashes), BLOCKS, 0, 0, tokens,
        BLOCKS * BLOCK_SIZE, engine.err, len(engine.err)), "kvf_worker_publish_stored")
    pinned = ctypes.c_size_t()
    engine.check(engine.lib.kvf_worker_hold_lease(
        engine.worker, b"lease-1", (ctypes.c_uint64 * 4)(*hashes[:4]), 4, 60000,
        ctypes.byref(pinned), engine.err, len(engine.err)), "kvf_worker_hold_lease")
    if pinned.value != 4 or sum(engine.pins.values()) != 4:
        fail(f"lease pinned {pinned.value}, pins {engine.pins}")
    pub, replay = engine.endpoints()
    print("READY", engine.url(), pub, replay, flush=True)
    while True:
        engine.lib.kvf_worker_poll(engine.worker, 20)
        readable, _, _ = select.select([sys.stdin], [], [], 0)
        if readable and sys.stdin.readline().strip() == "quit":
            break
    # The receiver's push named the lease: every pin (push and lease) is undone.
    if not engine.poll_until(lambda: all(p == 0 for p in engine.pins.values()), 5):
        fail(f"pins left on the holder: {engine.pins}")
    if not engine.thread_calls_ok:
        fail("bad unpin")
    print("OK holder", flush=True)


def receiver(engine, url):
    engine.source = url
    hashes = [FIRST_HASH + i for i in range(BLOCKS)]
    landing = [100 + i for i in range(BLOCKS)]
    for b in landing:
        engine.write_block(b, b"\xee" * BLOCK_BYTES)
    engine.fetch("f1", hashes, landing, lease="lease-1")
    if not engine.poll_until(lambda: "f1" in engine.released, 20):
        fail(f"no outcome/release for f1: {engine.results}")
    landed, nbytes, may, reason = engine.results["f1"]
    if landed != BLOCKS or nbytes != BLOCKS * BLOCK_BYTES or may or reason:
        fail(f"f1: landed {landed} bytes {nbytes} may {may} reason {reason!r}")
    for i, h in enumerate(hashes):
        if engine.block(landing[i]) != content(h):
            fail(f"block {i} (hash {h}) differs from the holder's bytes")
    # Hashes the holder does not have: a fallback, and the landing blocks are untouched.
    missing = [9_000_000 + i for i in range(4)]
    spare = [200 + i for i in range(4)]
    for b in spare:
        engine.write_block(b, b"\xee" * BLOCK_BYTES)
    engine.fetch("f2", missing, spare)
    if not engine.poll_until(lambda: "f2" in engine.released, 20):
        fail("no outcome/release for f2")
    landed, _, may, reason = engine.results["f2"]
    if landed != 0 or may or "none of the blocks" not in reason:
        fail(f"f2: landed {landed} may {may} reason {reason!r}")
    if any(engine.block(b) != b"\xee" * BLOCK_BYTES for b in spare):
        fail("a fallback wrote into its landing blocks")
    print("OK receiver", BLOCKS, "blocks", BLOCKS * BLOCK_BYTES, "bytes", flush=True)


def main():
    lib, role, transports, net_devices = sys.argv[1:5]
    if role == "holder":
        engine = Engine(lib, role, transports, net_devices, events=True, peers=[sys.argv[5]])
    else:
        port = int(sys.argv[6])
        advertised = f"http://localhost:{port}"
        engine = Engine(lib, role, transports, net_devices, events=False, port=port,
                        advertise_url=advertised)
        if engine.url() != advertised:
            fail(f"kvf_worker_url {engine.url()!r}, advertise_url {advertised!r}")
    try:
        if role == "holder":
            holder(engine)
        else:
            receiver(engine, sys.argv[5])
    finally:
        engine.lib.kvf_worker_destroy(engine.worker)


if __name__ == "__main__":
    main()
