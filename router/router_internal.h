// Pieces shared by the router's .cc files: the per-request context and the router's metrics.
// Internal to router/; single-threaded like the Router.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "policy/policy.h"
#include "router/instance.h"
#include "router/kv_transfer.h"
#include "router/request_parse.h"

namespace kvf::router {

// One unit of the policy's offload cap, given back exactly once (explicitly, or when the
// request's context goes away on any path).
class OffloadSlot {
 public:
  OffloadSlot() = default;
  explicit OffloadSlot(std::function<void()> release) : release_(std::move(release)) {}
  OffloadSlot(const OffloadSlot&) = delete;
  OffloadSlot& operator=(const OffloadSlot&) = delete;
  OffloadSlot& operator=(OffloadSlot&& other) noexcept {
    reset();
    release_ = std::move(other.release_);
    other.release_ = nullptr;
    return *this;
  }
  ~OffloadSlot() { reset(); }
  bool held() const { return static_cast<bool>(release_); }
  void reset() {
    if (!release_) return;
    auto release = std::move(release_);
    release_ = nullptr;
    release();
  }

 private:
  std::function<void()> release_;
};

struct RequestContext {
  std::string id;
  Nanos start = 0;
  ApiKind kind = ApiKind::kCompletions;
  ParsedRequest parsed;
  // Token-id prompts are hashed lazily: decide() hashes only as far as the index match goes
  // (the critical path), and completeHashes() finishes the chain before soft entries are
  // written (predictHeld), after the engine answered.
  std::vector<policy::BlockHash> hashes;
  bool hashes_complete = false;
  std::vector<bool> excluded;  // per slot: failed in an earlier attempt
  // The attempt's instance got its predicted (soft) entries for the prompt's blocks. They are
  // written once the engine has answered, off the client's critical path: after the response
  // was sent, or after the first streamed chunk was forwarded.
  bool predicted = false;
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

  // KV movement of the current attempt: the holder that pushes (push-migrate) or the instance
  // that prefills (offload), and what the decode instance reported about the transfer.
  std::shared_ptr<Instance> peer;
  int64_t own_matched_tokens = 0;    // the decode instance's own cached prefix
  int64_t peer_uncached_tokens = 0;  // prefill tokens accounted on the offload's P
  bool peer_load_held = false;
  OffloadSlot offload_slot;
  std::string offload_prefill;  // P's outcome: ok, error, timeout, bad_response; "" if none
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
  // KV-event content skipped, by reason (kvfabric_router_kv_events_skipped_total{reason}).
  metrics::Counter* kv_skipped_unknown_type;
  metrics::Counter* kv_skipped_unknown_field;
  metrics::Counter* kv_skipped_other_group;
  metrics::Counter* kv_skipped_tier_full;
  metrics::Counter* tokenize_fallbacks;
};

}  // namespace kvf::router
