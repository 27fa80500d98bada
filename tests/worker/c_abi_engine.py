#!/usr/bin/python3
"""A minimal engine in Python that embeds the kvfabric worker through its C ABI (ctypes).

It owns its KV buffer (num_blocks blocks of BLOCK_BYTES bytes) and a hash -> block table with
pin counts, and talks to libkvf_worker.so only through worker/kvf_worker.h. Block content is a
function of the block hash (blake2b in counter mode), so a receiver checks every byte it got.

  c_abi_engine.py LIB holder TRANSPORTS NET_DEVICES TIERS PEER_URL
      caches BLOCKS blocks (hashes 7000.., scattered), holds a lease on the first 4, publishes
      BlockStored for them; also holds three tiered prefixes (TIERED_PREFIXES): the head in its
      pool, the rest in its host tier (a second buffer) and its disk tier (a file), one with a
      corrupt disk block, one whose tier run it fills in malformed. TIERS "on" hands the tiers to the library (config.tiers), "off"
      passes NULL. Prints "READY <url> <kv_pub> <kv_replay>", serves pushes (to PEER_URL only:
      config.peers) until "quit" on stdin, then checks that every pin was undone (every pinned
      tier run exactly once) and exits 0.
  c_abi_engine.py LIB receiver TRANSPORTS NET_DEVICES TIERS URL PORT
      serves on PORT and advertises http://localhost:PORT (config.advertise_url, the holder's
      only peer), fetches the BLOCKS blocks from URL into landing blocks 100.. (naming the
      lease), checks the result and every byte, then fetches hashes the holder lacks (fallback),
      then each tiered prefix whole (TIERS "on": every block before the corrupt or malformed
      one; "off": the pool's head only) and exits 0.
Both first check the config's ABI sizes: the first release's struct_size is served with the
appended fields at their defaults, a longer one only while its unknown fields are unset.
Prints "FAIL: ..." and exits 1 on any error.
"""
import ctypes
import hashlib
import os
import select
import sys
import tempfile
import threading
import time

BLOCK_SIZE = 16
BLOCK_BYTES = 4096
NUM_BLOCKS = 256
BLOCKS = 24
FIRST_HASH = 7000
TOKEN = b"abi-s3cret"
# Tiered prefixes: TIER_HEAD blocks in the pool (blocks 240..), then TIER_LAYOUT in the tiers.
# (first hash, how, cut): "thread" reports its disk reads from a thread, the others from inside
# pin_tier_run; "corrupt" has block `cut` (a disk block) damaged on disk, "malformed" gives block
# `cut` (a host block) an offset past the region. Either way the push ends before `cut`.
TIER_HEAD = 4
TIER_LAYOUT = ["host"] * 10 + ["disk"] * 4 + ["host"] * 6
TIERED_PREFIXES = [(8000, "thread", None), (8100, "corrupt", TIER_HEAD + 11),
                   (8200, "malformed", TIER_HEAD + 2)]


def tiered_prefix(h):
    """The TIERED_PREFIXES entry hash h belongs to, and its index there."""
    for first, how, cut in TIERED_PREFIXES:
        if first <= h < first + TIER_HEAD + len(TIER_LAYOUT):
            return (first, how, cut), h - first
    return None, None
HOST_SLOTS = 64
DISK_BUFFERS = 4  # config.tiers.disk_buffer_bytes: every push gets this many (one at a time)
KVF_TIER_HOST, KVF_TIER_DISK = 0, 1
KVF_ERR_NOT_FOUND = 2


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


class TierBlock(ctypes.Structure):
    _fields_ = [("tier", ctypes.c_uint32), ("reserved", ctypes.c_uint32),
                ("offset", ctypes.c_uint64)]


class TierRun(ctypes.Structure):
    _fields_ = [("blocks", ctypes.POINTER(TierBlock)), ("num_blocks", ctypes.c_size_t),
                ("id", ctypes.c_uint64), ("out_of_buffers", ctypes.c_int32)]


PIN_TIER = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64),
                            ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                            ctypes.c_uint64, ctypes.POINTER(TierRun))
UNPIN_TIER = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64)


