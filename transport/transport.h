// UCX data plane for KV blocks, in NIXL's vocabulary: prepare (create a context, register memory
// once, exchange the worker address and packed rkey as opaque bytes), post (a batched put with
// one completion), check (PutHandle / Landing), release (regions are handed back only when no
// peer can still write into them). A TransportContext owns one UCX worker and the progress
// thread that is the only caller of ucp_*; every public method is safe from any thread, and
// completion callbacks run on that progress thread (wrap them with transport/asio_completion.h
// to run them on an Asio executor). Objects returned here are shared with the progress thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvf::transport {

struct TransportOptions {
  // Name used in logs and metrics.
  std::string name = "kvf";
  // "shm" (posix/sysv/cma shared memory, same host), "tcp", "rdma" (verbs + shm), "all", or a
  // UCX_TLS-style list ("posix,cma,tcp"). Validated by create().
  std::string transports = "shm";
  // Network devices for tcp/rdma (UCX_NET_DEVICES), e.g. "lo", "eth0", "mlx5_0:1". Empty: all.
  std::string net_devices;
  // Deadline of a put or landing that does not set its own. Must be > 0.
  std::chrono::milliseconds default_deadline{1000};
  // UCX keepalive on endpoints with peer error handling (detects silent peers). Must be > 0.
  std::chrono::milliseconds keepalive_interval{200};
  // After any activity the progress thread spins this long before sleeping on the worker's
  // event fd; longer lowers latency and costs CPU.
  std::chrono::microseconds busy_poll{200};
  // Longest sleep of an idle progress thread (a safety net should the worker's event fd miss an
  // event; deadlines wake it on time anyway). Must be in [1, 1000].
  int64_t idle_wakeup_ms = 10;
  // Bounds on what one put may carry (peers and callers are not trusted).
  uint32_t max_blocks_per_put = 1 << 16;
  // Endpoint cache bound: beyond it the least recently used idle endpoint is closed (a peer
  // that comes back pays the setup cost again). Must be > 0.
  uint32_t max_endpoints = 1024;
};

// One block to copy: `length` bytes at `local_offset` in the source region to `remote_addr`
// in the peer's registered region.
struct BlockCopy {
  uint64_t local_offset = 0;
  uint64_t remote_addr = 0;
  uint64_t length = 0;
};

enum class ChecksumMode {
  kNone,      // no checksums
  kCompute,   // the sender computes xxh3-64 of each source block
  kProvided,  // the caller supplies one checksum per block (e.g. cached when the block was stored)
};

class MemoryRegion;

// One block of a sender's completion notice: where it wrote, how much, and the xxh3 of what it
// sent (0 without checksums).
struct NoticeBlock {
  uint64_t remote_addr;
  uint64_t length;
  uint64_t checksum;
};

struct PutRequest {
  std::shared_ptr<MemoryRegion> source;   // a region of this context
  std::string peer_address;               // the peer's workerAddress() bytes
  std::string peer_rkey;                  // the peer's packedRkey() bytes for the target region
  std::vector<BlockCopy> blocks;          // in the order the receiver expects (see Landing)
  std::chrono::milliseconds deadline{0};  // 0: TransportOptions::default_deadline
  ChecksumMode checksums = ChecksumMode::kNone;
  std::vector<uint64_t> provided_checksums;  // one per block when kProvided
  // Non-zero: after the flush, tell the receiver's Landing with this id that the batch landed,
  // with the block list and checksums, so it can verify and resolve.
  uint64_t landing_id = 0;
  // With landing_id: blocks that earlier puts to the same landing wrote and that completed
  // before this one was posted; the notice lists them first, then `blocks`. Lets a sender that
  // splits one landing over several puts (a staging ring) resolve it with a single notice.
  std::vector<NoticeBlock> notice_prefix;
};

struct PutResult {
  uint64_t bytes = 0;
  uint32_t blocks = 0;
  uint32_t operations = 0;              // puts issued after coalescing adjacent blocks
  std::vector<uint64_t> checksums;      // per block, when checksums were on
  std::chrono::nanoseconds elapsed{0};  // post to completion
  bool new_endpoint = false;            // this put paid the endpoint/rkey setup cost
};

using PutCallback = std::function<void(absl::StatusOr<PutResult>)>;

