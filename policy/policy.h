// Routing policies: pure, deterministic functions of (request, instance snapshots, time) that
// pick an instance and a mode. Policies with memory (round-robin cursor, session pins,
// hysteresis) keep it inside the object; the live router and the simulator both drive a
// policy from one thread (or one strand) and pass time in, so the same inputs give the same
// decisions. Each policy lives in its own file and is found by name in a PolicyRegistry
// (policy/registry.h); the driver asks a policy what it can do (movesKv(), offloadTerms())
// and never switches on its name. See docs/policies.md for every formula and parameter, and
// docs/extending.md for adding one.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "policy/tier_credit.h"

namespace kvf::policy {

enum class RequestClass { kWarm, kMedium, kHeavy };
enum class Mode { kLocal, kPushMigrate, kPrefillOffload };

std::string_view requestClassName(RequestClass c);
std::string_view modeName(Mode m);

// What the router knows about one instance at decision time.
struct InstanceSnapshot {
  bool healthy = true;                 // admitted: health checks pass, not drained, circuit closed
  int64_t running = 0;                 // requests in flight on the instance (router-accounted)
  int64_t waiting = 0;                 // requests queued in the engine (from its metrics)
  int64_t pending_prefill_tokens = 0;  // uncached tokens routed and not yet past first token
  int64_t ongoing_tokens = 0;          // prompt + expected output tokens of in-flight requests
  double kv_usage = 0.0;               // 0..1, from the engine's metrics
  int64_t matched_tokens = 0;          // this request's leading cached tokens on the instance
  // The leading run continuing past matched_tokens in the instance's lower tiers (a prefix is
  // useful only contiguously): tokens of it in host memory ("CPU") and, where host memory
  // lacks a block, on local disk ("DISK"). Policies credit them (policy/tier_credit.h).
  int64_t cpu_tokens = 0;
  int64_t disk_tokens = 0;
  // KV push (policies that move KV): the instance has a worker URL, so it can push its blocks
  // to a peer, receive them, or prefill for a peer.
  bool push_capable = false;
  // Alive for peer traffic (health checks pass, circuit closed) even when not routable: a
  // drained instance can still push its blocks to the instance that takes over a session.
  bool reachable = true;
  // As a holder it gives its blocks in vLLM's NixlConnector dialect: a first leg prefills the
  // whole prompt on it (its prefix is a cache hit, but the leg waits in its queue and computes
  // the rest of the prompt, at least one step), then the target reads every block it lacks.
  bool nixl = false;
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
  // considered or impossible) and of the chosen option; only cost-model policies fill them.
  struct Costs {
    double local = std::numeric_limits<double>::quiet_NaN();    // best instance, its own hits
    double cold = std::numeric_limits<double>::quiet_NaN();     // best instance without hits
    double push = std::numeric_limits<double>::quiet_NaN();     // best (target, holder) pair
    double offload = std::numeric_limits<double>::quiet_NaN();  // prefill on P, decode on D
    double chosen = std::numeric_limits<double>::quiet_NaN();
  } predicted;
  // kPushMigrate / kPrefillOffload: the predicted time of the move itself (the KV transfer
  // from the peer with the peer's own load), as the cost model gives it before and after the
  // measured correction (MoveFeedback). NaN for local decisions.
  double move_model_s = std::numeric_limits<double>::quiet_NaN();
  double move_s = std::numeric_limits<double>::quiet_NaN();
};

struct ClassifyConfig {
  int64_t warm_max_new_tokens = 5000;     // < this: WARM
  int64_t medium_max_new_tokens = 20000;  // <= this: MEDIUM, above: HEAVY
};

RequestClass classify(int64_t new_tokens, const ClassifyConfig& config);

// One policy's own parameters (its YAML block, e.g. `hybrid: {...}`): each policy derives its
// parameter struct from this and parses it itself (PolicyDefinition::parse).
struct PolicyParams {
  virtual ~PolicyParams() = default;
};

class PolicyRegistry;

// The `policy:` section: the policy's name, the settings every policy shares, and the
// parameter blocks, each parsed by the policy that owns it.
struct PolicyConfig {
  std::string kind = "hybrid";
  ClassifyConfig classify;
  // Session memory (linear pins, hybrid hysteresis): bounded and expiring.
  Nanos session_ttl = 600 * kNanosPerSecond;
  size_t max_sessions = 1u << 20;
  // How lower-tier hits are credited (tier_scoring, tier_weights, tier_model).
  TierCreditConfig tiers;
  // Parameter blocks by policy name: what the YAML held, plus defaults for every other policy
  // of the registry that has parameters (parsePolicyConfig fills them).
  std::map<std::string, std::shared_ptr<const PolicyParams>, std::less<>> blocks;
  // Where `kind` and the blocks' owners are looked up; null: the built-in policies. Must
  // outlive the config (the registries are static in practice).
  const PolicyRegistry* registry = nullptr;

