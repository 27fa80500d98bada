// Internal to worker/agent*.cc and push_*.cc: the state behind WorkerAgent. Agent-thread state
// and engine-thread state are separate members, and the engine thread is reached only through
// onEngineThread(). Not part of the API (include worker/agent.h).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "absl/container/flat_hash_map.h"
#include "common/http_client.h"
#include "common/http_server.h"
#include "common/metrics.h"
#include "common/steady_time.h"
#include "worker/agent.h"

namespace kvf::worker {
namespace agent_internal {

using kvf::kAwait;
using kvf::Steady;
using kvf::steadyNanos;
using kvf::toTimePoint;
inline constexpr Nanos kMs = kNanosPerMilli;

// At least 1 ms from now until `deadline` (steady nanoseconds).
inline std::chrono::milliseconds msUntil(Nanos deadline) {
  return std::chrono::milliseconds(std::max<Nanos>(1, (deadline - steadyNanos()) / kMs));
}

// What the receiver knows about a holder's worker (agent thread; dropped after a failure).
struct SourceWorker {
  std::shared_ptr<http::HttpClient> client;
  std::optional<protocol::WorkerInfo> info;
  std::string transport_address;  // decoded
};

// A landing this receiver asked a holder to fill: what the holder may claim (agent thread).
struct OpenLanding {
  std::vector<uint64_t> block_addrs;
  bool claimed = false;
};

// How moving the blocks of one fetch went, before the engine is told (push_receiver.cc).
struct TransferResult {
  size_t landed = 0;  // leading landing blocks filled and verified by the transport
  uint64_t bytes = 0;
  std::string reason;  // why not everything arrived (empty when all did)
  bool writes_may_arrive = false;
  // Watched until no write can reach the landing blocks: the landing (push) or the get (NIXL).
  std::shared_ptr<transport::Landing> landing;
  std::shared_ptr<transport::PutHandle> get;
};

// Blocks of the bounce region (disk blocks on their way to a receiver): taken by a push on the
// agent thread, given back by whoever drops the last reference to a push's TierReads.
struct BouncePool {
  std::mutex mu;
  std::vector<uint32_t> free;
};

// The disk reads of one push, shared by its coroutine and the store thread that finishes them:
// its bounce blocks go back to the pool only once both are done with them.
struct TierReads {
  explicit TierReads(std::shared_ptr<BouncePool> pool_in) : pool(std::move(pool_in)) {}
  ~TierReads() {
    if (pool == nullptr) return;
    std::lock_guard lock(pool->mu);
    pool->free.insert(pool->free.end(), slots.begin(), slots.end());
  }
  std::shared_ptr<BouncePool> pool;
  std::vector<uint32_t> slots;  // bounce blocks this push holds
  // Agent thread from here on.
  bool done = false;
  size_t intact = 0;                     // leading disk blocks read intact
  asio::steady_timer* waiter = nullptr;  // the coroutine waiting for `done`, if any
};

// What a push pinned on the engine thread: the pool's leading run, then the lower tiers' run.
struct HolderPins {
  std::vector<BlockIndex> pool;
  TierPushRun tier;
  size_t tier_served = 0;  // leading blocks of `tier` that can be sent (disk reads intact)
};

// One put of a push: consecutive blocks that come from one registered region.
struct PushSegment {
  // The pool's, the host tier's or the bounce region: which one says where the blocks came from.
  std::shared_ptr<transport::MemoryRegion> source;
  std::vector<transport::BlockCopy> blocks;
};

}  // namespace agent_internal

struct WorkerAgent::Impl {
  Impl(asio::io_context& ioc_in, EngineAdapter& adapter_in,
       std::unique_ptr<transport::TransportContext> transport_in, AgentOptions options_in)
      : ioc(ioc_in),
        adapter(adapter_in),
        transport(std::move(transport_in)),
        options(std::move(options_in)),
        geometry(adapter.geometry()),
        lease_timer(ioc_in) {}

