// Internal: the state behind TransportContext. Core owns the UCX context and worker, the
// progress thread, the endpoint cache and every in-flight put and landing. Everything except
// post(), the stats atomics and the handle objects' own mutexes is touched only by the progress
// thread. Not part of the public API (include transport/transport.h instead).
#pragma once

#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/clock.h"
#include "transport/peer_identity.h"
#include "transport/remote_key.h"
#include "transport/transport.h"

namespace kvf::transport {

class Core;

// The completion notice a sender posts (active message kNoticeAmId) after a batch's flush:
// a NoticeHeader, then `count` NoticeBlocks in the sender's block order.
inline constexpr unsigned kNoticeAmId = 7;
inline constexpr uint32_t kNoticeMagic = 0x4e46564b;  // "KVFN"
inline constexpr uint32_t kNoticeHasChecksums = 1;

struct NoticeHeader {
  uint32_t magic;
  uint32_t count;
  uint64_t landing_id;
  uint32_t flags;
  uint32_t reserved;
};

// NoticeBlock (transport.h) is the wire record of each block.
static_assert(sizeof(NoticeBlock) == 24);

// RAII for a file descriptor.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  ~UniqueFd();
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

class RegionImpl final : public MemoryRegion, public std::enable_shared_from_this<RegionImpl> {
 public:
  RegionImpl(std::shared_ptr<Core> core, void* ptr, uint64_t length, ucp_mem_h memh,
             std::string rkey);
  ~RegionImpl() override;
  uint64_t base() const override { return reinterpret_cast<uint64_t>(ptr_); }
  uint64_t length() const override { return length_; }
  const std::string& packedRkey() const override { return rkey_; }
  uint32_t activeUsers() const override { return users_.load(); }
  void release(std::function<void()> done) override;

  void* data() const override { return ptr_; }
  char* bytes() const { return static_cast<char*>(ptr_); }
  bool contains(uint64_t addr, uint64_t len) const {
    return addr >= base() && len <= length_ && addr - base() <= length_ - len;
  }
  // Progress thread only.
  bool releasing() const { return release_requested_; }
  void addUser() { users_.fetch_add(1); }
  void dropUser();
  void unmapNow();  // progress thread, or after the thread stopped

 private:
  friend class Core;
  std::shared_ptr<Core> core_;
  void* ptr_;
  uint64_t length_;
  ucp_mem_h memh_;
  std::string rkey_;
  std::atomic<uint32_t> users_{0};
  bool release_requested_ = false;
  std::function<void()> release_done_;
};

// Completion state shared by a handle, its caller and the progress thread. Completing costs the
// progress thread a wakeup only when a caller sleeps on this completion: pollers (done()/check(),
// the NIXL post-then-check pattern) and callers waiting on a later batch cost it nothing. Waking
// a sleeping thread costs the waker 6-15 us on this VM (an IPI), ~10% of the copy time of a
// 16 KiB x 256-block batch over shared memory.
template <class T>
class Completion {
 public:
  bool done() const { return done_.load(std::memory_order_acquire); }
  bool waitFor(std::chrono::milliseconds timeout) const {
    if (done()) return true;
    std::unique_lock lock(mu_);
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    bool ok = cv_.wait_for(lock, timeout, [&] { return done(); });
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
    return ok;
  }
  // First call wins; returns false if already completed.
  bool complete(T value) {
    {
      std::lock_guard lock(mu_);
      if (done_.load(std::memory_order_relaxed)) return false;
      value_ = std::move(value);
      done_.store(true, std::memory_order_seq_cst);
    }
    // A waiter registers under mu_ before it checks done() and sleeps: either it saw done, or
    // its registration is visible here.
    if (sleepers_.load(std::memory_order_seq_cst) > 0) cv_.notify_all();
    return true;
  }
  // The outcome once done(); the "pending" placeholder before. Never written after done().
  const T& value() const { return done() ? value_ : pending(); }

