// Internal to engine_*.cc: the live engine as three objects. EngineShared holds what both
// threads read (configuration, clocks, metrics, the stats snapshot). EngineCoreSide is owned by
// the core thread: the EngineCore, its step loop and timers, and the worker::EngineAdapter that
// the worker agent reaches the core through. EngineHttpSide is owned by the HTTP thread: the
// HTTP server, requests waiting for tokens and the requests' remote-KV options. The two sides
// talk only by posting to each other's io_context, so which thread owns a piece of state is the
// type that holds it.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "absl/container/flat_hash_map.h"
#include "common/http_server.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/steady_time.h"
#include "engine/engine_server.h"
#include "engine/live_tiers.h"
#include "engine/openai_api.h"
#include "protocol/transfer_auth.h"
#include "worker/agent.h"
#include "worker/engine_adapter.h"
#include "worker/kv_event_publisher.h"
#include "worker/tier_push.h"

namespace kvf::engine {
namespace detail {

using kvf::kAwait;
using kvf::Steady;
using kvf::steadyNanos;
using kvf::toTimePoint;
inline constexpr Nanos kMs = kNanosPerMilli;

inline double unixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A request's tokens on their way from the step loop to its HTTP handler (HTTP thread only).
struct Pending {
  explicit Pending(asio::any_io_executor ex) : signal(ex) {
    signal.expires_at(Steady::time_point::max());
  }
  asio::steady_timer signal;
  std::vector<TokenId> tokens;
  bool done = false;
  std::string finish_reason;
  int64_t cached_tokens = 0;
  int64_t tier_tokens = 0;  // of cached_tokens, onboarded from host memory or disk
  int64_t tier_disk_tokens = 0;
  int64_t prompt_tokens = 0;
  std::optional<KvTransferResult> kv_transfer_result;  // set before the request's first output
  std::optional<std::string> lease_id;                 // remote decode: the lease taken
  std::vector<BlockHash> lease_block_hashes;
  std::vector<BlockIndex> lease_blocks;
};

// A fetch the core started, as the core side keeps it until the agent's outcome.
struct FetchRecord {
  std::vector<BlockHash> hashes;
  std::vector<BlockIndex> blocks;
  Nanos started = 0;  // steady clock
};

// Receiver-side options of one request with kv_transfer_params.source.
struct FetchOptions {
  std::string source;  // worker URL
  std::string lease_id;
  int64_t deadline_ms = 0;
  std::optional<worker::NixlRead> nixl;  // a NIXL-dialect read instead of a push
};

}  // namespace detail

// Read by both threads; written before either runs, except the atomics and metrics.
struct EngineShared {
  explicit EngineShared(EngineConfig c) : config(std::move(c)) {}
  EngineConfig config;
  Nanos wall_origin = 0;  // set before either thread runs
  metrics::Registry registry;

  // Written by the core thread after every change, read by /metrics on the HTTP thread.
  struct StatsSnapshot {
    std::atomic<double> running{0}, waiting{0}, usage{0}, queries{0}, hits{0}, prompt{0},
        generation{0}, preemptions{0}, lateness_p99{0}, waiting_remote{0}, quarantined{0};
    // Queued-time prefetch: promoted, used, late, wasted, touched, then skipped by reason.
    std::array<std::atomic<double>, 5 + kPrefetchSkipCount> prefetch{};
  } snapshot;

  struct Metrics {
    metrics::Histogram *ttft = nullptr, *tpot = nullptr, *e2e = nullptr;  // HTTP thread
    metrics::Histogram *lateness = nullptr, *step_seconds = nullptr;      // core thread
    metrics::Counter *steps = nullptr, *success = nullptr, *aborted = nullptr;
    // Remote KV as this engine used it (the agent counts what landed).
    metrics::Counter *fetch_ok = nullptr, *fetch_partial = nullptr, *fetch_fallback = nullptr;
    metrics::Counter *tokens_in = nullptr, *bytes_in = nullptr;
    // Landed blocks checked against their hashes before use (core thread), and those whose
    // content did not match.
    metrics::Counter *landed_verified = nullptr, *landed_corrupt = nullptr;
    metrics::Histogram* fetch_seconds = nullptr;
    // kv_transfer_params refused: not signed by the router; do_remote_decode over the bounds.
    metrics::Counter *kv_transfer_refused = nullptr, *leases_refused = nullptr;
  } m;