// A posted put. check() answers without blocking. cancel() (and a missed deadline) completes it
// with kCancelled (kDeadlineExceeded) at once; puts already handed to UCX drain in the background
// and keep the source region held until UCX is done with them (see MemoryRegion::release).
class PutHandle {
 public:
  virtual ~PutHandle() = default;
  virtual bool done() const = 0;
  // kUnavailable "pending" while not done; else the final status.
  virtual absl::Status check() const = 0;
  // Blocks the calling thread (never the progress thread) until done or `timeout`.
  virtual bool waitFor(std::chrono::milliseconds timeout) const = 0;
  // The result once done(); an error status otherwise.
  virtual absl::StatusOr<PutResult> result() const = 0;
  virtual void cancel() = 0;
  // True once UCX no longer touches this transfer's local memory. A put or get abandoned by
  // cancel() or its deadline is done() at once but drains in the background: a get's
  // destination blocks must not be reused before this turns true.
  virtual bool drained() const { return done(); }
};

// One-sided read: copy blocks out of a peer's registered region into a region of this context,
// without the peer's CPU taking part (the NIXL READ a decode instance issues). The peer is not
// trusted: it advertised its region's bounds with its rkey, and every remote range must lie
// inside them; what was read is checked against the checksums the holder published, when given.
struct GetRequest {
  std::shared_ptr<MemoryRegion> destination;  // a region of this context (BlockCopy::local_offset)
  std::string peer_address;                   // the peer's workerAddress() bytes
  // The peer's packedRkey() bytes for its region: they carry the region's bounds, and every
  // remote range must lie inside them.
  std::string peer_rkey;
  std::vector<BlockCopy> blocks;          // remote_addr in the peer's region -> local_offset here
  std::chrono::milliseconds deadline{0};  // 0: TransportOptions::default_deadline
  // Empty, or one xxh3-64 per block as the holder computed it: any mismatch fails the get with
  // kDataLoss (the holder's block changed under the read, or the bytes were damaged).
  std::vector<uint64_t> expected_checksums;
  // Return the xxh3-64 of every block read in PutResult::checksums (implied by
  // expected_checksums).
  bool compute_checksums = false;
};

// What a receiver expects a sender to write into one of its regions.
struct LandingSpec {
  std::string sender_address;     // the sender's workerAddress() bytes
  std::vector<BlockCopy> blocks;  // remote_addr/length inside the region (local_offset unused)
  std::chrono::milliseconds deadline{0};  // 0: default
  bool verify_checksums = false;          // require and verify the sender's per-block xxh3
  // The sender may deliver a leading prefix of `blocks` (at least one block; KV push when the
  // holder has only part of the run). Landing::landedBlocks() says how many arrived.
  bool allow_prefix = false;
};

using LandingCallback = std::function<void(absl::Status)>;

// The receiver side of one batch. The callback gets OK once the sender's completion notice
// arrives (and checksums match), kDataLoss on a mismatch, kUnavailable when the sender dies or
// its endpoint fails, kDeadlineExceeded at the deadline, kCancelled on cancel(). The landing
// stays *unresolved* - and its region cannot be released - until the sender is known complete
// or gone: a timed-out or cancelled landing whose sender is alive is quarantined.
class Landing {
 public:
  virtual ~Landing() = default;
  virtual uint64_t id() const = 0;  // what the sender puts in PutRequest::landing_id
  virtual bool done() const = 0;
  virtual absl::Status check() const = 0;
  virtual bool waitFor(std::chrono::milliseconds timeout) const = 0;
  // True once no write from the sender can arrive any more.
  virtual bool resolved() const = 0;
  virtual void cancel() = 0;
  // Blocks the sender's notice covered (all of spec.blocks unless allow_prefix); 0 until OK.
  virtual uint32_t landedBlocks() const = 0;
  // The sender said on the control channel that it posted no put for this landing (it holds
  // none of the blocks, or it refused the request before posting): completes with kCancelled
  // and resolves at once. Never call it while the sender may still have a put in flight.
  virtual void dismiss() = 0;
};

// Registered memory (a whole KV pool, not one block). For registerMemory() the caller owns the
// bytes; they must stay valid until release()'s callback ran (or, without release(), until the
// context is destroyed). For allocateMemory() UCX owns them and frees them on release.
class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  virtual void* data() const = 0;
  virtual uint64_t base() const = 0;  // data() as the integer peers put in BlockCopy
  virtual uint64_t length() const = 0;
  virtual const std::string& packedRkey() const = 0;
  // Puts reading from it plus landings into it that are not resolved yet.
  virtual uint32_t activeUsers() const = 0;
  // Refuses new puts and landings, and calls `done` (on the progress thread) once every put and
  // landing using the region is resolved and the UCX registration is gone: only then may the
  // memory be reused or freed.
  virtual void release(std::function<void()> done) = 0;
};

