// The routing core shared by kvf-router (the Asio shell: HTTP, upstream pools, health loop, KV
// subscribers) and the discrete-event simulator (engines and links in virtual time): the cache
// index, the policy, the per-instance ledger with its leases, health and circuit state, retry
// exclusion, predicted (soft) index entries and the decision record. It does no I/O and reads
// no clock: every time is an argument. Both drivers call it on the same events (a request
// decided, its engine unreachable, its first bytes, its end; a peer's prefill over), so the
// same sequence gives the same decisions live and simulated (tests/router/sameness_test.cc).
// Single-threaded: the owner's thread (the router's io thread, the simulator's loop) makes
// every call.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "policy/cache_index.h"
#include "policy/policy.h"
#include "policy/tier_holdings.h"
#include "router/core/admission.h"
#include "router/core/config.h"
#include "router/core/decision_log.h"
#include "router/core/ledger.h"

namespace kvf::router {

// One request's routing across its attempts: what the driver parsed (set before the first
// decide()), the current attempt's decision and the leases it holds, and the instances
// excluded after failed attempts. Owned by the driver (a request's context, a simulated
// flight); released on destruction.
class RequestRoute {
 public:
  // Inputs.
  std::string_view session;  // empty when the client sent none; must outlive the route
  int64_t prompt_tokens = 0;
  int64_t max_tokens = 0;
  // Token-id prompts are matched exactly; text prompts approximately (their blocks are bytes
  // and prompt_tokens is an estimate), so their routed entries are approximate.
  bool exact = true;
  // The prompt's block hashes from its first block. Complete, or (token-id prompts) computed
  // lazily from `tokens`: decide() hashes only as far as the match goes, completeHashes()
  // finishes them before entries are written.
  std::vector<policy::BlockHash> hashes;
  bool hashes_complete = false;
  std::span<const policy::TokenId> tokens;  // must outlive the route while hashes are partial

  // The current attempt (after a successful decide()).
  int attempt() const { return attempt_; }
  const policy::Decision& decision() const { return decision_; }
  int instance() const { return instance_; }  // slot; -1 when no instance was available
  int peer() const { return peer_; }          // push source / prefill instance slot; -1: none
  int64_t predictedCachedTokens() const { return decision_.predicted_cached_tokens; }
  // Tokens past the GPU hit that the KV's instance holds in host memory or on disk (the
  // contiguous run the policy saw); an engine that onboards them reports them as cached.
  int64_t tierTokens() const { return tier_cpu_tokens_ + tier_disk_tokens_; }
  int64_t ownMatchedTokens() const { return own_matched_tokens_; }
  const policy::HolderSet& excluded() const { return excluded_; }
  bool loadHeld() const { return load_.held(); }
  bool prefillPending() const { return load_.prefillHeld(); }
  bool peerLoadHeld() const { return peer_load_.held(); }
  bool offloadHeld() const { return offload_.held(); }
  // P's outcome for an offload ("ok", "error", "timeout", "bad_response", "bad_request",
  // "cancelled": the client left during P's leg); "" when none. Static strings.
  std::string_view offloadOutcome() const { return offload_outcome_; }

  // The attempt's events.
  // The instance's prefill is over (its first bytes arrived): its pending prefill tokens go.
  void endPrefill() { load_.endPrefill(); }
  // The offload's prefill phase on P is over, whatever its outcome: P's load goes.
  void endPeerLoad() { peer_load_.release(); }
  // P failed (or gave nothing usable): the instance prefills all it does not hold itself.
  void peerFailed(std::string_view outcome);
  void peerSucceeded() { offload_outcome_ = "ok"; }
  // The attempt's move (push-migrate or offload) was measured: its KV took `seconds` to move.
  // The core hands it to the policy (RoutingCore::reportMove); kept for the decision record.
  double measuredMoveSeconds() const { return measured_move_s_; }
  // Gives the policy's offload slot back.
  void releaseOffload() { offload_.release(); }
  // The attempt's instance is not tried again for this request.
  void exclude();
  // Releases every lease of the attempt (idempotent); decide() and destruction do it too.
  void endAttempt();

 private:
  friend class RoutingCore;

