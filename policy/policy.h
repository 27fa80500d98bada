// Routing policies: pure, deterministic functions of (request, instance snapshots, time) that
// pick an instance and a mode. Policies with memory (round-robin cursor, session pins,
// hysteresis) keep it inside the object; the live router and the simulator both drive a
// policy from one thread (or one strand) and pass time in, so the same inputs give the same
// decisions. See docs/policies.md for every formula and parameter.
#pragma once

#include <cstdint>
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
enum class PolicyKind { kRoundRobin, kLeastRequest, kLinear, kLMetric, kHybrid };

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
};

// Reads a `policy:` map: kind, classify{warm_max_new_tokens, medium_max_new_tokens},
// session_ttl_s, max_sessions, linear{alpha, overload_factor},
// hybrid{gate_fraction, overload_factor, overload_min_running, hysteresis}.
void parsePolicyConfig(config::ConfigMap& map, PolicyConfig* out);

class Policy {
 public:
  virtual ~Policy() = default;
  virtual PolicyKind kind() const = 0;
  // Picks an instance among `instances` (healthy ones only). Deterministic in the sequence of
  // calls. `now` only ages session memory.
  virtual Decision decide(const RouteRequest& request, std::span<const InstanceSnapshot> instances,
                          Nanos now) = 0;
};

std::unique_ptr<Policy> createPolicy(const PolicyConfig& config);

}  // namespace kvf::policy