 private:
  static const T& pending() {
    static const T kPending{absl::UnavailableError("pending")};
    return kPending;
  }
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable std::atomic<uint32_t> sleepers_{0};
  std::atomic<bool> done_{false};
  T value_{absl::UnavailableError("pending")};
};

struct PutOp {
  uint64_t local_offset;
  uint64_t remote_addr;
  uint64_t length;
};

// The coalesced operations for `blocks` (adjacent on both sides merged), in local order.
std::vector<PutOp> coalesceBlocks(const std::vector<BlockCopy>& blocks);
// Parses a peer's packed remote key (remote_key.h) and checks every block's remote range against
// the region it describes; the caller hands UCX only the returned key's `ucx` bytes.
absl::StatusOr<RemoteKey> checkRemote(std::string_view peer_rkey,
                                      const std::vector<BlockCopy>& blocks);

class Batch final : public PutHandle, public std::enable_shared_from_this<Batch> {
 public:
  Batch(std::shared_ptr<Core> core, uint64_t id) : core_(std::move(core)), id_(id) {}
  bool done() const override { return completion_.done(); }
  absl::Status check() const override;
  bool waitFor(std::chrono::milliseconds timeout) const override {
    return completion_.waitFor(timeout);
  }
  absl::StatusOr<PutResult> result() const override;
  void cancel() override;
  bool drained() const override { return done() && drained_.load(std::memory_order_acquire); }

  // Progress-thread state.
  std::shared_ptr<Core> core_;
  uint64_t id_;
  PutRequest request;
  PutCallback callback;
  std::vector<PutOp> ops;
  PutResult partial;
  std::string notice;  // completion notice payload (blocks + checksums) when landing_id != 0
  Nanos posted_at = 0;
  Nanos deadline_at = 0;
  std::string peer_key;
  bool source_held = false;
  // UCX requests of this batch not completed yet (puts, flush, notice). While > 0 the batch
  // keeps itself alive (callbacks carry a raw pointer) and holds its source region: UCX may
  // still read it, even after a force close (pending sends on shared memory are not purged).
  uint32_t outstanding = 0;
  ucs_status_t put_error = UCS_OK;
  // A get: request.source is the destination, the ops read from the peer (ucp_get_nbx), and
  // `expected` holds the holder's checksums (empty: none).
  bool get = false;
  std::vector<uint64_t> expected;
  std::atomic<bool> drained_{true};
  std::shared_ptr<Batch> self_ref;
  Completion<absl::StatusOr<PutResult>> completion_;
};

class LandingImpl final : public Landing, public std::enable_shared_from_this<LandingImpl> {
 public:
  LandingImpl(std::shared_ptr<Core> core, uint64_t id) : core_(std::move(core)), id_(id) {}
  uint64_t id() const override { return id_; }
  bool done() const override { return completion_.done(); }
  absl::Status check() const override { return completion_.value(); }
  bool waitFor(std::chrono::milliseconds timeout) const override {
    return completion_.waitFor(timeout);
  }
  bool resolved() const override { return resolved_.load(); }
  void cancel() override;
  uint32_t landedBlocks() const override { return landed_.load(); }
  void dismiss() override;

  std::shared_ptr<Core> core_;
  uint64_t id_;
  std::shared_ptr<RegionImpl> region;
  LandingSpec spec;
  LandingCallback callback;
  Nanos deadline_at = 0;
  std::string peer_key;
  std::atomic<bool> resolved_{false};
  std::atomic<uint32_t> landed_{0};
  Completion<absl::Status> completion_;
};

struct Peer {
  std::string key;  // the encoded peer address (cache key)
  PeerIdentity identity;
  ucp_ep_h ep = nullptr;
  bool peer_error_mode = false;
  Nanos last_used = 0;
  UniqueFd pidfd;
  std::unordered_map<std::string, ucp_rkey_h> rkeys;
  std::unordered_map<Batch*, std::shared_ptr<Batch>> batches;
  std::unordered_map<LandingImpl*, std::shared_ptr<LandingImpl>> landings;
};

class Core : public std::enable_shared_from_this<Core> {
 public:
  static absl::StatusOr<std::shared_ptr<Core>> create(const TransportOptions& options);
  ~Core();

  void start();
  void shutdown();  // from the owner's thread; joins the progress thread
  // Queues `fn` for the progress thread (never inline, so callbacks can post). False once stopped.
  bool post(std::function<void()> fn);
  // Runs `fn` on the progress thread and waits for it.
  template <class T>
  T call(std::function<T()> fn);
  bool onProgressThread() const { return std::this_thread::get_id() == thread_.get_id(); }

  const TransportOptions& options() const { return options_; }
  const std::string& address() const { return address_; }
  const std::string& tls() const { return tls_; }
  bool cudaMemory() const { return cuda_memory_; }
  ucp_context_h ucpContext() const { return context_; }