class Tiers(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("user", ctypes.c_void_p),
                ("region", ctypes.c_void_p), ("region_bytes", ctypes.c_uint64),
                ("disk_buffer_bytes", ctypes.c_uint64), ("pin_tier_run", PIN_TIER),
                ("unpin_tier_run", UNPIN_TIER)]


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
                ("peers", ctypes.POINTER(ctypes.c_char_p)), ("num_peers", ctypes.c_size_t),
                ("tiers", ctypes.POINTER(Tiers))]


CONFIG_SIZE_V1 = Config.advertise_url.offset
CONFIG_SIZE_V2 = Config.tiers.offset  # the release before the tiers


class EngineTiers:
    """The engine's tiers below its pool: host memory (a buffer of HOST_SLOTS blocks, handed to
    the library as config.tiers.region) and a disk (a temporary file, each block with a blake2b
    digest checked after every read). Counts every pin and unpin of a run."""

    def __init__(self, engine):
        self.engine = engine
        self.region = ctypes.create_string_buffer(HOST_SLOTS * BLOCK_BYTES)
        self.slots = {}  # hash -> host slot
        self.slot_pins = {}  # slot -> count
        self.disk = tempfile.TemporaryFile()
        self.on_disk = {}  # hash -> (file offset, digest)
        self.runs = {}  # run id -> slots it pinned
        self.next_run = 1
        self.pinned_runs = 0
        self.unpinned_runs = 0
        self.first_hashes = []  # hashes[0] of each pin_tier_run
        self.num_buffers = []  # num_disk_buffers of each pin_tier_run
        self.problems = []
        self.readers = []
        self.table = Tiers(ctypes.sizeof(Tiers), None,
                           ctypes.cast(self.region, ctypes.c_void_p), HOST_SLOTS * BLOCK_BYTES,
                           DISK_BUFFERS * BLOCK_BYTES, PIN_TIER(self.pin_run),
                           UNPIN_TIER(self.unpin_run))

    def put_host(self, h, data):
        slot = (len(self.slots) * 11 + 3) % HOST_SLOTS  # scattered: one put per block
        self.slots[h] = slot
        ctypes.memmove(ctypes.addressof(self.region) + slot * BLOCK_BYTES, data, BLOCK_BYTES)

    def put_disk(self, h, data, corrupt=False):
        offset = len(self.on_disk) * BLOCK_BYTES
        self.on_disk[h] = (offset, hashlib.blake2b(data).digest())
        if corrupt:
            data = data[:100] + bytes([data[100] ^ 0x5A]) + data[101:]
        os.pwrite(self.disk.fileno(), data, offset)

    # Callbacks: run inside kvf_worker_poll on the engine thread.
    def pin_run(self, _user, hashes, n, buffers, num_buffers, read_id, run):
        try:
            self.pin_checked(hashes, n, buffers, num_buffers, read_id, run.contents)
        except Exception as e:  # a ctypes callback cannot raise: record it
            self.problems.append(f"pin_tier_run raised {e!r}")

    def pin_checked(self, hashes, n, buffers, num_buffers, read_id, run):
        self.first_hashes.append(hashes[0] if n else None)
        self.num_buffers.append(num_buffers)
        pinned, reads = [], []
        for i in range(n):
            h = hashes[i]
            if h in self.slots:
                slot = self.slots[h]
                self.slot_pins[slot] = self.slot_pins.get(slot, 0) + 1
                pinned.append(slot)
                run.blocks[i] = TierBlock(KVF_TIER_HOST, 0, slot * BLOCK_BYTES)
                (_, how, cut), index = tiered_prefix(h)
                if how == "malformed" and index == cut:
                    run.blocks[i].offset = HOST_SLOTS * BLOCK_BYTES
            elif h in self.on_disk:
                if len(reads) == num_buffers:
                    run.out_of_buffers = 1
                    break
                if buffers[len(reads)] % 4096 != 0:
                    self.problems.append(f"disk buffer {len(reads)} is not 4096-byte aligned")
                run.blocks[i] = TierBlock(KVF_TIER_DISK, 0, len(reads))
                reads.append((buffers[len(reads)], h))
            else:
                break
            run.num_blocks = i + 1
        if pinned:
            run.id = self.next_run
            self.runs[run.id] = pinned
            self.next_run += 1
            self.pinned_runs += 1
        if not reads:
            return
        if tiered_prefix(reads[0][1])[0][1] != "thread":
            self.read(read_id, reads)
        else:
            reader = threading.Thread(target=self.read, args=(read_id, reads))
            self.readers.append(reader)
            reader.start()

    def read(self, read_id, reads):
        """Reads each block into its buffer and checks it; reports the leading intact ones."""
        intact = 0
        for address, h in reads:
            offset, digest = self.on_disk[h]
            buf = (ctypes.c_char * BLOCK_BYTES).from_address(address)
            if os.preadv(self.disk.fileno(), [buf], offset) != BLOCK_BYTES or \
                    hashlib.blake2b(bytes(buf)).digest() != digest:
                break
            intact += 1
        code = self.engine.lib.kvf_worker_tier_read_done(self.engine.worker, read_id, intact)
        if code != 0:
            self.problems.append(f"kvf_worker_tier_read_done({read_id}): {code}")

    def unpin_run(self, _user, run_id):
        slots = self.runs.pop(run_id, None)
        if slots is None:
            self.problems.append(f"unpin_tier_run({run_id}) of no pinned run")
            return
        for slot in slots:
            self.slot_pins[slot] -= 1
        self.unpinned_runs += 1


