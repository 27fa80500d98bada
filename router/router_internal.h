// Pieces shared by the router's .cc files: the per-request context and the router's metrics.
// Internal to router/; single-threaded like the Router.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "policy/policy.h"
#include "router/core/routing_core.h"
#include "router/instance.h"
#include "router/kv_transfer.h"
#include "router/request_parse.h"

namespace kvf::router {

// One client request through the shell: what was parsed, its routing in the core (attempts,
// decision, leases, exclusions), and what the upstream answered.
struct RequestContext {
  std::string id;
  Nanos start = 0;
  ApiKind kind = ApiKind::kCompletions;
  ParsedRequest parsed;
  // Token-id prompts are hashed lazily: the core hashes only as far as the index match goes
  // (the critical path), and finishes the chain before routed entries are written (after the
  // engine answered). route.tokens points into parsed.token_ids.
  RequestRoute route;
  // The current attempt's instance and peer (push source or prefill instance), held so a
  // removed instance outlives the request's use of it.
  std::shared_ptr<Instance> instance;
  std::shared_ptr<Instance> peer;
  std::optional<int64_t> actual_cached_tokens;
  int status = 0;
  // What the decode instance reported about the transfer (push-migrate, offload).
  std::optional<KvTransferResult> transfer;
  Nanos first_byte = 0;  // when the first response body bytes arrived (0: not yet)
};

struct Router::Metrics {
  metrics::Counter* requests_ok;
  metrics::Counter* requests_client_error;
  metrics::Counter* requests_upstream_error;
  metrics::Counter* requests_unavailable;
  metrics::Counter* retries;
  metrics::Counter* stream_aborts;
  metrics::Counter* silent_misses;
  metrics::Counter* unpredicted_hits;
  metrics::Histogram* prediction_error_tokens;
  metrics::Histogram* decide_seconds;
  metrics::Histogram* request_seconds;
  metrics::Histogram* kv_event_lag_seconds;
  metrics::Counter* kv_events_ignored;
  metrics::Counter* tokenize_fallbacks_disabled;
  metrics::Counter* tokenize_fallbacks_failed;
};

}  // namespace kvf::router