  // Immutable after create().
  asio::io_context& ioc;
  EngineAdapter& adapter;
  std::unique_ptr<transport::TransportContext> transport;
  std::shared_ptr<transport::MemoryRegion> pool_region;  // the adapter's payload, registered
  // Pushes served from the engine's lower tiers (when its adapter offers them): the host tier's
  // memory, registered, and the bounce region disk blocks are read into (bounce_stride each).
  std::shared_ptr<transport::MemoryRegion> tier_region;
  std::shared_ptr<transport::MemoryRegion> bounce_region;
  uint64_t bounce_stride = 0;
  std::shared_ptr<agent_internal::BouncePool> bounce;
  // Disk reads handed to the engine whose completion has not arrived: the agent's destruction
  // waits for them (they write into the bounce region, which goes with the transport).
  std::shared_ptr<std::atomic<int64_t>> tier_reads_in_flight =
      std::make_shared<std::atomic<int64_t>>(0);
  AgentOptions options;
  BlockGeometry geometry;
  protocol::PushLimits limits;
  std::unique_ptr<http::HttpServer> server;

  // Agent thread.
  absl::flat_hash_map<std::string, std::shared_ptr<agent_internal::SourceWorker>> sources;
  // Landings whose push is outstanding, by landing id: a holder claims one (POST /kv/claim)
  // before it writes; closed once the holder answered or the fetch gave up.
  absl::flat_hash_map<uint64_t, agent_internal::OpenLanding> open_landings;
  asio::steady_timer lease_timer;
  bool stopping = false;

  // Engine thread.
  LeaseTable leases;
  std::atomic<size_t> lease_count{0};    // leases.size(), for any thread
  std::atomic<size_t> leased_blocks{0};  // leases.blocks(), for any thread
  void publishLeaseCounts() {
    lease_count.store(leases.size());
    leased_blocks.store(leases.blocks());
  }
  std::atomic<int64_t> unresolved_landings{0};

  struct Metrics {
    metrics::Counter *served_ok = nullptr, *served_empty = nullptr, *served_failed = nullptr;
    metrics::Counter* bytes_out = nullptr;
    metrics::Histogram* serve_seconds = nullptr;
    metrics::Counter *fetch_ok = nullptr, *fetch_partial = nullptr, *fetch_fallback = nullptr;
    metrics::Counter* bytes_in = nullptr;
    metrics::Histogram* fetch_seconds = nullptr;
    metrics::Counter* leases_expired = nullptr;
    metrics::Counter *nixl_meta_served = nullptr, *nixl_notified = nullptr;
    // Side-channel requests naming no live lease (unknown, expired or released), by route.
    metrics::Counter *nixl_meta_refused = nullptr, *nixl_notify_refused = nullptr;
    // Holder: pushes refused before any write; receiver: claims refused.
    metrics::Counter *refused_not_a_peer = nullptr, *refused_not_granted = nullptr,
                     *refused_mismatch = nullptr;
    metrics::Counter *claim_unknown = nullptr, *claim_repeated = nullptr;
    // Holder: blocks pushed by the tier they were served from (pool, host memory, disk), and
    // pushes whose disk blocks did not all fit in the bounce region.
    metrics::Counter *pushed_gpu = nullptr, *pushed_cpu = nullptr, *pushed_disk = nullptr;
    metrics::Counter* bounce_full = nullptr;
  } m;
  metrics::Registry own_registry;  // when create() got none

  // Registers the adapter's tier memory and allocates the bounce region, when it has tiers.
  absl::Status prepareTierPush();
  void registerMetrics(metrics::Registry& registry);
  void registerRoutes();
  bool authorized(const http::Request& req) const;
  // A request to a peer's control server, carrying this agent's token.
  http::ClientRequest peerRequest(std::string method, std::string target, std::string body,
                                  std::chrono::milliseconds timeout) const;
  asio::awaitable<void> handleKvInfo(const http::Request& req, http::ResponseWriter& w);
  asio::awaitable<void> handleKvPush(const http::Request& req, http::ResponseWriter& w);
  asio::awaitable<void> handleKvClaim(const http::Request& req, http::ResponseWriter& w);
  std::string advertisedUrl() const;
  // The cached HTTP client state for a peer's worker URL (created on first use; the cache is
  // bounded: beyond it the whole cache is dropped and rebuilt).
  absl::StatusOr<std::shared_ptr<agent_internal::SourceWorker>> workerAt(const std::string& url);

