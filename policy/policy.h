// Routing policies: pure, deterministic functions of (request, instance snapshots, time) that
// pick an instance and a mode. Policies with memory (round-robin cursor, session pins,
// hysteresis) keep it inside the object; the live router and the simulator both drive a
// policy from one thread (or one strand) and pass time in, so the same inputs give the same
// decisions. See docs/policies.md for every formula and parameter.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/config.h"

namespace kvf::policy {

enum class RequestClass { kWarm, kMedium, kHeavy };
enum class Mode { kLocal, kPushMigrate, kPrefillOffload };
enum class PolicyKind {
  kRoundRobin,
  kLeastRequest,
  kLinear,
  kLMetric,
  kHybrid,
  kUnified,
  kElastic
};

std::string_view requestClassName(RequestClass c);
std::string_view modeName(Mode m);
std::string_view policyKindName(PolicyKind k);

// What the router knows about one instance at decision time.
struct InstanceSnapshot {
  bool healthy = true;                 // admitted: health checks pass, not drained, circuit closed
  int64_t running = 0;                 // requests in flight on the instance (router-accounted)
  int64_t waiting = 0;                 // requests queued in the engine (from its metrics)
  int64_t pending_prefill_tokens = 0;  // uncached tokens routed and not yet past first token
  int64_t ongoing_tokens = 0;          // prompt + expected output tokens of in-flight requests
  double kv_usage = 0.0;               // 0..1, from the engine's metrics
  int64_t matched_tokens = 0;          // this request's leading cached tokens on the instance
  // KV push (policies unified/elastic): the instance has a worker URL, so it can push its blocks
  // to a peer, receive them, or prefill for a peer.
  bool push_capable = false;
  // Alive for peer traffic (health checks pass, circuit closed) even when not routable: a
  // drained instance can still push its blocks to the instance that takes over a session.
  bool reachable = true;
};

struct RouteRequest {
  std::string_view session;  // empty when the client sent none
  int64_t prompt_tokens = 0;
};

struct Decision {
  int instance = -1;  // index into the snapshot span; -1 when no instance is healthy
  Mode mode = Mode::kLocal;
  std::string_view reason;  // static string, see docs/policies.md
  RequestClass request_class = RequestClass::kWarm;
  int64_t predicted_cached_tokens = 0;
  std::vector<double> scores;  // per instance, lower is better; NaN for unhealthy ones
  // The peer: kPushMigrate: the holder that pushes its blocks to `instance`;
  // kPrefillOffload: the instance that prefills before `instance` decodes. -1 otherwise.
  int source_instance = -1;
  int prefill_instance = -1;
  // Predicted time to first token in seconds of the best option per mode (NaN: not
  // considered or impossible) and of the chosen option; only unified and elastic fill them.
  struct Costs {
    double local = std::numeric_limits<double>::quiet_NaN();    // best instance, its own hits
    double cold = std::numeric_limits<double>::quiet_NaN();     // best instance without hits
    double push = std::numeric_limits<double>::quiet_NaN();     // best (target, holder) pair
    double offload = std::numeric_limits<double>::quiet_NaN();  // prefill on P, decode on D
    double chosen = std::numeric_limits<double>::quiet_NaN();
  } predicted;
};

struct ClassifyConfig {
  int64_t warm_max_new_tokens = 5000;     // < this: WARM
  int64_t medium_max_new_tokens = 20000;  // <= this: MEDIUM, above: HEAVY
};

RequestClass classify(int64_t new_tokens, const ClassifyConfig& config);

struct PolicyConfig {
  PolicyKind kind = PolicyKind::kHybrid;
  ClassifyConfig classify;
  // Session memory (linear pins, hybrid hysteresis): bounded and expiring.
  Nanos session_ttl = 600 * kNanosPerSecond;
  size_t max_sessions = 1u << 20;
  struct Linear {
    double alpha = 1.0;            // weight of cache-hit tokens against ongoing tokens
    double overload_factor = 2.0;  // redirect when pinned load > factor x average load
  } linear;
  struct Hybrid {
    double gate_fraction = 0.5;        // an instance holding > this share of the prompt wins
    double overload_factor = 2.0;      // ... unless its running > factor x average running
    int64_t overload_min_running = 4;  //     and at least this many
    double hysteresis = 0.1;           // keep the session's last instance within (1+h) x best
  } hybrid;
  // Cost model of unified and elastic (defaults: Qwen3-Coder-30B-A3B on H20, 200 Gbps link).
  struct Unified {
    double prefill_tokens_per_s = 7000;  // one instance's prefill throughput
    double kv_bytes_per_token = 98304;   // 48 layers x 2 (K,V) x 4 kv heads x 128 x 2 B
    double link_bandwidth_gbps = 200;    // between two instances
    double transfer_overhead_s = 50e-6;  // per push (the engine profile's link.overhead_us)
    double waiting_request_s = 0;        // queue added per request the engine reports waiting
    double affinity_factor = 2.0;        // keep the session's instance within factor x best
    int64_t min_push_tokens = 256;       // holders with fewer extra tokens never push
  } unified;
  struct Elastic {
    int64_t max_concurrent_offloads = 4;         // offloads whose prefill phase is in flight
    double overload_factor = 2.0;                // P skipped when running > factor x average ...
    int64_t overload_min_running = 4;            // ... and at least this many
    int64_t max_pending_prefill_tokens = 65536;  // P skipped when its queue exceeds this
    double max_cost_ratio = 1.5;                 // offload only if predicted TTFT <= ratio x local
    int64_t lease_ms = 30000;                    // P keeps the blocks pinned this long for D
    double prefill_timeout_s = 60;               // router gives up on P (D prefills locally)
  } elastic;
};

// Reads a `policy:` map: kind, classify{warm_max_new_tokens, medium_max_new_tokens},
// session_ttl_s, max_sessions, linear{alpha, overload_factor},
// hybrid{gate_fraction, overload_factor, overload_min_running, hysteresis},
// unified{prefill_tokens_per_s, kv_bytes_per_token, link_bandwidth_gbps, transfer_overhead_s,
// waiting_request_s, affinity_factor, min_push_tokens},
// elastic{max_concurrent_offloads, overload_factor, overload_min_running,
// max_pending_prefill_tokens, max_cost_ratio, lease_ms, prefill_timeout_s}.
void parsePolicyConfig(config::ConfigMap& map, PolicyConfig* out);

class Policy {
 public:
  virtual ~Policy() = default;
  virtual PolicyKind kind() const = 0;
  // Picks an instance among `instances` (healthy ones only). Deterministic in the sequence of
  // calls. `now` only ages session memory.
  virtual Decision decide(const RouteRequest& request, std::span<const InstanceSnapshot> instances,
                          Nanos now) = 0;
  // Called by the driver exactly once per kPrefillOffload decision when that offload's
  // prefill phase has ended (P answered, failed or timed out, or the request was abandoned),
  // so the concurrency cap admits the next one.
  virtual void offloadFinished() {}
  virtual int64_t offloadsInFlight() const { return 0; }
};

// Seconds to move `tokens` tokens of KV over the link: bytes x 8 / bandwidth + overhead.
double transferSeconds(int64_t tokens, const PolicyConfig::Unified& model);

std::unique_ptr<Policy> createPolicy(const PolicyConfig& config);

}  // namespace kvf::policy
