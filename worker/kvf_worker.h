/* C ABI of the kvfabric worker agent (worker/agent.h), for engines not written in C++.
 *
 * The engine owns its KV payload memory: one region of num_blocks fixed-size blocks, block i at
 * region + i * block_bytes. The agent registers that region with UCX, serves pushes out of it to
 * peers (GET /kv/info, POST /kv/push on its control server) and, when the engine has tiers below
 * its pool (config.tiers), the rest of a push from its host memory and disk, fetches blocks from
 * peers into landing blocks the engine reserved, keeps remote-decode leases, and publishes the
 * engine's KV events in vLLM's format (ZMQ) when asked to.
 *
 * Threads. The agent runs its own thread. It never calls the engine from it: every callback
 * runs inside kvf_worker_poll(), on the thread that calls it (the engine thread), so the engine
 * needs no lock around its block table. Call kvf_worker_poll() regularly (every step, or in a
 * loop with a timeout): a holder that does not poll delays the pushes peers wait for, and they
 * fall back at their deadlines. kvf_worker_fetch(), kvf_worker_tier_read_done() and the publish
 * functions may be called from any thread; kvf_worker_hold_lease() only from the engine thread.
 *
 * Errors: functions return KVF_OK or an error code, and write a message naming the field into
 * `err` (err_len bytes, always NUL-terminated; err may be NULL). */
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVF_WORKER_ABI_VERSION 1

typedef enum kvf_status {
  KVF_OK = 0,
  KVF_ERR_INVALID_ARGUMENT = 1,
  KVF_ERR_NOT_FOUND = 2,
  KVF_ERR_FAILED_PRECONDITION = 3,
  KVF_ERR_UNAVAILABLE = 4,
  KVF_ERR_RESOURCE_EXHAUSTED = 5,
  KVF_ERR_INTERNAL = 6,
} kvf_status;

typedef struct kvf_worker kvf_worker;

/* How one fetch ended (valid during the callback only). */
typedef struct kvf_fetch_result {
  const char* fetch_id;
  size_t requested; /* blocks asked for */
  size_t landed;    /* leading landing blocks that hold the KV (checksums verified) */
  uint64_t bytes;
  int writes_may_arrive; /* nonzero: keep every landing block until release_landing */
  const char* reason;    /* why not all arrived; "" when they did */
  int64_t elapsed_us;
} kvf_fetch_result;

typedef struct kvf_worker_callbacks {
  void* user; /* passed to every callback */
  /* Pins the leading run of hashes[0..n) that is cached (a pinned block is neither evicted nor
   * reused) and writes its block indices to blocks_out (room for n); returns its length. */
  size_t (*pin_leading_run)(void* user, const uint64_t* hashes, size_t n, uint32_t* blocks_out);
  /* Undoes one pin per hash (each was pinned by pin_leading_run). */
  void (*unpin)(void* user, const uint64_t* hashes, size_t n);
  /* A fetch ended. landed > 0: the first `landed` landing blocks hold the KV of the first
   * `landed` hashes; take them, and the rest may be reused. landed == 0: compute the KV
   * yourself; with writes_may_arrive keep all landing blocks out of use until release_landing. */
  void (*fetch_done)(void* user, const kvf_fetch_result* result);
  /* No write can reach the landing blocks of this fetch any more. Called once per fetch, after
   * fetch_done (possibly right after it). */
  void (*release_landing)(void* user, const char* fetch_id);
} kvf_worker_callbacks;

/* The tiers below the engine's pool (host memory, local disk), optional: an engine whose pool
 * holds only the head of a prefix serves the following blocks of the same push from them (see
 * kvf_worker_tiers). */
typedef enum kvf_tier {
  KVF_TIER_HOST = 0, /* host memory: sent from its slot in kvf_worker_tiers.region, no copy */
  KVF_TIER_DISK = 1, /* local disk: read by the engine into a disk buffer the agent gives it */
} kvf_tier;

/* One block of a tier run, in push order (the C++ agent's TierPushBlock). */
typedef struct kvf_tier_block {
  uint32_t tier;     /* a kvf_tier */
  uint32_t reserved; /* 0 */
  /* KVF_TIER_HOST: the block's byte offset in kvf_worker_tiers.region (block_bytes bytes there,
   * pinned until unpin_tier_run). KVF_TIER_DISK: the index of the disk buffer the block is read
   * into; disk buffers are used in order, so the run's j-th disk block has offset j. */
  uint64_t offset;
} kvf_tier_block;

