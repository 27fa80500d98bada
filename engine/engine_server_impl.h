// Internal to engine_server*.cc: the state of a live engine (HTTP server, core, publisher,
// pending requests, metrics) shared by the step loop and the HTTP handlers. io thread only.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "absl/container/flat_hash_map.h"
#include "common/http_server.h"
#include "common/metrics.h"
#include "engine/engine_server.h"
#include "engine/openai_api.h"
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
};

}  // namespace detail

using detail::Pending;

struct EngineServer::Impl {
  Impl(asio::io_context& ioc_in, EngineConfig config_in)
      : ioc(ioc_in), config(std::move(config_in)), step_timer(ioc), wake_timer(ioc) {}

  asio::io_context& ioc;
  EngineConfig config;
  std::unique_ptr<http::HttpServer> http;
  std::unique_ptr<worker::KvEventPublisher> publisher;
  worker::VectorEventSink step_events;  // filled during a step, published when it ends
  std::unique_ptr<EngineCore> core;
  ApiLimits limits;
  absl::flat_hash_map<std::string, std::shared_ptr<Pending>> pending;
  uint64_t next_request = 0;

  asio::steady_timer step_timer;
  asio::steady_timer wake_timer;
  bool stopping = false;
  bool idle = true;
  Nanos wall_origin = 0;
  Nanos last_progress_log = 0;

  metrics::Registry registry;
  metrics::Histogram* ttft = nullptr;
  metrics::Histogram* tpot = nullptr;
  metrics::Histogram* e2e = nullptr;
  metrics::Histogram* lateness = nullptr;
  metrics::Histogram* step_seconds = nullptr;
  metrics::Counter* steps = nullptr;
  metrics::Counter* success = nullptr;
  metrics::Counter* aborted = nullptr;
  std::deque<double> recent_lateness;  // seconds, bounded, for the p99 gauge

  Nanos engineNow(Nanos wall) const {
    return static_cast<Nanos>(static_cast<double>(wall - wall_origin) * config.time_scale);
  }
  Nanos wallFor(Nanos engine_time) const {
    return wall_origin + static_cast<Nanos>(static_cast<double>(engine_time) / config.time_scale);
  }

  void registerMetrics();
  void registerRoutes();
  asio::awaitable<void> stepLoop();
  void deliver(const StepResult& result);
  void recordFinished(const RequestOutput& out, Nanos end);
  double latenessQuantile(double q) const;

  asio::awaitable<void> handleApi(ApiKind kind, const http::Request& req, http::ResponseWriter& w);
  asio::awaitable<void> streamResponse(ApiKind kind, ParsedRequest& parsed,
                                       CompletionSummary& summary, std::shared_ptr<Pending> p,
                                       const std::string& id, http::ResponseWriter& w);
  asio::awaitable<void> handleTokenize(const http::Request& req, http::ResponseWriter& w);
  asio::awaitable<void> handleModels(const http::Request& req, http::ResponseWriter& w);
};

}  // namespace kvf::engine
