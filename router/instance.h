// Per-instance runtime state of the router: configuration, upstream connection pool, load
// accounting, health and circuit state, and the KV-event subscriber. Owned by the Router
// (shared with in-flight requests so a removed instance outlives its last request); touched
// only on the router's io thread, except the subscriber's own thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/clock.h"
#include "common/http_client.h"
#include "common/metrics.h"
#include "router/config.h"
#include "router/kv_subscriber.h"

namespace kvf::router {

struct Instance {
  InstanceConfig config;
  int slot = -1;
  uint64_t generation = 0;  // distinguishes a reused slot in posted KV updates
  std::shared_ptr<http::HttpClient> client;
  std::unique_ptr<KvSubscriber> subscriber;
  bool removed = false;

  // Load the router accounts for itself.
  int64_t running = 0;
  int64_t pending_prefill_tokens = 0;
  int64_t ongoing_tokens = 0;
  // Load the engine reports on /metrics.
  int64_t waiting = 0;
  double kv_usage = 0;

  // Health: checks eject and re-admit; drain is an operator's choice.
  bool check_healthy = true;
  int check_failures = 0;
  int check_passes = 0;
  bool draining = false;
  // Circuit breaker on consecutive request failures.
  int request_failures = 0;
  Nanos circuit_open_until = 0;

  // Closed loop and counters (owned by the router's registry).
  metrics::Counter* decisions = nullptr;
  metrics::Counter* prompt_tokens = nullptr;
  metrics::Counter* predicted_cached_tokens = nullptr;
  metrics::Counter* actual_cached_tokens = nullptr;
  metrics::Counter* ejections = nullptr;
  metrics::Counter* circuit_opens = nullptr;
  metrics::Counter* kv_batches = nullptr;
  metrics::Counter* kv_resets = nullptr;

  bool hasEvents() const { return !config.kv_events.endpoint.empty(); }
  bool pushCapable() const { return !config.worker_url.empty(); }
};

}  // namespace kvf::router