/* What pin_tier_run fills in. The library sets blocks (and zeroes the rest) before the call. */
typedef struct kvf_tier_run {
  kvf_tier_block* blocks; /* library-owned, room for n entries; valid during the call only */
  size_t num_blocks;      /* the run's length: leading entries of blocks filled in */
  /* Names the run's pins for unpin_tier_run; 0 when it pinned nothing (no unpin_tier_run then). */
  uint64_t id;
  /* Nonzero: the run stopped before a disk block because every disk buffer was taken. */
  int32_t out_of_buffers;
} kvf_tier_run;

/* The engine's tiers (config.tiers; copied by kvf_worker_create). An engine without tiers
 * passes NULL: the blocks past its pool's leading run are answered missing, as before. */
typedef struct kvf_worker_tiers {
  uint32_t struct_size; /* sizeof(kvf_worker_tiers) of the caller's header (ABI evolution) */
  void* user;           /* passed to both callbacks */
  /* The host tier's memory, registered with the transport once: host blocks are sent from
   * their slots without a copy. Caller-owned, valid (and at this address) until
   * kvf_worker_destroy returns. Required (region_bytes at least block_bytes). */
  void* region;
  uint64_t region_bytes;
  /* Transport-registered memory the agent reads disk blocks into on their way to a receiver
   * (the disk buffers below), shared by concurrent pushes: a push takes at most one buffer per
   * block it asks for, and its disk blocks past the free ones are answered missing. Whole
   * buffers of block_bytes rounded up to 4096. 0: 64 MiB; otherwise at least one buffer. */
  uint64_t disk_buffer_bytes;
  /* Engine thread (inside kvf_worker_poll), after pin_leading_run answered a push: hashes[0..n)
   * are the wanted blocks after the pool's run. Fill `run` with the leading run of them that
   * the tiers hold, in order, stopping at the first one they do not: a host block is pinned in
   * its slot (neither evicted nor rewritten until unpin_tier_run(run->id)); a disk block takes
   * the next of disk_buffers[0..num_disk_buffers) (block_bytes bytes each, 4096-byte aligned,
   * O_DIRECT-ready) and the run stops before a disk block when none is left (out_of_buffers).
   * Do not block on the disk here: start the reads and report them with
   * kvf_worker_tier_read_done(read_id) from any thread (or call it before returning, for
   * synchronous reads). Check each disk block against the engine's stored checksum: a corrupt
   * block must end the intact count, never be sent. Entries from the first malformed one on (an
   * offset outside region, a disk index out of order or past the buffers) are answered missing;
   * unpin_tier_run still releases the whole run. */
  void (*pin_tier_run)(void* user, const uint64_t* hashes, size_t n, void* const* disk_buffers,
                       size_t num_disk_buffers, uint64_t read_id, kvf_tier_run* run);
  /* Engine thread: releases the pins of run `run_id` (nonzero, from pin_tier_run). Called
   * exactly once per run with a nonzero id, once its blocks were sent or the push gave up
   * (kvf_worker_destroy drops the callbacks not yet run, these included). */
  void (*unpin_tier_run)(void* user, uint64_t run_id);
} kvf_worker_tiers;

/* struct_size of a kvf_worker_tiers from its first release (up to and including
 * unpin_tier_run); later fields are appended after it. */
#define KVF_WORKER_TIERS_SIZE_V1 (offsetof(kvf_worker_tiers, unpin_tier_run) + sizeof(void*))

typedef struct kvf_worker_config {
  uint32_t struct_size;    /* sizeof(kvf_worker_config) of the caller's header (ABI evolution) */
  const char* instance_id; /* NULL: "worker" */
  const char* host;        /* control server address; NULL: "127.0.0.1" */
  uint16_t port;           /* 0 picks a free port */
  const char* token;       /* bearer token for the /kv/ routes and towards peers; NULL/"" is
                              refused unless insecure is set */
  const char* transports;  /* UCX transports: "shm", "tcp", "rdma", "all"; NULL: "shm" */
  const char* net_devices; /* UCX network devices for tcp/rdma, e.g. "lo"; NULL: all */
  int64_t block_size;      /* tokens per block */
  uint64_t block_bytes;    /* payload bytes per block */
  uint64_t num_blocks;
  void* region; /* caller-owned, num_blocks * block_bytes, valid until kvf_worker_destroy */
  uint64_t region_bytes;
  uint64_t max_push_blocks; /* 0: 65536 */
  /* KV events: ZMQ PUB bind address (e.g. "tcp://127.0.0.1:*"); NULL/"": no publisher. */
  const char* kv_events_endpoint;
  const char* kv_events_replay_endpoint; /* NULL/"": no replay socket */
  const char* kv_events_topic;           /* NULL: "" (vLLM's default) */
  /* Non-zero: run the /kv/ routes without a token (no authentication at all; test only). */
  int32_t insecure;
  /* Fields below were appended after the first release. A caller built against an older
   * header passes a smaller struct_size (at least KVF_WORKER_CONFIG_SIZE_V1); the fields past
   * it take their defaults. */
  /* The URL peers reach this control server at (http://host:port; pushes name it so that the
   * holder can claim the landing here), e.g. behind NAT or when bound to 0.0.0.0. NULL/"":
   * http://host:port of the bound server; kvf_worker_url() returns it. */
  const char* advertise_url;
  /* Worker URLs (http://host:port) of the cluster's engines, from the router's registry:
   * num_peers entries. When given, this agent pushes only to receivers listed here (a push
   * naming another is refused before any write). NULL/0: any receiver that grants the landing
   * on its own worker API. The strings are copied. */
  const char* const* peers;
  size_t num_peers;
  /* The tiers below the engine's pool that pushes are served from (kvf_worker_tiers); NULL:
   * none, a push is served from the pool only. */
  const kvf_worker_tiers* tiers;
} kvf_worker_config;