  int attempt_ = 0;
  policy::Decision decision_;
  int instance_ = -1;
  int peer_ = -1;
  uint64_t instance_generation_ = 0;
  uint64_t peer_generation_ = 0;
  std::string instance_id_;  // ids as they were at decide()
  std::string peer_id_;
  int64_t own_matched_tokens_ = 0;
  // The lower-tier run (tokens) of the instance whose KV the attempt uses (the push source for
  // a push, else the instance), as the policy saw it.
  int64_t tier_cpu_tokens_ = 0;
  int64_t tier_disk_tokens_ = 0;
  int64_t uncached_tokens_ = 0;
  int64_t engine_prompt_tokens_ = 0;  // a text prompt's length as the engine counted it; 0: none
  policy::HolderSet excluded_;
  bool predicted_ = false;
  std::string_view offload_outcome_;
  double measured_move_s_ = std::numeric_limits<double>::quiet_NaN();
  LoadLease load_;
  LoadLease peer_load_;
  OffloadLease offload_;
};

class RoutingCore {
 public:
  // The index and policy from `config` (index, policy, circuit and health thresholds);
  // InvalidArgument for a policy kind its registry does not know.
  static absl::StatusOr<std::unique_ptr<RoutingCore>> create(const RouterConfig& config);
  RoutingCore(const RoutingCore&) = delete;
  RoutingCore& operator=(const RoutingCore&) = delete;

  // Instances, by slot (0 .. policy::kMaxInstances - 1; the driver picks free ones). An added
  // instance starts empty in the index and without load; healthy, or with `admitted` false
  // taking no requests until health checks re-admit it.
  void addInstance(int slot, std::string id, bool push_capable, bool has_events,
                   bool admitted = true);
  // The instance gives its blocks in vLLM's NIXL dialect (kv_connector: nixl): a migration from
  // it runs its first leg on it (priced and leased on it), then the target reads.
  void setNixl(int slot, bool nixl);
  // Forgets the instance: its index entries go, its leases give nothing back any more.
  void removeInstance(int slot);
  const InstanceState& instance(int slot) const { return ledger_->instances[slot]; }
  // One past the highest slot in use: the length of the snapshot the policy sees.
  int slotEnd() const { return slot_end_; }

  // Router replicas (router/core/peer_load.h): what the other replicas have in flight on the
  // instance, added to this core's own load wherever the policy and overload control look.
  // Ignored for an empty slot; removeInstance() clears it.
  void setPeerLoad(int slot, const InFlightLoad& load);
  // This core's own leases on the instance (what a replica publishes to its peers).
  InFlightLoad ownLoad(int slot) const;

  // Health checks: `ok` or not; ejects after unhealthy_threshold failures in a row, re-admits
  // after healthy_threshold passes. A passing check also ends a stall (kUnstalled when the
  // instance was not ejected meanwhile; its cache index stays, as a stall loses no blocks).
  enum class HealthChange { kNone, kEjected, kReadmitted, kUnstalled };
  HealthChange healthCheck(int slot, bool ok);
  // The engine's own figures (its /metrics); nullopt leaves a figure as it was.
  void reportEngineLoad(int slot, std::optional<int64_t> waiting, std::optional<double> kv_usage);
  void setDraining(int slot, bool draining);
  // The shell found the instance stalled (its in-flight requests silent, no health answer):
  // it is not routable until a health check passes. True when it was not stalled before.
  bool markStalled(int slot);
  // A request failed on the instance (connection, read, stream, P's prefill): consecutive
  // failures open its circuit for circuit_open, half-open afterwards. True when this one
  // opened it.
  bool upstreamFailure(int slot, Nanos now);
  // The instance answered: its failure count starts again.
  void upstreamSuccess(int slot);
  // Routable: present, health checks pass, not stalled, not drained, circuit closed.
  bool admitted(int slot, Nanos now) const;
  // Alive for peer traffic (may be drained).
  bool reachable(int slot, Nanos now) const;

  policy::CacheIndex& index() { return index_; }
  const policy::CacheIndex& index() const { return index_; }

  // Lower tiers: KV events whose medium is not GPU ("CPU", "DISK", ...). A stored block's
  // chained hash is resolved from the GPU index of `stream` (tier events of vLLM's
  // OffloadingConnector carry hashes only), from the instance's other tiers, or from the
  // event's tokens; unresolved blocks are kept and shown, never credited. False when the tier
  // is full (config.index.max_blocks_per_instance) or one tier too many. decide() gives each
  // policy the run of the prompt that continues past an instance's GPU hits in "CPU" and
  // "DISK" (InstanceSnapshot::cpu_tokens, disk_tokens).
  bool storeTierBlocks(int slot, int stream, std::string_view medium,
                       const policy::StoredBlocks& event);
  // Returns how many hashes the tier did not hold.
  size_t removeTierBlocks(int slot, std::string_view medium,
                          std::span<const uint64_t> engine_hashes);
  void clearTiers(int slot);
  const policy::TierHoldings& tiers(int slot) const { return tiers_[static_cast<size_t>(slot)]; }
  policy::Policy& policy() { return *ledger_->policy; }
  const policy::Policy& policy() const { return *ledger_->policy; }

