// Internal to engine_server*.cc: the state of a live engine (HTTP server, core, publisher,
// pending requests, metrics) shared by the step loop and the HTTP handlers. io thread only.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "absl/container/flat_hash_map.h"
#include "common/http_client.h"
#include "common/http_server.h"
#include "common/metrics.h"
#include "engine/engine_server.h"
#include "engine/openai_api.h"
#include "protocol/push.h"
#include "transport/transport.h"
#include "worker/kv_event_publisher.h"

namespace kvf::engine {
namespace detail {

using Steady = std::chrono::steady_clock;
inline constexpr auto kAwait = asio::as_tuple(asio::use_awaitable);

inline Nanos steadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Steady::now().time_since_epoch())
      .count();
}

inline Steady::time_point toTimePoint(Nanos wall) {
  return Steady::time_point(
      std::chrono::duration_cast<Steady::duration>(std::chrono::nanoseconds(wall)));
}

inline double unixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A request's tokens on their way from the step loop to its HTTP handler (io thread only).
struct Pending {
  explicit Pending(asio::any_io_executor ex) : signal(ex) {
    signal.expires_at(Steady::time_point::max());
  }
  asio::steady_timer signal;
  std::vector<TokenId> tokens;
  bool done = false;
  std::string finish_reason;
  int64_t cached_tokens = 0;
  int64_t prompt_tokens = 0;
  std::optional<KvTransferResult> kv_transfer_result;  // set by the fetch before any output
  std::optional<std::string> lease_id;                 // remote decode: the lease taken
  std::vector<BlockHash> lease_block_hashes;
};

// Receiver-side options of one request with kv_transfer_params.source (HTTP thread).
struct FetchOptions {
  std::string source;  // worker URL
  std::string lease_id;
  int64_t deadline_ms = 0;
};

// What the receiver knows about a source worker (HTTP thread; dropped after a failure).
struct SourceWorker {
  std::shared_ptr<http::HttpClient> client;
  std::optional<protocol::WorkerInfo> info;
  std::string transport_address;  // decoded
};

// The outcome of moving blocks for one fetch (engine_push_fetch.cc).
struct TransferOutcome {
  size_t landed = 0;  // leading landing blocks filled and verified by the transport
  uint64_t bytes = 0;
  std::string reason;  // why not everything arrived (empty when all did)
  bool writes_may_arrive = false;
  std::shared_ptr<transport::Landing> landing;  // to watch until resolved
};

}  // namespace detail

using detail::FetchOptions;
using detail::Pending;
using detail::SourceWorker;
using detail::TransferOutcome;

// Two threads: the HTTP thread (the io_context given to create()) owns the HTTP server and
// `pending`; the core thread (core_ioc) owns the EngineCore, the step loop and step_events, so
// parsing large request bodies never delays a step deadline. They talk only by posting.
struct EngineServer::Impl {
  Impl(asio::io_context& ioc_in, EngineConfig config_in)
      : ioc(ioc_in),
        config(std::move(config_in)),
        core_ioc(1),
        core_work(asio::make_work_guard(core_ioc)),
        step_timer(core_ioc),
        wake_timer(core_ioc) {}

  asio::io_context& ioc;
  EngineConfig config;
  std::unique_ptr<http::HttpServer> http;
  std::unique_ptr<worker::KvEventPublisher> publisher;
  ApiLimits limits;

  // HTTP thread.
  absl::flat_hash_map<std::string, std::shared_ptr<Pending>> pending;
  uint64_t next_request = 0;

  // Core thread.
  asio::io_context core_ioc;
  asio::executor_work_guard<asio::io_context::executor_type> core_work;
  std::thread core_thread;
  worker::VectorEventSink step_events;  // filled during a step, published when it ends
  std::unique_ptr<EngineCore> core;
  asio::steady_timer step_timer;
  asio::steady_timer wake_timer;
  bool stopping = false;
  bool idle = true;
  Nanos last_progress_log = 0;
  std::deque<double> recent_lateness;  // seconds, bounded, for the p99 gauge

  // Written by the core thread after every change, read by /metrics on the HTTP thread.
  struct StatsSnapshot {
    std::atomic<double> running{0}, waiting{0}, usage{0}, queries{0}, hits{0}, prompt{0},
        generation{0}, preemptions{0}, lateness_p99{0}, waiting_remote{0}, leases{0},
        quarantined{0};
  } snapshot;