  Nanos engineNow(Nanos wall) const {
    return static_cast<Nanos>(static_cast<double>(wall - wall_origin) * config.time_scale);
  }
  Nanos wallFor(Nanos engine_time) const {
    return wall_origin + static_cast<Nanos>(static_cast<double>(engine_time) / config.time_scale);
  }
  Nanos wallDuration(Nanos engine_duration) const {
    return static_cast<Nanos>(static_cast<double>(engine_duration) / config.time_scale);
  }
};

class EngineHttpSide;

// The core thread: steps the EngineCore on absolute deadlines and is the worker agent's engine
// thread. Its methods run on the core thread unless they say otherwise.
class EngineCoreSide final : public worker::EngineAdapter {
 public:
  explicit EngineCoreSide(EngineShared& shared);
  // Creates the EngineCore (its events go to this side's step buffer); before start().
  absl::Status createCore();
  // cache.payload_memory: device (a CUDA build with a device): the pool in device memory, its
  // tiers on the DeviceCopier; FailedPrecondition otherwise.
  absl::Status createDeviceCore();
  static LiveTiersOptions liveTiersOptions(const EngineConfig& config);
  // Publishes the store's metrics and serves pushes from it.
  void exportTiers(LiveTiers& tiers);

  // Wiring, before start(): the HTTP side, the publisher and the agent (both may be null).
  void connect(EngineHttpSide* http, worker::KvEventPublisher* publisher,
               worker::WorkerAgent* agent);
  void start();     // any thread, once: the core thread and its step loop
  void shutdown();  // any thread but the core thread; idempotent

  asio::io_context& ioc() { return ioc_; }
  // Immutable parts of the core, safe from any thread.
  absl::Status validate(const RequestSpec& spec) const { return core_->validate(spec); }
  const TimingModel& timing() const { return core_->timing(); }
  int64_t vocabSize() const { return core_->vocabSize(); }
  int64_t maxModelLen() const { return core_->maxModelLen(); }

  void add(RequestSpec spec, Nanos arrival, std::shared_ptr<detail::Pending> pending);
  void abort(const std::string& id);
  asio::awaitable<bool> resetPrefixCache();               // awaited from the HTTP thread
  asio::awaitable<KvPool::PayloadAudit> auditPayloads();  // awaited from the HTTP thread

  // worker::EngineAdapter (engine thread = the core thread).
  worker::BlockGeometry geometry() const override;
  worker::PayloadRegion payloadRegion() const override;
  Nanos now() const override;
  void post(absl::AnyInvocable<void() &&> fn) override;
  std::vector<BlockIndex> pinLeadingRun(std::span<const BlockHash> hashes) override;
  void unpin(std::span<const BlockHash> hashes) override;
  worker::PayloadRegion tierRegion() const override;
  worker::TierPushRun pinTierRun(std::span<const BlockHash> hashes,
                                 std::span<const std::span<std::byte>> disk_buffers,
                                 absl::AnyInvocable<void(size_t) &&> on_disk_read) override;
  void unpinTierRun(uint64_t id) override;
  void completeRemoteKv(const worker::RemoteKvOutcome& outcome) override;
  void failRemoteKv(const worker::RemoteKvOutcome& outcome) override;
  void releaseLanding(const std::string& id) override;

 private:
  asio::awaitable<void> stepLoop();
  void afterChange();  // publishStats and wake an idle loop
  void publishStats();
  void publishEvents();
  double latenessQuantile(double q) const;
  // Hands the finished remote-decode requests' leases to the agent.
  void handOverLeases(const StepResult& result);
  void settleFetch(const worker::RemoteKvOutcome& outcome, Nanos kv_ready_at);
  void reportFetch(const std::string& id, size_t used, std::string reason);

  EngineShared& shared_;
  std::unique_ptr<EngineCore> core_;
  LiveTiers* tiers_ = nullptr;  // the core's lower tiers when configured (owned by core_)
  // Pushes served from those tiers (after core_: released before the store it pins in).
  std::unique_ptr<worker::TierPushSource> tier_push_;
  EngineHttpSide* http_ = nullptr;
  worker::KvEventPublisher* publisher_ = nullptr;
  worker::WorkerAgent* agent_ = nullptr;
  asio::io_context ioc_{1};
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread thread_;
  worker::VectorEventSink step_events_;  // filled during a step, published when it ends
  asio::steady_timer step_timer_;
  asio::steady_timer wake_timer_;
  bool stopping_ = false;
  bool idle_ = true;
  Nanos last_progress_log_ = 0;
  std::deque<double> recent_lateness_;  // seconds, bounded, for the p99 gauge
  // Fetches in flight: what each asked for, to check the landed blocks' content.
  absl::flat_hash_map<std::string, detail::FetchRecord> fetches_;
};

// The HTTP thread: the OpenAI-compatible server and the requests it waits on.
class EngineHttpSide {
 public:
  EngineHttpSide(asio::io_context& ioc, EngineShared& shared, EngineCoreSide& core);
  // Binds the HTTP port (after the core exists: the limits come from it).
  absl::Status bind();
  void connect(worker::WorkerAgent* agent, worker::KvEventPublisher* publisher);
  // The key that authenticates the router's kv_transfer_params (protocol/transfer_auth.h);
  // empty (an insecure worker): they are accepted unsigned. Before start().
  void setTransferAuth(std::string key);
  void start();
  void stop();
  uint16_t port() const { return server_->port(); }
  asio::any_io_executor executor() { return ioc_.get_executor(); }