  absl::StatusOr<std::shared_ptr<MemoryRegion>> registerMemory(void* ptr, uint64_t length);
  absl::StatusOr<std::shared_ptr<MemoryRegion>> allocateMemory(uint64_t length);
  absl::StatusOr<std::shared_ptr<MemoryRegion>> mapMemory(void* ptr, uint64_t length);
  absl::Status connect(const std::string& peer_address);
  absl::StatusOr<std::shared_ptr<PutHandle>> postPut(PutRequest request, PutCallback done);
  absl::StatusOr<std::shared_ptr<PutHandle>> postGet(GetRequest request, PutCallback done);
  absl::StatusOr<std::shared_ptr<Landing>> expectPut(const std::shared_ptr<MemoryRegion>& region,
                                                     LandingSpec spec, LandingCallback done);
  absl::Status disconnect(const std::string& peer_address);
  TransportStats stats() const;

  // Progress thread only (used by handles and callbacks).
  void cancelBatch(Batch* batch, absl::Status status);
  void cancelLanding(LandingImpl* landing);
  void dismissLanding(LandingImpl* landing);
  void finishBatch(Batch& batch, absl::StatusOr<PutResult> result);
  void opStarted(Batch& batch);
  void opDone(Batch* batch);
  void untrackBatch(Batch& batch);
  void flushed(const std::shared_ptr<Batch>& batch, ucs_status_t status);
  void onFlushDone(Batch* batch, ucs_status_t status);
  void finishGet(Batch* batch);
  void onNoticeSent(Batch* batch, ucs_status_t status);
  void onNotice(const void* header, size_t header_len, const void* data, size_t len);
  void onEndpointError(ucp_ep_h ep, ucs_status_t status);

  struct Stats {
    std::atomic<uint64_t> puts_ok{0}, puts_failed{0}, bytes_put{0}, landings_ok{0},
        landings_failed{0}, gets_ok{0}, gets_failed{0}, bytes_got{0}, checksum_mismatches{0},
        peer_failures{0}, endpoints_created{0}, puts_refused{0}, gets_refused{0},
        notices_refused{0};
    std::atomic<uint32_t> endpoints_cached{0};
  } stats_;

 private:
  explicit Core(TransportOptions options) : options_(std::move(options)) {}
  absl::Status init();
  void run();
  bool runCommands();
  void housekeeping(Nanos now, int timeout_ms);
  void checkDeadlines(Nanos now);
  Nanos nextDeadline() const;

  absl::StatusOr<Peer*> getPeer(const std::string& key, bool* created);
  absl::StatusOr<ucp_rkey_h> getRkey(Peer& peer, const std::string& bytes, bool* created);
  void closePeer(Peer* peer, const absl::Status& status, bool peer_exited = false,
                 bool graceful = false);
  void evictIdlePeer();
  void startBatch(const std::shared_ptr<Batch>& batch);
  std::shared_ptr<Batch> newBatch(std::chrono::milliseconds deadline);
  void sendNotice(Batch* batch);
  void startLanding(const std::shared_ptr<LandingImpl>& landing);
  void finishLanding(LandingImpl& landing, absl::Status status, bool resolved);
  void resolveLanding(LandingImpl& landing);
  void reapClosing();

  TransportOptions options_;
  std::string tls_;
  bool shm_only_ = false;
  bool cuda_memory_ = false;
  SteadyClock clock_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
  PeerIdentity identity_;
  UniqueFd epoll_fd_, event_fd_;
  int worker_fd_ = -1;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stopped_{false};
  std::mutex queue_mu_;
  std::vector<std::function<void()>> queue_;

  // Progress thread state.
  std::unordered_map<std::string, std::unique_ptr<Peer>> peers_;
  std::unordered_map<uint64_t, std::shared_ptr<LandingImpl>> landings_;
  std::unordered_set<RegionImpl*> regions_;
  struct Closing {
    void* request;
    std::vector<ucp_rkey_h> rkeys;
  };
  std::list<Closing> closing_;
  uint32_t busy_batches_ = 0;  // batches with UCX requests outstanding
  std::atomic<uint64_t> next_id_{1};
  friend class RegionImpl;
};

template <class T>
T Core::call(std::function<T()> fn) {
  if (onProgressThread() || !thread_.joinable()) return fn();
  std::promise<T> promise;
  auto future = promise.get_future();
  if (!post([&] { promise.set_value(fn()); })) {
    return T(absl::FailedPreconditionError("transport context is shut down"));
  }
  return future.get();
}

}  // namespace kvf::transport