/* struct_size of a kvf_worker_config from the first release (up to and including insecure). */
#define KVF_WORKER_CONFIG_SIZE_V1 offsetof(kvf_worker_config, advertise_url)

/* Creates and starts the agent. On success *out owns it (kvf_worker_destroy). */
kvf_status kvf_worker_create(const kvf_worker_config* config, const kvf_worker_callbacks* callbacks,
                             kvf_worker** out, char* err, size_t err_len);
/* Stops serving and frees the agent; callbacks not yet run are dropped. The region may be
 * freed once this returns. NULL is ignored. */
void kvf_worker_destroy(kvf_worker* worker);

/* The control server's port, and its URL (http://host:port) written into buf. */
uint16_t kvf_worker_port(const kvf_worker* worker);
kvf_status kvf_worker_url(const kvf_worker* worker, char* buf, size_t len);
/* The bound KV-event endpoints ("" without a publisher / replay socket). */
kvf_status kvf_worker_kv_events_endpoints(const kvf_worker* worker, char* pub, size_t pub_len,
                                          char* replay, size_t replay_len);

/* Runs the callbacks due, on this thread. timeout_ms > 0 waits that long for one when none is
 * due. Returns how many ran. */
int kvf_worker_poll(kvf_worker* worker, int timeout_ms);

/* Fetches hashes[0..n) from the holder whose control server is source_url into the landing
 * blocks blocks[0..n) (reserved by the engine), within deadline_ms. Its outcome comes through
 * fetch_done and release_landing. lease_id (may be NULL) names a lease the holder releases once
 * it pushed. Any thread. */
kvf_status kvf_worker_fetch(kvf_worker* worker, const char* fetch_id, const char* source_url,
                            const char* lease_id, const uint64_t* hashes, const uint32_t* blocks,
                            size_t n, int64_t deadline_ms, char* err, size_t err_len);

/* Engine thread: pins the leading cached run of hashes[0..n) (through pin_leading_run) and
 * keeps it pinned under lease_id until a push names the lease or ttl_ms passes. *pinned (may
 * be NULL) receives the run's length. */
kvf_status kvf_worker_hold_lease(kvf_worker* worker, const char* lease_id, const uint64_t* hashes,
                                 size_t n, int64_t ttl_ms, size_t* pinned, char* err,
                                 size_t err_len);

/* Any thread (or inside pin_tier_run): the disk reads of pin_tier_run's read_id ended, and the
 * first `intact` disk blocks of its run are in their buffers, checksum checked (a missing or
 * corrupt block ends the count). Call it exactly once for every run with a disk block, and
 * after it never write to that run's buffers; a run without disk blocks needs none
 * (KVF_ERR_NOT_FOUND, as for an unknown or already reported read_id). The push waits for it
 * until its deadline (a disk block not reported by then is answered missing, and its buffer
 * stays taken until the report); kvf_worker_destroy waits up to 5 s for reads not yet reported.
 */
kvf_status kvf_worker_tier_read_done(kvf_worker* worker, uint64_t read_id, size_t intact);

/* KV events (any thread; needs kv_events_endpoint). Stored: n consecutive full blocks of one
 * chain, token_ids holding n * block_size tokens; parent is the block before the first one
 * when has_parent. */
kvf_status kvf_worker_publish_stored(kvf_worker* worker, const uint64_t* hashes, size_t n,
                                     int has_parent, uint64_t parent, const uint32_t* token_ids,
                                     size_t num_tokens, char* err, size_t err_len);
kvf_status kvf_worker_publish_removed(kvf_worker* worker, const uint64_t* hashes, size_t n,
                                      char* err, size_t err_len);
kvf_status kvf_worker_publish_cleared(kvf_worker* worker, char* err, size_t err_len);

/* "ok", "invalid_argument", ... */
const char* kvf_status_name(kvf_status status);

#ifdef __cplusplus
}
#endif