struct TransportStats {
  uint64_t puts_ok = 0;
  uint64_t puts_failed = 0;
  uint64_t bytes_put = 0;
  uint64_t landings_ok = 0;
  uint64_t landings_failed = 0;
  uint64_t gets_ok = 0;
  uint64_t gets_failed = 0;
  uint64_t bytes_got = 0;
  uint64_t checksum_mismatches = 0;
  uint64_t peer_failures = 0;
  uint64_t endpoints_created = 0;
  uint32_t endpoints_cached = 0;
  // Puts refused before any UCX call: a malformed remote key, or a remote range outside the
  // region the key describes.
  uint64_t puts_refused = 0;
  // Completion notices naming no outstanding landing (unknown, already closed, or malformed).
  uint64_t notices_refused = 0;
  // Gets refused before any UCX call: a malformed remote key, or a remote range outside the
  // region the key describes.
  uint64_t gets_refused = 0;
};

class TransportContext {
 public:
  virtual ~TransportContext() = default;

  // Creates the UCX context and worker and starts the progress thread.
  static absl::StatusOr<std::unique_ptr<TransportContext>> create(const TransportOptions& options);

  // The transports UCX resolved ("shm", "tcp", ...), and whether peer failure is detected by
  // UCX (peer error mode) or only by process liveness + keepalive + deadlines.
  virtual std::string transportsInUse() const = 0;

  // Capability: UCX here can register and put CUDA device memory directly (a CUDA-aware UCX
  // build). When false, serve device pools through transport/cuda_staging.h.
  virtual bool supportsCudaMemory() const = 0;

  // Opaque bytes to give a peer (base64 for JSON): UCX worker address plus process identity.
  virtual const std::string& workerAddress() const = 0;

  // prepare: registers [ptr, ptr+length) once; the region packs its remote key.
  virtual absl::StatusOr<std::shared_ptr<MemoryRegion>> registerMemory(void* ptr,
                                                                       uint64_t length) = 0;

  // prepare: allocates and registers `length` bytes owned by UCX - shared memory when a shm
  // transport is selected, so same-host peers write into it with one-sided copies (tens of GB/s)
  // rather than active messages. Prefer this for a landing pool (KV pool) on a host.
  virtual absl::StatusOr<std::shared_ptr<MemoryRegion>> allocateMemory(uint64_t length) = 0;

  // prepare: creates (or finds) the cached endpoint to a peer; optional, postPut does it too.
  virtual absl::Status connect(const std::string& peer_address) = 0;

  // post: validates the request (bounds, counts, checksums), computes kCompute checksums on the
  // calling thread (xxh3, several GB/s), then the progress thread issues the coalesced puts,
  // flushes and calls `done` exactly once.
  virtual absl::StatusOr<std::shared_ptr<PutHandle>> postPut(PutRequest request,
                                                             PutCallback done) = 0;

  // post: a batched one-sided read (see GetRequest), validated like postPut, coalesced, with one
  // completion: `done` gets the bytes and blocks read, kDataLoss on a checksum mismatch,
  // kUnavailable when the peer dies, kDeadlineExceeded at the deadline. The destination region
  // stays held until the reads drained (PutHandle::drained()), even after a deadline.
  virtual absl::StatusOr<std::shared_ptr<PutHandle>> postGet(GetRequest request, PutCallback done) {
    (void)request;
    (void)done;
    return absl::UnimplementedError("this transport has no one-sided read");
  }

  // Receiver: registers an expected batch into `region`; `done` is called exactly once.
  virtual absl::StatusOr<std::shared_ptr<Landing>> expectPut(
      const std::shared_ptr<MemoryRegion>& region, LandingSpec spec, LandingCallback done) = 0;

  // Closes the cached endpoint to a peer; puts in flight to it fail with kAborted. Refused
  // (kFailedPrecondition) while a landing from that peer is unresolved: closing our endpoint
  // would not stop its writes.
  virtual absl::Status disconnect(const std::string& peer_address) = 0;

  virtual TransportStats stats() const = 0;
};

// xxh3-64 of a block, as used by ChecksumMode::kCompute and Landing verification.
uint64_t blockChecksum(const void* data, uint64_t length);

// The receiver's check of a completion notice against its landing: the blocks must be
// spec.blocks (with spec.allow_prefix, a non-empty leading part of them), and with
// spec.verify_checksums the bytes that landed - read from `region_data`, which holds remote
// address `region_base` - must have the sender's checksums. kDataLoss naming the block
// otherwise; `*checksum_mismatch` says whether a checksum was the reason. Every backend's
// Landing applies this rule.
absl::Status verifyNotice(const LandingSpec& spec, const std::vector<NoticeBlock>& blocks,
                          bool has_checksums, const void* region_data, uint64_t region_base,
                          bool* checksum_mismatch);

}  // namespace kvf::transport