  Nanos wall_origin = 0;  // set before either thread runs
  metrics::Registry registry;
  metrics::Histogram* ttft = nullptr;
  metrics::Histogram* tpot = nullptr;
  metrics::Histogram* e2e = nullptr;
  metrics::Histogram* lateness = nullptr;
  metrics::Histogram* step_seconds = nullptr;
  metrics::Counter* steps = nullptr;
  metrics::Counter* success = nullptr;
  metrics::Counter* aborted = nullptr;

  // KV push (engine_push_source.cc / engine_push_fetch.cc); null without a worker port.
  std::unique_ptr<transport::TransportContext> transport;  // destroyed before the pool (core)
  std::shared_ptr<transport::MemoryRegion> pool_region;    // the KV pool payload, registered
  std::unique_ptr<http::HttpServer> worker_http;           // HTTP thread
  std::string worker_token;
  protocol::PushLimits push_limits;
  absl::flat_hash_map<std::string, FetchOptions> fetch_options;             // HTTP thread
  absl::flat_hash_map<std::string, std::shared_ptr<SourceWorker>> sources;  // HTTP thread
  asio::steady_timer lease_timer{core_ioc};
  struct PushMetrics {
    metrics::Counter *fetch_ok, *fetch_partial, *fetch_fallback, *tokens_in, *bytes_in;
    metrics::Counter *served_ok, *served_failed, *served_empty, *bytes_out;
    metrics::Histogram *fetch_seconds, *serve_seconds;
  } pm{};

  Nanos engineNow(Nanos wall) const {
    return static_cast<Nanos>(static_cast<double>(wall - wall_origin) * config.time_scale);
  }
  Nanos wallFor(Nanos engine_time) const {
    return wall_origin + static_cast<Nanos>(static_cast<double>(engine_time) / config.time_scale);
  }

  void registerMetrics();
  void registerRoutes();
  asio::awaitable<void> stepLoop();  // core thread
  void publishStats();               // core thread
  void shutdownCore();               // any thread but the core thread; idempotent
  void deliver(const std::vector<RequestOutput>& outputs, Nanos end);  // HTTP thread
  void recordFinished(const RequestOutput& out, Nanos end);
  double latenessQuantile(double q) const;

  asio::awaitable<void> handleApi(ApiKind kind, const http::Request& req, http::ResponseWriter& w);
  asio::awaitable<void> streamResponse(ApiKind kind, ParsedRequest& parsed,
                                       CompletionSummary& summary, std::shared_ptr<Pending> p,
                                       const std::string& id, http::ResponseWriter& w);
  asio::awaitable<void> handleTokenize(const http::Request& req, http::ResponseWriter& w);
  asio::awaitable<void> handleModels(const http::Request& req, http::ResponseWriter& w);

  // KV push, holder side and setup (engine_push_source.cc).
  absl::Status createPush();  // before start(): transport, pool registration, worker server
  void registerPushMetrics();
  std::string workerUrl() const;
  bool authorized(const http::Request& req) const;
  asio::awaitable<void> handleKvInfo(const http::Request& req, http::ResponseWriter& w);
  asio::awaitable<void> handleKvPush(const http::Request& req, http::ResponseWriter& w);
  asio::awaitable<absl::StatusOr<protocol::PushResponse>> servePush(protocol::PushRequest req);
  asio::awaitable<void> leaseLoop();  // core thread
  // kv_transfer_params of an API request -> the spec (receiver or remote decode).
  absl::Status applyKvTransfer(const KvTransferParams& params, RequestSpec& spec) const;
  boost::json::value leaseParams(const Pending& p) const;
  // KV push, receiver side (engine_push_fetch.cc); HTTP thread.
  void startFetch(RemoteKvFetch fetch);
  asio::awaitable<void> runFetch(RemoteKvFetch fetch);
  asio::awaitable<TransferOutcome> transferBlocks(const RemoteKvFetch& fetch,
                                                  const FetchOptions& opt, Nanos deadline_wall);
  asio::awaitable<absl::StatusOr<std::shared_ptr<SourceWorker>>> sourceWorker(
      const std::string& url, Nanos deadline_wall);
  asio::awaitable<void> releaseWhenResolved(std::string id,
                                            std::shared_ptr<transport::Landing> landing);
};

}  // namespace kvf::engine
