// The shell's side of one engine instance: configuration, upstream connection pool, KV-event
// subscriber and metric handles. Its load, health and circuit state live in the routing core
// (router/core/ledger.h) under the same slot. Owned by the Router (shared with in-flight
// requests so a removed instance outlives its last request); touched only on the router's io
// thread, except the subscriber's own thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/http_client.h"
#include "common/log.h"
#include "common/metrics.h"
#include "router/core/config.h"
#include "router/kv_subscriber.h"

namespace kvf::router {

struct RequestLifecycle;

struct Instance {
  InstanceConfig config;
  int slot = -1;
  uint64_t generation = 0;  // distinguishes a reused slot in posted KV updates
  std::shared_ptr<http::HttpClient> client;
  std::vector<std::unique_ptr<KvSubscriber>> subscribers;  // one per data-parallel rank
  bool removed = false;

  // KV-event state (router/kv_events.cc), per instance and per stream (data-parallel rank).
  struct KvStream {
    // The KV cache group indexed (decides prefix reuse): the lowest full-attention group seen,
    // 0 until kinds are known; nullopt before any group-tagged event.
    std::optional<int64_t> indexed_group;
    uint64_t last_seq = 0;
  };
  std::vector<KvStream> kv_streams;
  Nanos last_kv_event = 0;            // when the last batch was applied (0: never)
  int64_t routed_since_kv_event = 0;  // requests routed here since then
  bool kv_events_silent = false;
  uint64_t kv_lost_batches = 0;     // history never seen (late joins, unrecovered gaps)
  std::string kv_last_reset;        // reason of the last index reset
  uint64_t kv_capacity_blocks = 0;  // configured, or learned from /metrics
  Nanos kv_watch_since = 0;         // when its subscribers started
  std::string_view kv_state = "disabled";
  std::vector<metrics::Gauge*> kv_state_gauges;  // kvfabric_router_kv_events_state per state
  // The check of the last health interval: the engine reported hits the router did not predict.
  bool hits_unpredicted = false;
  double kv_check_actual = 0;
  double kv_check_unpredicted = 0;
  log::RateLimitedLog kv_check_log{std::chrono::seconds(30)};

  // Stall watch (router/lifecycle.cc): the attempts in flight here, and the last sign of life (a
  // response byte, response headers or a health answer; reset when attempts start on an idle
  // instance).
  std::set<RequestLifecycle*> attempts;
  Nanos last_alive = 0;

  // Closed loop and counters (owned by the router's registry).
  metrics::Counter* decisions = nullptr;
  metrics::Counter* prompt_tokens = nullptr;
  metrics::Counter* predicted_cached_tokens = nullptr;
  metrics::Counter* actual_cached_tokens = nullptr;
  metrics::Counter* ejections = nullptr;
  // Since the instance last answered while admitted, a health check failed otherwise than by
  // answering late: the process could not be reached (it may have been replaced) or answered
  // with an error (it may have lost its cache). Its index is then reset when it is re-admitted;
  // after timeouts only (a stalled or overloaded process) the index is kept.
  bool cache_state_unknown = false;
  metrics::Counter* circuit_opens = nullptr;
  metrics::Counter* stalls = nullptr;
  metrics::Counter* kv_batches = nullptr;
  metrics::Counter* kv_resets = nullptr;
  metrics::Counter* kv_decode_errors = nullptr;
  metrics::Counter* kv_lost = nullptr;
  metrics::Counter* unpredicted_hit_tokens = nullptr;
  // After removal: the instance's series, out of the exposition but alive for requests still
  // in flight that update them.
  std::shared_ptr<const void> retired_metrics;

  bool hasEvents() const { return !config.kv_events.endpoint.empty(); }
  bool pushCapable() const { return !config.worker_url.empty() || nixl(); }
  // KV moves from this instance in vLLM's NixlConnector dialect.
  bool nixl() const { return config.kv_connector == "nixl"; }
};

}  // namespace kvf::router
