// The shell's side of one engine instance: configuration, upstream connection pool, KV-event
// subscriber and metric handles. Its load, health and circuit state live in the routing core
// (router/core/ledger.h) under the same slot. Owned by the Router (shared with in-flight
// requests so a removed instance outlives its last request); touched only on the router's io
// thread, except the subscriber's own thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/clock.h"
#include "common/http_client.h"
#include "common/metrics.h"
#include "router/core/config.h"
#include "router/kv_subscriber.h"

namespace kvf::router {

struct Instance {
  InstanceConfig config;
  int slot = -1;
  uint64_t generation = 0;  // distinguishes a reused slot in posted KV updates
  std::shared_ptr<http::HttpClient> client;
  std::unique_ptr<KvSubscriber> subscriber;
  bool removed = false;

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
  bool pushCapable() const { return !config.worker_url.empty() || nixl(); }
  // KV moves from this instance in vLLM's NixlConnector dialect.
  bool nixl() const { return config.kv_connector == "nixl"; }
};

}  // namespace kvf::router