class Engine:
    def __init__(self, lib_path, name, transports, net_devices, events, port=0,
                 advertise_url=None, peers=(), tiers=None):
        self.lib = ctypes.CDLL(lib_path)
        self.buffer = ctypes.create_string_buffer(NUM_BLOCKS * BLOCK_BYTES)
        self.table = {}  # hash -> block
        self.pins = {}  # hash -> count
        self.results = {}  # fetch id -> (landed, bytes, writes_may_arrive, reason)
        self.released = set()
        self.thread_calls_ok = True
        self.tiers = EngineTiers(self) if tiers else None
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
        lib.kvf_worker_tier_read_done.argtypes = [ctypes.c_void_p, ctypes.c_uint64,
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
        if tiers == "on":
            cfg.tiers = ctypes.pointer(self.tiers.table)
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
        # A tier table is checked field by field; a caller from before the tiers passes a
        # struct_size that ends before config.tiers, and the library does not read it.
        bad_tiers = Tiers(ctypes.sizeof(Tiers), None, None, HOST_SLOTS * BLOCK_BYTES, 0,
                          PIN_TIER(lambda *a: None), UNPIN_TIER(lambda *a: None))
        cfg.advertise_url = None
        cfg.struct_size = ctypes.sizeof(Config)
        cfg.tiers = ctypes.pointer(bad_tiers)
        if self.try_create(cfg) is not None or b"config.tiers.region" not in self.err.value:
            fail(f"a tier table without a region was not refused: {self.err.value!r}")
        bad_tiers.region = ctypes.cast(self.buffer, ctypes.c_void_p)
        bad_tiers.disk_buffer_bytes = 100
        if self.try_create(cfg) is not None or \
                b"config.tiers.disk_buffer_bytes" not in self.err.value:
            fail(f"disk buffers smaller than a block were not refused: {self.err.value!r}")
        bad_tiers.disk_buffer_bytes = 0
        bad_tiers.struct_size = 8
        if self.try_create(cfg) is not None or b"config.tiers.struct_size" not in self.err.value:
            fail(f"a short tier table was not refused: {self.err.value!r}")
        cfg.struct_size = CONFIG_SIZE_V2
        old = self.try_create(cfg)
        if old is None:
            fail(f"a V2-sized config read config.tiers: {self.err.value!r}")
        lib.kvf_worker_destroy(old)
        cfg.struct_size = ctypes.sizeof(Config)
        cfg.tiers = None
        # A newer caller's extra bytes: refused when set, accepted when zero.
        class Longer(ctypes.Structure):
            _fields_ = [("config", Config), ("extra", ctypes.c_uint64)]
        longer = Longer(cfg, 0)
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
    stock_tiered(engine)
    code = engine.lib.kvf_worker_tier_read_done(engine.worker, 123456, 1)
    if code != KVF_ERR_NOT_FOUND:
        fail(f"kvf_worker_tier_read_done of an unknown read: {code}")
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
    check_tier_pins(engine)
    print("OK holder", flush=True)


def stock_tiered(engine):
    """The tiered prefixes: the head in the pool (blocks 240..), the rest in the tiers."""
    for k, (first, how, cut) in enumerate(TIERED_PREFIXES):
        for i in range(TIER_HEAD + len(TIER_LAYOUT)):
            h = first + i
            if i < TIER_HEAD:
                engine.table[h] = 240 + k * TIER_HEAD + i
                engine.write_block(engine.table[h], content(h))
            elif TIER_LAYOUT[i - TIER_HEAD] == "host":
                engine.tiers.put_host(h, content(h))
            else:
                engine.tiers.put_disk(h, content(h), corrupt=how == "corrupt" and i == cut)


def check_tier_pins(engine):
    """Every pinned tier run was unpinned exactly once; the tiers saw only what follows the
    pool's run of each push (with config.tiers), or nothing at all (without)."""
    tiers = engine.tiers
    for reader in tiers.readers:
        reader.join(5)
    if tiers.problems:
        fail(f"tiers: {tiers.problems}")
    if tiers.runs or any(tiers.slot_pins.values()):
        fail(f"tier pins left: runs {tiers.runs} slots {tiers.slot_pins}")
    if engine.tiered:
        want_first = [9_000_000] + [first + TIER_HEAD for first, _, _ in TIERED_PREFIXES]
        want_runs = len(TIERED_PREFIXES)
    else:
        want_first, want_runs = [], 0
    if tiers.first_hashes != want_first:
        fail(f"pin_tier_run saw runs starting at {tiers.first_hashes}, want {want_first}")
    if any(n != DISK_BUFFERS for n in tiers.num_buffers):
        fail(f"pin_tier_run got {tiers.num_buffers} disk buffers, want {DISK_BUFFERS} each")
    if tiers.pinned_runs != want_runs or tiers.unpinned_runs != want_runs:
        fail(f"tier runs pinned {tiers.pinned_runs} unpinned {tiers.unpinned_runs}, "
             f"want {want_runs}")


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
    tiered_fetches(engine)
    print("OK receiver", BLOCKS, "blocks", BLOCKS * BLOCK_BYTES, "bytes", flush=True)


def tiered_fetches(engine):
    """Each tiered prefix whole, in one fetch: with the holder's tiers every block before its
    cut (a corrupt disk block, a malformed run entry) lands byte for byte; without them, the
    pool's head only. Landing blocks past what landed are never written."""
    n = TIER_HEAD + len(TIER_LAYOUT)
    for k, (first, _, cut) in enumerate(TIERED_PREFIXES):
        hashes = [first + i for i in range(n)]
        landing = [124 + k * n + i for i in range(n)]
        for b in landing:
            engine.write_block(b, b"\xee" * BLOCK_BYTES)
        fid = f"t{k}"
        engine.fetch(fid, hashes, landing)
        if not engine.poll_until(lambda: fid in engine.released, 20):
            fail(f"no outcome/release for {fid}")
        landed, nbytes, may, reason = engine.results[fid]
        want = (cut if cut is not None else n) if engine.tiered else TIER_HEAD
        if landed != want or nbytes != want * BLOCK_BYTES or may or bool(reason) != (want < n):
            fail(f"{fid}: landed {landed} bytes {nbytes} may {may} reason {reason!r}, "
                 f"want {want} blocks")
        for i, h in enumerate(hashes):
            expected = content(h) if i < want else b"\xee" * BLOCK_BYTES
            if engine.block(landing[i]) != expected:
                fail(f"{fid}: landing block {i} (hash {h}) holds the wrong bytes")
        print(f"OK {fid}: {landed} of {n} blocks", flush=True)


def main():
    lib, role, transports, net_devices, tiers = sys.argv[1:6]
    if tiers not in ("on", "off"):
        fail(f"TIERS: {tiers!r}, want on or off")
    if role == "holder":
        engine = Engine(lib, role, transports, net_devices, events=True, peers=[sys.argv[6]],
                        tiers=tiers)
    else:
        port = int(sys.argv[7])
        advertised = f"http://localhost:{port}"
        engine = Engine(lib, role, transports, net_devices, events=False, port=port,
                        advertise_url=advertised)
        if engine.url() != advertised:
            fail(f"kvf_worker_url {engine.url()!r}, advertise_url {advertised!r}")
    engine.tiered = tiers == "on"
    try:
        if role == "holder":
            holder(engine)
        else:
            receiver(engine, sys.argv[6])
    finally:
        engine.lib.kvf_worker_destroy(engine.worker)


if __name__ == "__main__":
    main()
