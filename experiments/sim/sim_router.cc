// The router side of the simulator, following router/proxy.cc: the decision with the same
// snapshot fields the live router fills, bounded retries with exclusion on connection
// failures, the circuit breaker, load accounting released at the first token and at the end,
// the predicted (soft) index entries written when the engine accepts, and the decision log.
#include <algorithm>

#include "common/strings.h"
#include "experiments/sim/sim_internal.h"

namespace kvf::experiments::sim {

bool Sim::admitted(const SimEngine& e, Nanos t) const {
  return e.check_healthy && t >= e.circuit_open_until;
}

void Sim::upstreamFailure(SimEngine& e, Nanos t) {
  const router::RouterConfig& rc = setup_.router;
  if (++e.request_failures >= rc.circuit_failure_threshold && t >= e.circuit_open_until) {
    e.circuit_open_until = t + rc.circuit_open;
    e.request_failures = rc.circuit_failure_threshold - 1;  // half-open afterwards
  }
}

bool Sim::decide(Flight& f, Nanos t) {
  index_.expire(t);
  index_.matchLengths(f.hashes, matched_);
  const auto bs = static_cast<int64_t>(setup_.router.index.block_size);
  snaps_.resize(engines_.size());
  for (size_t i = 0; i < engines_.size(); ++i) {
    const SimEngine& e = engines_[i];
    policy::InstanceSnapshot& s = snaps_[i];
    s.healthy = admitted(e, t) && !f.excluded[i];
    s.running = e.running;
    s.waiting = e.waiting;
    s.pending_prefill_tokens = e.pending_prefill;
    s.ongoing_tokens = e.ongoing;
    s.kv_usage = e.kv_usage;
    s.matched_tokens = static_cast<int64_t>(matched_[i]) * bs;
    s.push_capable = setup_.workers;
    s.reachable = e.check_healthy && t >= e.circuit_open_until;
  }
  const trace::Request& r = requests_[f.index];
  policy::RouteRequest route;
  route.session = r.session_id;
  route.prompt_tokens = f.prompt_tokens;
  f.decision = policy_->decide(route, snaps_, t);
  f.decided_at = t;
  f.status = 0;
  if (f.decision.instance < 0) {
    f.instance = -1;
    return false;
  }
  SimEngine& chosen = engines_[f.decision.instance];
  f.instance = f.decision.instance;
  f.own_matched = std::min(snaps_[f.instance].matched_tokens, f.prompt_tokens);
  f.peer = f.decision.mode == policy::Mode::kPushMigrate      ? f.decision.source_instance
           : f.decision.mode == policy::Mode::kPrefillOffload ? f.decision.prefill_instance
                                                              : -1;
  if (f.peer >= 0) holdPeer(f, snaps_[f.peer].matched_tokens);
  f.uncached = f.prompt_tokens - f.decision.predicted_cached_tokens;
  chosen.running += 1;
  chosen.pending_prefill += f.uncached;
  chosen.ongoing += f.prompt_tokens + f.max_tokens;
  f.prefill_pending = true;
  f.load_held = true;
  return true;
}

void Sim::onRoute(uint32_t index, Nanos t) {
  Flight* f = flights_[index].get();
  if (f == nullptr) return;  // timed out before reaching the router
  const router::RouterConfig& rc = setup_.router;
  const Overheads& o = setup_.sim.overheads;
  Nanos back = t + ms(o.response_ms);
  for (f->attempt = 1; f->attempt <= rc.max_attempts; ++f->attempt) {
    if (!decide(*f, t)) {
      if (f->attempt > 1) break;
      f->status = 503;
      finishAttempt(*f, t);
      failAtClient(*f, back, 503, "HTTP 503: no healthy instance available");
      return;
    }
    SimEngine& e = engines_[f->instance];
    if (!e.up) {  // connection refused: exclude the instance and decide again
      upstreamFailure(e, t);
      f->excluded[f->instance] = true;
      finishAttempt(*f, t);
      if (f->attempt < rc.max_attempts) ++stats_.retries;
      continue;
    }
    e.request_failures = 0;
    f->incarnation = e.incarnation;
    index_.addSoft(f->instance, f->hashes, t, false);
    f->outcome.instance = instance_ids_[f->instance];
    f->outcome.decision = std::string(policy::modeName(f->decision.mode));
    f->outcome.reason = std::string(f->decision.reason);
    f->outcome.predicted_cached_tokens = f->decision.predicted_cached_tokens;
    f->outcome.http_status = 200;
    f->status = 200;
    if (f->decision.mode == policy::Mode::kPrefillOffload && f->peer >= 0) {
      startPrefill(*f, t);  // D gets the request once P answers (or fails)
    } else {
      sendToDecoder(*f, t);
    }
    return;
  }
  f->status = 502;
  failAtClient(*f, back, 502,
               strCat("HTTP 502: upstream unavailable after ", rc.max_attempts, " attempts"));
}

// Releases the attempt's load on its instance and writes its decision-log line.
void Sim::finishAttempt(Flight& f, Nanos t) {
  if (f.prefill_phase) {  // abandoned during the offload's prefill: give the cap back
    SimEngine& p = engines_[f.peer];
    if (p.up && p.incarnation == f.peer_incarnation) p.core->abort(std::to_string(f.index));
    f.prefill_phase = false;
    policy_->offloadFinished();
  }
  releasePeer(f);
  if (f.instance >= 0 && f.load_held) {
    SimEngine& e = engines_[f.instance];
    if (f.prefill_pending) e.pending_prefill -= f.uncached;
    e.running -= 1;
    e.ongoing -= f.prompt_tokens + f.max_tokens;
    f.prefill_pending = false;
    f.load_held = false;
  }
  if (!decisions_) return;
  router::DecisionRecord record;
  record.ts = nanosToSeconds(f.decided_at);
  record.request_id = requests_[f.index].id;
  record.session = requests_[f.index].session_id;
  record.policy = std::string(policy::policyKindName(policy_->kind()));
  record.instance = f.instance >= 0 ? instance_ids_[f.instance] : "";
  record.mode = std::string(policy::modeName(f.decision.mode));
  record.reason = std::string(f.decision.reason);
  record.request_class = std::string(policy::requestClassName(f.decision.request_class));
  record.attempt = f.attempt;
  record.prompt_tokens = f.prompt_tokens;
  record.predicted_cached_tokens = f.decision.predicted_cached_tokens;
  if (f.outcome.cached_tokens >= 0) record.actual_cached_tokens = f.outcome.cached_tokens;
  record.status = f.status;
  record.duration_s = nanosToSeconds(t - f.decided_at);
  for (size_t i = 0; i < f.decision.scores.size() && i < instance_ids_.size(); ++i) {
    record.scores.emplace_back(instance_ids_[i], f.decision.scores[i]);
  }
  decisions_->write(record);
}

void Sim::onFirstToken(uint32_t index, Nanos t) {
  Flight* f = flights_[index].get();
  if (f == nullptr || !f->load_held || !f->prefill_pending) return;
  engines_[f->instance].pending_prefill -= f->uncached;
  f->prefill_pending = false;
  (void)t;
}

void Sim::onFinish(uint32_t index, Nanos t) {
  Flight* f = flights_[index].get();
  if (f == nullptr) return;
  f->in_engine = false;
  finishAttempt(*f, t);
  complete(*f, t);
}

void Sim::applyKv(int instance, std::vector<SimKvEvent>& batch) {
  for (SimKvEvent& event : batch) {
    if (auto* stored = std::get_if<worker::BlockStored>(&event);
        stored && stored->token_ids.empty()) {  // token-free: the engine hashes as the index
      index_.storeOwnHashes(instance, protocol::rawHashes(stored->block_hashes),
                            stored->parent_block_hash.has_value(),
                            stored->parent_block_hash.value_or(worker::BlockHash()).value(),
                            static_cast<size_t>(stored->block_size));
    } else if (stored) {
      policy::StoredBlocks blocks;
      std::span<const uint64_t> hashes = protocol::rawHashes(stored->block_hashes);
      blocks.engine_hashes.assign(hashes.begin(), hashes.end());
      blocks.has_parent = stored->parent_block_hash.has_value();
      blocks.engine_parent = stored->parent_block_hash.value_or(worker::BlockHash()).value();
      blocks.token_ids.assign(stored->token_ids.begin(), stored->token_ids.end());
      blocks.block_size = static_cast<size_t>(stored->block_size);
      index_.storeBlocks(instance, blocks);
    } else if (auto* removed = std::get_if<worker::BlockRemoved>(&event)) {
      index_.removeBlocks(instance, protocol::rawHashes(removed->block_hashes));
    } else {
      index_.clearInstance(instance);
    }
  }
}

}  // namespace kvf::experiments::sim
