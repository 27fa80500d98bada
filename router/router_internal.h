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
#include "router/instance.h"
#include "router/request_parse.h"

namespace kvf::router {

struct RequestContext {
  std::string id;
  Nanos start = 0;
  ApiKind kind = ApiKind::kCompletions;
  ParsedRequest parsed;
  std::vector<policy::BlockHash> hashes;
  std::vector<bool> excluded;  // per slot: failed in an earlier attempt
  int attempt = 0;

  // The current attempt's decision and the instance it holds load on.
  policy::Decision decision;
  std::shared_ptr<Instance> instance;
  int64_t uncached_tokens = 0;
  bool prefill_pending = false;  // pending prefill tokens still counted on `instance`
  bool load_held = false;
  std::optional<int64_t> actual_cached_tokens;
  int status = 0;
  std::vector<std::pair<std::string, double>> scores;
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
  metrics::Counter* tokenize_fallbacks;
};

}  // namespace kvf::router