  // Posted by the core thread.
  void deliver(const std::vector<RequestOutput>& outputs, Nanos end);
  void startFetch(RemoteKvFetch fetch);
  void setTransferResult(const std::string& id, KvTransferResult result);

 private:
  void registerRoutes();
  asio::awaitable<void> handleApi(ApiKind kind, const http::Request& req, http::ResponseWriter& w);
  asio::awaitable<void> streamResponse(ApiKind kind, ParsedRequest& parsed,
                                       CompletionSummary& summary,
                                       std::shared_ptr<detail::Pending> p, const std::string& id,
                                       bool remote_decode, http::ResponseWriter& w);
  asio::awaitable<void> handleTokenize(const http::Request& req, http::ResponseWriter& w);
  asio::awaitable<void> handleModels(const http::Request& req, http::ResponseWriter& w);
  // kv_transfer_params of an API request -> the spec (receiver or remote decode).
  // `raw`: the params object as the request carried it (what the router signed).
  absl::Status applyKvTransfer(const KvTransferParams& params, const boost::json::value& raw,
                               const http::Request& req, RequestSpec& spec);
  // OK when the params come from the router (signed), or when this engine runs insecure.
  absl::Status authenticateKvTransfer(const boost::json::value& raw, const http::Request& req);
  int64_t promptBlocks(const RequestSpec& spec) const;
  boost::json::value leaseParams(const detail::Pending& p) const;
  // What a finished remote-decode request answers in kv_transfer_params: the kvfabric lease, or
  // in the nixl dialect vLLM's remote_* fields (null when no lease was taken, e.g. an abort).
  std::optional<boost::json::value> holderParams(const detail::Pending& p) const;
  // nixl dialect, D leg: P's params, signed by the router like every kv_transfer_params (an
  // unsigned or tampered leg is refused), -> a NIXL read of P's blocks (or, when they are
  // invalid, a local prefill, as vLLM's "Got invalid KVTransferParams").
  absl::Status applyNixlDecodeLeg(const boost::json::value& params, const http::Request& req,
                                  RequestSpec& spec, detail::FetchOptions* fetch,
                                  std::string* invalid);
  bool nixlDialect() const { return shared_.config.worker.kv_connector == "nixl"; }
  void recordFinished(const RequestOutput& out, Nanos end);

  asio::io_context& ioc_;
  EngineShared& shared_;
  EngineCoreSide& core_;
  std::unique_ptr<http::HttpServer> server_;
  worker::WorkerAgent* agent_ = nullptr;
  worker::KvEventPublisher* publisher_ = nullptr;
  ApiLimits limits_;
  absl::flat_hash_map<std::string, std::shared_ptr<detail::Pending>> pending_;
  absl::flat_hash_map<std::string, detail::FetchOptions> fetch_options_;
  uint64_t next_request_ = 0;
  std::optional<protocol::TransferAuthVerifier> transfer_auth_;
  // Remote-decode requests admitted and not finished: their prompts' blocks count against the
  // lease bounds before they become leases.
  int64_t pending_lease_requests_ = 0;
  int64_t pending_lease_blocks_ = 0;
  log::RateLimitedLog refused_log_;
};

// Members are destroyed in reverse: the agent (and its transport, which registered the core's
// payload memory) before the core side that owns that memory.
struct EngineServer::Impl {
  Impl(asio::io_context& ioc, EngineConfig config)
      : shared(std::move(config)), core_side(shared), http_side(ioc, shared, core_side) {}

  EngineShared shared;
  std::unique_ptr<worker::KvEventPublisher> publisher;
  EngineCoreSide core_side;
  EngineHttpSide http_side;
  std::unique_ptr<worker::WorkerAgent> agent;

  void registerMetrics();
  void registerPushMetrics();
};

}  // namespace kvf::engine