  // Holder side (push_holder.cc).
  asio::awaitable<absl::StatusOr<protocol::PushResponse>> servePush(protocol::PushRequest req);
  // Pins the pool's leading run of the push's blocks, then the lower tiers' run after it, and
  // waits (within the push's deadline) for its disk blocks to be read into bounce blocks.
  asio::awaitable<agent_internal::HolderPins> pinForPush(
      const protocol::PushRequest& req, Nanos deadline,
      std::shared_ptr<agent_internal::TierReads> reads);
  // The puts that send the served run, in order, each from the region its blocks are in.
  std::vector<agent_internal::PushSegment> planPush(const protocol::PushRequest& req,
                                                    const agent_internal::HolderPins& pins,
                                                    const agent_internal::TierReads& reads) const;
  // Sends the segments one put after the other; the last one carries the landing's notice
  // (covering every block, with the checksums the earlier puts computed).
  asio::awaitable<absl::StatusOr<transport::PutResult>> putSegments(
      const protocol::PushRequest& req, std::vector<agent_internal::PushSegment> segments,
      std::string peer, std::string rkey, Nanos received);
  // Claims the push's landing from the receiver's worker API; the grant must match the request.
  asio::awaitable<absl::StatusOr<protocol::LandingGrant>> claimLanding(
      const protocol::PushRequest& req);
  // Receiver side (push_receiver.cc).
  asio::awaitable<void> runFetch(RemoteKvFetch fetch);
  asio::awaitable<agent_internal::TransferResult> transferBlocks(const RemoteKvFetch& fetch,
                                                                 Nanos deadline);
  asio::awaitable<absl::StatusOr<std::shared_ptr<agent_internal::SourceWorker>>> sourceWorker(
      const std::string& url, Nanos deadline);
  asio::awaitable<void> awaitResolved(std::string id, agent_internal::TransferResult result);
  // NixlConnector dialect (nixl_agent.cc): the holder's side channel and the reader.
  asio::awaitable<void> handleNixlMeta(const http::Request& req, http::ResponseWriter& w);
  asio::awaitable<void> handleNixlNotify(const http::Request& req, http::ResponseWriter& w);
  asio::awaitable<agent_internal::TransferResult> readNixlBlocks(const RemoteKvFetch& fetch,
                                                                 Nanos deadline);
  // postGet as a coroutine on the agent thread; `*handle` receives the get (to watch drained()).
  asio::awaitable<absl::StatusOr<transport::PutResult>> asyncRead(
      const transport::GetRequest& get, std::shared_ptr<transport::PutHandle>* handle);

  // Leases (engine thread, but for leaseLoop).
  void releaseLease(const std::string& lease_id);
  asio::awaitable<void> leaseLoop();

  // Runs `fn` on the engine thread; the calling coroutine resumes on the agent thread with its
  // result (`fn` must return a value).
  template <class Fn>
  asio::awaitable<std::invoke_result_t<Fn&>> onEngineThread(Fn fn) {
    using R = std::invoke_result_t<Fn&>;
    auto init = [this, &fn](auto handler) {
      auto shared = std::make_shared<decltype(handler)>(std::move(handler));
      adapter.post([this, fn = std::move(fn), shared]() mutable {
        R result = fn();
        asio::post(
            ioc, [shared, result = std::move(result)]() mutable { (*shared)(std::move(result)); });
      });
    };
    co_return co_await asio::async_initiate<const asio::use_awaitable_t<>, void(R)>(
        init, asio::use_awaitable);
  }
};

}  // namespace kvf::worker
