// The routing core's per-instance ledger: for each slot, what the router accounts for itself
// (requests running, prefill tokens pending, ongoing tokens), what the engine reports (waiting
// requests, KV usage), health checks and the circuit breaker. Router-accounted load is only
// taken through leases (RAII): a lease adds its amounts when taken and takes exactly those back
// when released or destroyed, on every path; a lease whose instance was removed (or whose slot
// was reused) since gives back nothing. The policy's offload slots are leases too.
// Single-threaded: owned by one RoutingCore, whose thread takes and releases every lease. A
// lease keeps the ledger alive, so it may outlive the core (a request still suspended when the
// router shuts down).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "policy/policy.h"

namespace kvf::router {

// Requests, prefill tokens and ongoing tokens in flight on an instance.
struct InFlightLoad {
  int64_t running = 0;
  int64_t pending_prefill_tokens = 0;
  int64_t ongoing_tokens = 0;
  bool operator==(const InFlightLoad&) const = default;
};

struct InstanceState {
  std::string id;
  bool present = false;
  uint64_t generation = 0;    // bumped when the slot's instance is added or removed
  bool push_capable = false;  // has a worker: can push, receive and prefill for a peer
  bool has_events = false;    // KV events: routed entries are predicted, else approximate
  bool nixl = false;          // gives its blocks in vLLM's NIXL dialect (kv_connector: nixl)
  // Router-accounted load (leases).
  int64_t running = 0;
  int64_t pending_prefill_tokens = 0;
  int64_t ongoing_tokens = 0;
  // What the other router replicas have in flight on it (router/core/peer_load.h); the policy
  // sees the sum of both.
  InFlightLoad peers;
  // Reported by the engine (its /metrics).
  int64_t waiting = 0;
  double kv_usage = 0;
  // Health: checks eject and re-admit; drain is an operator's choice.
  bool check_healthy = true;
  int check_failures = 0;
  int check_passes = 0;
  bool draining = false;
  // Its in-flight requests went silent past stall_timeout with no other sign of life: takes
  // nothing new until a health check passes.
  bool stalled = false;
  // Circuit breaker on consecutive request failures.
  int request_failures = 0;
  Nanos circuit_open_until = 0;
};

// The state leases point into: the instances, and the policy whose offload slots they hold.
struct Ledger {
  std::vector<InstanceState> instances;  // by slot
  std::unique_ptr<policy::Policy> policy;
};

// Load on one instance: `running` requests, `ongoing` tokens, and `prefill` pending prefill
// tokens that go at the end of the prefill phase (endPrefill) or with the rest.
class LoadLease {
 public:
  LoadLease() = default;
  LoadLease(std::shared_ptr<Ledger> ledger, int slot, int64_t running, int64_t ongoing,
            int64_t prefill);
  LoadLease(LoadLease&& other) noexcept { *this = std::move(other); }
  LoadLease& operator=(LoadLease&& other) noexcept;
  LoadLease(const LoadLease&) = delete;
  LoadLease& operator=(const LoadLease&) = delete;
  ~LoadLease() { release(); }

  bool held() const { return ledger_ != nullptr; }
  bool prefillHeld() const { return held() && prefill_held_; }
  int64_t prefillTokens() const { return prefill_held_ ? prefill_ : 0; }
  // The prefill phase is over: the pending prefill tokens go, the rest stays.
  void endPrefill();
  // While the prefill phase lasts, the pending prefill tokens become `tokens`.
  void setPrefill(int64_t tokens);
  // Gives everything back (idempotent).
  void release();

 private:
  InstanceState* state() const;

  std::shared_ptr<Ledger> ledger_;
  int slot_ = -1;
  uint64_t generation_ = 0;
  int64_t running_ = 0;
  int64_t ongoing_ = 0;
  int64_t prefill_ = 0;
  bool prefill_held_ = false;
};

// One unit of the policy's offload cap (Policy::offloadFinished on release, exactly once).
class OffloadLease {
 public:
  OffloadLease() = default;
  explicit OffloadLease(std::shared_ptr<Ledger> ledger) : ledger_(std::move(ledger)) {}
  OffloadLease(OffloadLease&& other) noexcept { *this = std::move(other); }
  OffloadLease& operator=(OffloadLease&& other) noexcept;
  OffloadLease(const OffloadLease&) = delete;
  OffloadLease& operator=(const OffloadLease&) = delete;
  ~OffloadLease() { release(); }

  bool held() const { return ledger_ != nullptr; }
  void release();

 private:
  std::shared_ptr<Ledger> ledger_;
};

}  // namespace kvf::router
