#include "router/core/routing_core.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "common/strings.h"

namespace kvf::router {

void RequestRoute::peerFailed(std::string_view outcome) {
  offload_outcome_ = outcome;
  // The instance prefills everything it does not hold itself.
  uncached_tokens_ = prompt_tokens - own_matched_tokens_;
  load_.setPrefill(uncached_tokens_);
  decision_.predicted_cached_tokens = own_matched_tokens_;
}

void RequestRoute::exclude() {
  if (instance_ >= 0) excluded_.insert(instance_);
}

void RequestRoute::endAttempt() {
  load_.release();
  peer_load_.release();
  offload_.release();
}

absl::StatusOr<std::unique_ptr<RoutingCore>> RoutingCore::create(const RouterConfig& config) {
  std::unique_ptr<policy::Policy> policy = policy::createPolicy(config.policy);
  if (policy == nullptr) {
    return absl::InvalidArgumentError(strCat("unknown policy kind \"", config.policy.kind, "\""));
  }
  return std::unique_ptr<RoutingCore>(new RoutingCore(config, std::move(policy)));
}

RoutingCore::RoutingCore(const RouterConfig& config, std::unique_ptr<policy::Policy> policy)
    : config_(config), index_(config.index), ledger_(std::make_shared<Ledger>()) {
  ledger_->instances.resize(policy::kMaxInstances);
  ledger_->policy = std::move(policy);
  tiers_.resize(policy::kMaxInstances);
}

void RoutingCore::addInstance(int slot, std::string id, bool push_capable, bool has_events,
                              bool admitted) {
  InstanceState& s = ledger_->instances[static_cast<size_t>(slot)];
  uint64_t generation = s.generation + 1;
  s = InstanceState{};
  s.id = std::move(id);
  s.present = true;
  s.generation = generation;
  s.push_capable = push_capable;
  s.has_events = has_events;
  s.check_healthy = admitted;
  index_.clearInstance(slot);  // a reused slot starts empty
  tiers_[static_cast<size_t>(slot)].clear();
  slot_end_ = std::max(slot_end_, slot + 1);
}

void RoutingCore::setNixl(int slot, bool nixl) {
  ledger_->instances[static_cast<size_t>(slot)].nixl = nixl;
}

void RoutingCore::removeInstance(int slot) {
  InstanceState& s = ledger_->instances[static_cast<size_t>(slot)];
  ++s.generation;
  s.present = false;
  s.running = s.pending_prefill_tokens = s.ongoing_tokens = 0;
  s.peers = {};
  index_.clearInstance(slot);
  tiers_[static_cast<size_t>(slot)].clear();
  while (slot_end_ > 0 && !ledger_->instances[static_cast<size_t>(slot_end_ - 1)].present) {
    --slot_end_;
  }
}

RoutingCore::HealthChange RoutingCore::healthCheck(int slot, bool ok) {
  InstanceState& s = ledger_->instances[static_cast<size_t>(slot)];
  const HealthConfig& h = config_.health;
  if (ok) {
    s.check_failures = 0;
    const bool was_stalled = s.stalled;
    s.stalled = false;  // it answered: alive again
    if (!s.check_healthy && ++s.check_passes >= h.healthy_threshold) {
      s.check_healthy = true;
      return HealthChange::kReadmitted;
    }
    return was_stalled && s.check_healthy ? HealthChange::kUnstalled : HealthChange::kNone;
  }
  s.check_passes = 0;
  if (s.check_healthy && ++s.check_failures >= h.unhealthy_threshold) {
    s.check_healthy = false;
    return HealthChange::kEjected;
  }
  return HealthChange::kNone;
}

void RoutingCore::reportEngineLoad(int slot, std::optional<int64_t> waiting,
                                   std::optional<double> kv_usage) {
  InstanceState& s = ledger_->instances[static_cast<size_t>(slot)];
  if (waiting) s.waiting = *waiting;
  if (kv_usage) s.kv_usage = *kv_usage;
}

void RoutingCore::setDraining(int slot, bool draining) {
  ledger_->instances[static_cast<size_t>(slot)].draining = draining;
}

bool RoutingCore::upstreamFailure(int slot, Nanos now) {
  InstanceState& s = ledger_->instances[static_cast<size_t>(slot)];
  if (++s.request_failures >= config_.circuit_failure_threshold && now >= s.circuit_open_until) {
    s.circuit_open_until = now + config_.circuit_open;
    // Half-open afterwards: one more failure reopens it.
    s.request_failures = config_.circuit_failure_threshold - 1;
    return true;
  }
  return false;
}

void RoutingCore::upstreamSuccess(int slot) {
  ledger_->instances[static_cast<size_t>(slot)].request_failures = 0;
}

bool RoutingCore::reachable(int slot, Nanos now) const {
  const InstanceState& s = ledger_->instances[static_cast<size_t>(slot)];
  return s.present && s.check_healthy && !s.stalled && now >= s.circuit_open_until;
}

bool RoutingCore::markStalled(int slot) {
  InstanceState& s = ledger_->instances[static_cast<size_t>(slot)];
  if (s.stalled) return false;
  s.stalled = true;
  return true;
}

bool RoutingCore::admitted(int slot, Nanos now) const {
  return reachable(slot, now) && !ledger_->instances[static_cast<size_t>(slot)].draining;
}

bool RoutingCore::saturated(int slot) const {
  const InstanceState& s = ledger_->instances[static_cast<size_t>(slot)];
  const OverloadConfig& o = config_.overload;
  return s.pending_prefill_tokens + s.peers.pending_prefill_tokens >=
             o.max_pending_prefill_tokens ||
         s.waiting >= o.max_waiting || (o.max_kv_usage < 1.0 && s.kv_usage >= o.max_kv_usage) ||
         (o.max_running > 0 && s.running + s.peers.running >= o.max_running);
}

void RoutingCore::setPeerLoad(int slot, const InFlightLoad& load) {
  InstanceState& s = ledger_->instances[static_cast<size_t>(slot)];
  if (s.present) s.peers = load;
}

InFlightLoad RoutingCore::ownLoad(int slot) const {
  const InstanceState& s = ledger_->instances[static_cast<size_t>(slot)];
  return {s.running, s.pending_prefill_tokens, s.ongoing_tokens};
}

bool RoutingCore::hasCapacity(Nanos now) const {
  for (int i = 0; i < slot_end_; ++i) {
    if (admitted(i, now) && !saturated(i)) return true;
  }
  return false;
}

int64_t RoutingCore::uncachedEstimate(RequestRoute& r, Nanos now) {
  index_.expire(now);
  matched_.resize(static_cast<size_t>(slot_end_));
  if (r.hashes_complete) {
    index_.matchLengths(r.hashes, matched_);
  } else {
    index_.hashAndMatch(r.tokens, &r.hashes, matched_);
  }
  int64_t best = 0;
  for (int i = 0; i < slot_end_; ++i) {
    if (admitted(i, now)) best = std::max<int64_t>(best, matched_[static_cast<size_t>(i)]);
  }
  const auto bs = static_cast<int64_t>(config_.index.block_size);
  return std::max<int64_t>(0, r.prompt_tokens - best * bs);
}

RoutingCore::Admission RoutingCore::admit(RequestRoute& r, uint64_t ticket, Nanos now,
                                          ShedReason* why) {
  if (!config_.overload.enabled) return Admission::kDispatch;
  // Nobody overtakes the queue: a request goes at once only when none waits.
  if (queue_.empty() && hasCapacity(now)) {
    ++overload_stats_.admitted_at_once;
    return Admission::kDispatch;
  }
  if (std::optional<ShedReason> shed =
          queue_.push(ticket, r.session, uncachedEstimate(r, now), now)) {
    ++overload_stats_.shed[static_cast<size_t>(*shed)];
    *why = *shed;
    return Admission::kShed;
  }
  ++overload_stats_.queued;
  overload_stats_.max_depth = std::max(overload_stats_.max_depth, queue_.size());
  return Admission::kQueued;
}

std::optional<uint64_t> RoutingCore::nextDispatch(Nanos now) {
  if (queue_.empty() || !hasCapacity(now)) return std::nullopt;
  std::optional<AdmissionQueue::Popped> p = queue_.pop();
  ++overload_stats_.dispatched;
  overload_stats_.recordWait(now - p->queued_at);
  return p->ticket;
}

bool RoutingCore::cancelQueued(uint64_t ticket) {
  if (!queue_.remove(ticket)) return false;
  ++overload_stats_.cancelled;
  return true;
}

bool RoutingCore::expireQueued(uint64_t ticket, Nanos now) {
  std::optional<Nanos> queued_at = queue_.remove(ticket);
  if (!queued_at) return false;
  ++overload_stats_.shed[static_cast<size_t>(ShedReason::kWaitTimeout)];
  overload_stats_.recordWait(now - *queued_at);
  return true;
}

int64_t RoutingCore::peerUncached(int peer, int64_t prompt_tokens) const {
  int64_t matched = snapshots_[static_cast<size_t>(peer)].matched_tokens;
  return std::max<int64_t>(0, prompt_tokens - std::min(matched, prompt_tokens));
}

int64_t RoutingCore::cacheableTokens(int64_t prompt_tokens) const {
  // Engines compute at least the last prompt token, so at most the full blocks of the first
  // prompt_tokens - 1 tokens can be reported cached.
  const auto bs = static_cast<int64_t>(config_.index.block_size);
  return std::max<int64_t>(0, prompt_tokens - 1) / bs * bs;
}

bool RoutingCore::decide(RequestRoute& r, Nanos now) {
  r.endAttempt();
  ++r.attempt_;
  r.predicted_ = false;
  r.offload_outcome_ = {};
  r.engine_prompt_tokens_ = 0;
  r.measured_move_s_ = std::numeric_limits<double>::quiet_NaN();
  r.peer_id_.clear();
  index_.expire(now);
  const auto n = static_cast<size_t>(slot_end_);
  matched_.resize(n);
  if (r.hashes_complete) {
    index_.matchLengths(r.hashes, matched_);
  } else {
    index_.hashAndMatch(r.tokens, &r.hashes, matched_);
  }
  const auto bs = static_cast<int64_t>(config_.index.block_size);
  snapshots_.resize(n);
  // With overload.steer, saturated instances are hidden from the policy while any other can
  // take the request (a retry may find none: then every admitted instance is offered).
  bool hide_saturated = false;
  if (config_.overload.enabled && config_.overload.steer) {
    for (size_t i = 0; i < n && !hide_saturated; ++i) {
      const int slot = static_cast<int>(i);
      hide_saturated = admitted(slot, now) && !r.excluded_.contains(slot) && !saturated(slot);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const InstanceState& s = ledger_->instances[i];
    policy::InstanceSnapshot& snap = snapshots_[i];
    const int slot = static_cast<int>(i);
    snap.healthy =
        admitted(slot, now) && !r.excluded_.contains(slot) && !(hide_saturated && saturated(slot));
    snap.running = s.running + s.peers.running;
    snap.waiting = s.waiting;
    snap.pending_prefill_tokens = s.pending_prefill_tokens + s.peers.pending_prefill_tokens;
    snap.ongoing_tokens = s.ongoing_tokens + s.peers.ongoing_tokens;
    snap.kv_usage = s.kv_usage;
    snap.push_capable = s.present && s.push_capable;
    snap.reachable = reachable(slot, now);
    snap.nixl = s.present && s.nixl;
    // Text blocks hold about block_size tokens each, but the prompt's length is an estimate.
    int64_t blocks = matched_[i];
    snap.matched_tokens = r.exact ? blocks * bs : std::min(r.prompt_tokens, blocks * bs);
    snap.cpu_tokens = 0;
    snap.disk_tokens = 0;
  }
  matchTiers(r);
  policy::RouteRequest request;
  request.session = r.session;
  request.prompt_tokens = r.prompt_tokens;
  r.decision_ = ledger_->policy->decide(request, snapshots_, now);
  const policy::Decision& d = r.decision_;
  if (d.instance < 0) {
    r.instance_ = -1;
    r.peer_ = -1;
    r.instance_id_.clear();
    return false;
  }
  r.instance_ = d.instance;
  const InstanceState& chosen = ledger_->instances[static_cast<size_t>(r.instance_)];
  r.instance_generation_ = chosen.generation;
  r.instance_id_ = chosen.id;
  const int64_t cacheable = cacheableTokens(r.prompt_tokens);
  r.own_matched_tokens_ =
      std::min(snapshots_[static_cast<size_t>(r.instance_)].matched_tokens, cacheable);
  const int kv_slot = d.mode == policy::Mode::kPushMigrate && d.source_instance >= 0
                          ? d.source_instance
                          : r.instance_;
  r.tier_cpu_tokens_ = snapshots_[static_cast<size_t>(kv_slot)].cpu_tokens;
  r.tier_disk_tokens_ = snapshots_[static_cast<size_t>(kv_slot)].disk_tokens;
  r.peer_ = d.mode == policy::Mode::kPushMigrate      ? d.source_instance
            : d.mode == policy::Mode::kPrefillOffload ? d.prefill_instance
                                                      : -1;
  if (r.peer_ >= 0) {
    const InstanceState& peer = ledger_->instances[static_cast<size_t>(r.peer_)];
    r.peer_generation_ = peer.generation;
    r.peer_id_ = peer.id;
  }
  if (d.mode == policy::Mode::kPushMigrate && r.peer_ >= 0 &&
      snapshots_[static_cast<size_t>(r.peer_)].nixl) {
    // vLLM's NIXL dialect: the holder's first leg prefills what it lacks of the prompt (a
    // request on it until its answer), and the target reads every block it lacks.
    r.decision_.predicted_cached_tokens = r.prompt_tokens;
    r.peer_load_ = LoadLease(ledger_, r.peer_, 1, 0, peerUncached(r.peer_, r.prompt_tokens));
  }
  if (d.mode == policy::Mode::kPrefillOffload && r.peer_ >= 0) {
    // The policy counted this offload against its cap: the lease gives it back exactly once.
    r.offload_ = OffloadLease(ledger_);
    // D will hold every full block of the prompt once P's blocks are pushed (capped below);
    // P prefills what it does not hold.
    r.decision_.predicted_cached_tokens = r.prompt_tokens;
    r.peer_load_ = LoadLease(ledger_, r.peer_, 1, 0, peerUncached(r.peer_, r.prompt_tokens));
  }
  r.decision_.predicted_cached_tokens = std::min(r.decision_.predicted_cached_tokens, cacheable);
  r.uncached_tokens_ = r.prompt_tokens - r.decision_.predicted_cached_tokens;
  r.load_ = LoadLease(ledger_, r.instance_, 1, r.prompt_tokens + r.max_tokens, r.uncached_tokens_);
  return true;
}

void RoutingCore::completeHashes(RequestRoute& r) const {
  if (r.hashes_complete) return;
  policy::completeBlockHashes(r.tokens, config_.index.block_size, &r.hashes);
  r.hashes_complete = true;
}

void RoutingCore::predict(RequestRoute& r, Nanos now) {
  if (r.predicted_ || r.instance_ < 0) return;
  r.predicted_ = true;
  const InstanceState& s = ledger_->instances[static_cast<size_t>(r.instance_)];
  // A removed instance's slot may already belong to a new one.
  if (s.generation != r.instance_generation_) return;
  completeHashes(r);
  index_.addSoft(r.instance_, r.hashes, now, !s.has_events || !r.exact);
}

void RoutingCore::predictPeer(RequestRoute& r, Nanos now) {
  if (r.peer_ < 0) return;
  const InstanceState& s = ledger_->instances[static_cast<size_t>(r.peer_)];
  if (s.generation != r.peer_generation_) return;
  completeHashes(r);
  index_.addSoft(r.peer_, r.hashes, now, !s.has_events || !r.exact);
}

void RoutingCore::reportMove(RequestRoute& r, double measured_s) {
  if (r.peer_ < 0 || r.instance_ < 0 || std::isnan(r.decision_.move_model_s)) return;
  if (ledger_->instances[static_cast<size_t>(r.peer_)].generation != r.peer_generation_) return;
  r.measured_move_s_ = measured_s;
  ledger_->policy->moveMeasured(r.peer_, r.instance_, r.decision_.move_model_s, measured_s);
}

void RoutingCore::reportPromptTokens(RequestRoute& r, int64_t engine_prompt_tokens) const {
  if (r.exact || engine_prompt_tokens <= 0) return;
  r.engine_prompt_tokens_ = engine_prompt_tokens;
  r.decision_.predicted_cached_tokens =
      std::min(r.decision_.predicted_cached_tokens, cacheableTokens(engine_prompt_tokens));
}

void RoutingCore::fillRecord(const RequestRoute& r, DecisionRecord* out) const {
  const policy::Decision& d = r.decision_;
  out->session = std::string(r.session);
  out->policy = std::string(ledger_->policy->name());
  out->instance = r.instance_ >= 0 ? r.instance_id_ : "";
  out->mode = std::string(policy::modeName(d.mode));
  out->reason = std::string(d.reason);
  out->request_class = std::string(policy::requestClassName(d.request_class));
  out->attempt = r.attempt_;
  out->prompt_tokens = r.engine_prompt_tokens_ > 0 ? r.engine_prompt_tokens_ : r.prompt_tokens;
  out->predicted_cached_tokens = d.predicted_cached_tokens;
  out->scores.clear();
  out->scores_omitted = 0;
  const size_t end = std::min(d.scores.size(), static_cast<size_t>(slot_end_));
  size_t present = 0;
  for (size_t i = 0; i < end; ++i) present += ledger_->instances[i].present ? 1 : 0;
  if (present <= DecisionRecord::kMaxScores) {
    for (size_t i = 0; i < end; ++i) {
      const InstanceState& s = ledger_->instances[i];
      if (s.present) out->scores.emplace_back(s.id, d.scores[i]);
    }
  } else {
    // A large cluster: the chosen instance and the best others (lowest scores), in slot order,
    // so a record stays a few hundred bytes at 1,024 instances instead of a copy of every id.
    std::vector<std::pair<double, uint32_t>> ranked;
    ranked.reserve(present);
    for (size_t i = 0; i < end; ++i) {
      if (!ledger_->instances[i].present || std::isnan(d.scores[i])) continue;
      if (static_cast<int>(i) == r.instance_) continue;
      ranked.emplace_back(d.scores[i], static_cast<uint32_t>(i));
    }
    const size_t keep = std::min(ranked.size(), DecisionRecord::kMaxScores - 1);
    std::partial_sort(ranked.begin(), ranked.begin() + static_cast<ptrdiff_t>(keep), ranked.end());
    ranked.resize(keep);
    if (r.instance_ >= 0 && static_cast<size_t>(r.instance_) < end) {
      ranked.emplace_back(d.scores[static_cast<size_t>(r.instance_)],
                          static_cast<uint32_t>(r.instance_));
    }
    std::sort(ranked.begin(), ranked.end(),
              [](const auto& a, const auto& b) { return a.second < b.second; });
    for (const auto& [score, slot] : ranked) {
      out->scores.emplace_back(ledger_->instances[slot].id, score);
    }
    out->scores_omitted = static_cast<int64_t>(present - out->scores.size());
  }
  out->excluded.clear();
  r.excluded_.forEach(
      [&](int slot) { out->excluded.push_back(ledger_->instances[static_cast<size_t>(slot)].id); });
  out->source = r.instance_ >= 0 && r.peer_ >= 0 ? r.peer_id_ : "";
  out->predicted_costs = {{"local", d.predicted.local},
                          {"cold", d.predicted.cold},
                          {"push_migrate", d.predicted.push},
                          {"prefill_offload", d.predicted.offload},
                          {"chosen", d.predicted.chosen}};
  out->offload_prefill = std::string(r.offload_outcome_);
  out->move_model_s = d.move_model_s;
  out->move_s = d.move_s;
  out->move_measured_s = r.measured_move_s_;
  out->tier_cpu_tokens = r.tier_cpu_tokens_;
  out->tier_disk_tokens = r.tier_disk_tokens_;
  out->tier_credited_tokens =
      policy::tiers::creditedTokens(r.tier_cpu_tokens_, r.tier_disk_tokens_, config_.policy.tiers,
                                    r.prompt_tokens - r.own_matched_tokens_ - r.tierTokens());
}

void RoutingCore::matchTiers(RequestRoute& r) {
  const auto bs = static_cast<int64_t>(config_.index.block_size);
  bool any = false;
  for (int i = 0; i < slot_end_ && !any; ++i) any = tiers_[static_cast<size_t>(i)].creditable();
  if (!any || config_.policy.tiers.scoring == policy::TierScoring::kOff) return;
  completeHashes(r);
  for (int i = 0; i < slot_end_; ++i) {
    const policy::TierHoldings& t = tiers_[static_cast<size_t>(i)];
    if (!t.creditable()) continue;
    policy::InstanceSnapshot& snap = snapshots_[static_cast<size_t>(i)];
    const policy::LowerTierRun run = t.run(r.hashes, matched_[static_cast<size_t>(i)]);
    snap.cpu_tokens = static_cast<int64_t>(run.cpu_blocks) * bs;
    snap.disk_tokens = static_cast<int64_t>(run.disk_blocks) * bs;
  }
}

bool RoutingCore::storeTierBlocks(int slot, int stream, std::string_view medium,
                                  const policy::StoredBlocks& event) {
  policy::TierHoldings& tiers = tiers_[static_cast<size_t>(slot)];
  const size_t bs = config_.index.block_size;
  const bool tokens =
      event.block_size == bs && event.token_ids.size() == event.engine_hashes.size() * bs;
  auto resolve = [&](uint64_t engine_hash) -> std::optional<policy::BlockHash> {
    if (auto ours = index_.ourHash(slot, stream, engine_hash)) return ours;
    return tiers.ourHash(engine_hash);
  };
  std::vector<policy::BlockHash> ours(event.engine_hashes.size(), policy::BlockHash{0});
  std::optional<policy::BlockHash> parent = policy::kRootBlockHash;
  if (event.has_parent) parent = resolve(event.engine_parent);
  for (size_t i = 0; i < ours.size(); ++i) {
    std::optional<policy::BlockHash> own = resolve(event.engine_hashes[i]);
    if (!own && tokens && parent) {
      // The event's own chain: our hash of its tokens after the previous block.
      policy::BlockHash p = *parent;
      if (i < event.extras.size()) p = policy::keyedParent(p, event.extras[i]);
      own = policy::hashBlock(
          p, std::span<const policy::TokenId>(event.token_ids).subspan(i * bs, bs));
    }
    if (own) ours[i] = *own;
    parent = own;
  }
  return tiers.store(medium, event.engine_hashes, ours, config_.index.max_blocks_per_instance);
}

size_t RoutingCore::removeTierBlocks(int slot, std::string_view medium,
                                     std::span<const uint64_t> engine_hashes) {
  return tiers_[static_cast<size_t>(slot)].remove(medium, engine_hashes);
}

void RoutingCore::clearTiers(int slot) { tiers_[static_cast<size_t>(slot)].clear(); }

}  // namespace kvf::router