  // The parameters of policy `name` (its block, else its defaults), as its own type `P`. A
  // policy reads its own block and those of the policies it builds on (elastic: hybrid's and
  // unified's). Aborts when `name` is not a policy with parameters of type P (a programming
  // error, not a config error).
  template <class P>
  P params(std::string_view name) const {
    return *paramsAs<P>(name);
  }
  // Sets policy `name`'s parameters (for code that builds a config by hand, and tests).
  template <class P>
  void set(std::string_view name, P params) {
    blocks[std::string(name)] = std::make_shared<const P>(std::move(params));
  }

 private:
  template <class P>
  const P* paramsAs(std::string_view name) const {
    const auto* p = dynamic_cast<const P*>(find(name));
    if (p == nullptr) wrongParams(name);
    return p;
  }
  const PolicyParams* find(std::string_view name) const;
  [[noreturn]] static void wrongParams(std::string_view name);
};

// When the driver runs a kPrefillOffload decision: P keeps the prompt's blocks pinned for D
// this long (sent to P as lease_ms), and the driver gives up on P after prefill_timeout (D
// prefills locally).
struct OffloadTerms {
  int64_t lease_ms = 30000;
  Nanos prefill_timeout = 60 * kNanosPerSecond;
};

class Policy {
 public:
  virtual ~Policy() = default;
  // The name it is registered under (`kind:`), for logs and metrics.
  virtual std::string_view name() const = 0;
  // Picks an instance among `instances` (healthy ones only). Deterministic in the sequence of
  // calls. `now` only ages session memory.
  virtual Decision decide(const RouteRequest& request, std::span<const InstanceSnapshot> instances,
                          Nanos now) = 0;

  // Capabilities, asked by the driver.
  // Whether decide() may answer kPushMigrate or kPrefillOffload. Such a policy does nothing
  // beyond kLocal without two instances that can push (InstanceSnapshot::push_capable).
  virtual bool movesKv() const { return false; }
  // The terms of its kPrefillOffload decisions (unused by a policy that never offloads).
  virtual OffloadTerms offloadTerms() const { return {}; }
  // Called by the driver exactly once per kPrefillOffload decision when that offload's
  // prefill phase has ended, so a concurrency cap admits the next one.
  virtual void offloadFinished() {}
  virtual int64_t offloadsInFlight() const { return 0; }
  // A move this policy decided has been measured: the KV of the move from `source` to `dest`
  // took `measured_s`, where the model (Decision::move_model_s) predicted `model_s`. Policies
  // that price moves learn from it (closed loop); the default ignores it.
  virtual void moveMeasured(int /*source*/, int /*dest*/, double /*model_s*/,
                            double /*measured_s*/) {}
};

}  // namespace kvf::policy

// The lower-tier credit's common case, inline (policy/tier_credit.h).
namespace kvf::policy::tiers {

inline double effectiveHits(const RouteRequest& r, const InstanceSnapshot& s,
                            const TierCreditConfig& c) {
  if (s.cpu_tokens != 0 || s.disk_tokens != 0) return effectiveHitsWithRun(r, s, c);
  const int64_t gpu = s.matched_tokens < 0                 ? 0
                      : s.matched_tokens > r.prompt_tokens ? r.prompt_tokens
                                                           : s.matched_tokens;
  return static_cast<double>(gpu);
}

inline int64_t reach(const RouteRequest& r, const InstanceSnapshot& s, const TierCreditConfig& c) {
  if (s.cpu_tokens != 0 || s.disk_tokens != 0) return reachWithRun(r, s, c);
  return s.matched_tokens < 0                 ? 0
         : s.matched_tokens > r.prompt_tokens ? r.prompt_tokens
                                              : s.matched_tokens;
}

}  // namespace kvf::policy::tiers
