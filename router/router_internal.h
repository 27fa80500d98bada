// Pieces shared by the router's .cc files: the per-request context and the router's metrics.
// Internal to router/; single-threaded like the Router.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/steady_timer.hpp>

#include "common/http_client.h"
#include "common/metrics.h"
#include "policy/policy.h"
#include "router/core/routing_core.h"
#include "router/instance.h"
#include "router/kv_transfer.h"
#include "router/request_parse.h"

namespace kvf::router {

// What a request's watches share with its coroutine: the client watch (the client closed its
// connection) and the stall watch (the attempt's instance went silent) fire while any await of
// the request is pending, and both end that await by cancelling what it waits on.
struct RequestLifecycle {
  bool client_gone = false;
  bool stalled = false;  // the current attempt was cancelled because its instance stalled
  std::shared_ptr<http::RequestCanceller> upstream;  // the attempt in flight (null between)
  asio::steady_timer* queue_wait = nullptr;          // while the request waits in the queue

  // The client left (its connection closed while the request waited, or a write failed):
  // ends whatever the request awaits, so its coroutine stops and releases what it holds.
  void clientLeft() {
    client_gone = true;
    if (upstream) upstream->cancel();
    if (queue_wait != nullptr) queue_wait->cancel();
  }
};

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
  std::string transfer_auth;  // x-kvf-transfer-auth for the params added to this attempt's body
  Nanos first_byte = 0;       // when the first response body bytes arrived (0: not yet)
  // The first leg to the peer (offload's P, a NIXL holder): sent to answered, in seconds.
  double peer_leg_s = std::numeric_limits<double>::quiet_NaN();
  std::shared_ptr<RequestLifecycle> life = std::make_shared<RequestLifecycle>();
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
  // KV-event content skipped, by reason (kvfabric_router_kv_events_skipped_total{reason}).
  metrics::Counter* kv_skipped_unknown_type;
  metrics::Counter* kv_skipped_unknown_field;
  metrics::Counter* kv_skipped_other_group;
  metrics::Counter* kv_skipped_tier_full;
  metrics::Counter* tokenize_fallbacks_disabled;
  metrics::Counter* tokenize_fallbacks_failed;
  // Requests whose client left before the answer was complete (the upstream was cancelled).
  metrics::Counter* requests_cancelled;
  // Attempts cancelled because their instance stalled, by what became of the request.
  metrics::Counter* stall_retried;
  metrics::Counter* stall_stream_errors;
  // Retries not made: the client had left, or the retry deadline had passed.
  metrics::Counter* retries_skipped_client_gone;
  metrics::Counter* retries_skipped_deadline;
};

}  // namespace kvf::router