  // A new attempt for `route`: ends the previous one, expires and matches the index, asks the
  // policy over every slot (excluded and unadmitted ones marked unhealthy), and takes the
  // leases: the instance's running request, ongoing tokens and pending prefill tokens, and for
  // a prefill offload P's running request and prefill tokens and the policy's offload slot.
  // Predicted cached tokens are at most the full blocks of prompt_tokens - 1 (an engine always
  // computes the last prompt token). False when no instance is admitted.
  bool decide(RequestRoute& route, Nanos now);
  // Overload control (config.overload, docs/router.md "overload"). Every new request passes
  // admit() before its first decide(): kDispatch: decide it now; kQueued: the core holds
  // `ticket` (the driver's id for the request, unique while queued) until nextDispatch() hands
  // it out or the driver cancels or expires it; kShed: answer 429 with Retry-After
  // (overloadConfig().retry_after_s), `*why` says why. Disabled: always kDispatch. With it
  // enabled, decide() offers the policy only unsaturated instances while there are any.
  enum class Admission { kDispatch, kQueued, kShed };
  Admission admit(RequestRoute& route, uint64_t ticket, Nanos now, ShedReason* why);
  // The next queued ticket that may go now (some admitted instance is unsaturated), removed
  // from the queue; the driver decides it at once. Call after every event that may free
  // capacity (a first token, an end, an engine's load report, an instance admitted) until it
  // gives nullopt.
  std::optional<uint64_t> nextDispatch(Nanos now);
  // The client left while queued: true when the ticket was queued (it is removed).
  bool cancelQueued(uint64_t ticket);
  // The ticket has waited max_wait: true when it was still queued (removed and counted shed).
  bool expireQueued(uint64_t ticket, Nanos now);
  // The instance cannot start another request soon (config.overload's thresholds).
  bool saturated(int slot) const;
  // Some admitted instance is not saturated.
  bool hasCapacity(Nanos now) const;
  int64_t queueDepth() const { return queue_.size(); }
  const OverloadStats& overloadStats() const { return overload_stats_; }
  const OverloadConfig& overloadConfig() const { return config_.overload; }

  // Finishes route.hashes (every full block of the prompt).
  void completeHashes(RequestRoute& route) const;
  // Writes the attempt's routed (soft) entries for its instance, once per attempt: predicted
  // where the instance has KV events and the prompt is exact, else approximate.
  void predict(RequestRoute& route, Nanos now);
  // The same for the offload's P once it prefilled the prompt.
  void predictPeer(RequestRoute& route, Nanos now);
  // The attempt's move took `measured_s` (from D's report, or the simulator's link): the
  // policy's cost feedback learns from it against the move time it predicted, and the record
  // carries both. Ignored for a local attempt or a peer slot reused since.
  void reportMove(RequestRoute& route, double measured_s);
  // The engine's own count of the prompt's tokens (its usage report). A text prompt's length
  // was only estimated, so its prediction is capped again: at most the full blocks of the
  // engine's prompt_tokens - 1, as for a token-id prompt; the record then gives the engine's
  // count. Token-id prompts are left as they are.
  void reportPromptTokens(RequestRoute& route, int64_t engine_prompt_tokens) const;

  // The decision record's routing fields: policy, session, instance, mode, reason, class,
  // attempt, prompt and predicted tokens, scores, source, predicted costs, P's outcome and the
  // excluded instances. The driver adds times, ids, status and what the engine reported.
  void fillRecord(const RequestRoute& route, DecisionRecord* record) const;

 private:
  RoutingCore(const RouterConfig& config, std::unique_ptr<policy::Policy> policy);
  int64_t cacheableTokens(int64_t prompt_tokens) const;
  // The prompt tokens the peer of the decision just made lacks (what its first leg prefills).
  int64_t peerUncached(int peer, int64_t prompt_tokens) const;

  // The request's estimated uncached prompt tokens: its prompt less the longest match among
  // admitted instances (the queue's charge).
  int64_t uncachedEstimate(RequestRoute& route, Nanos now);

  RouterConfig config_;
  AdmissionQueue queue_{config_.overload};
  OverloadStats overload_stats_;
  policy::CacheIndex index_;
  std::shared_ptr<Ledger> ledger_;
  int slot_end_ = 0;
  // Fills the snapshots' lower-tier runs (cpu_tokens, disk_tokens) past their GPU matches;
  // completes the prompt's hashes only when some instance has a credited tier.
  void matchTiers(RequestRoute& route);

  // Per slot: what each instance holds outside its GPU cache.
  std::vector<policy::TierHoldings> tiers_;
  // Per-decision scratch, reused.
  std::vector<uint32_t> matched_;
  std::vector<policy::InstanceSnapshot> snapshots_;
};

}  // namespace kvf::router
