// The router side of the simulator: the events kvf-router's shell reports to the routing core
// (router/core/routing_core.h), at the simulated times they happen. A request is decided when
// it reaches the router; an engine that is down refuses the connection (the attempt fails, its
// instance is excluded and counted against its circuit, and the request is decided again up to
// max_attempts); an engine that accepts resets its circuit and gets the attempt's predicted
// entries; the pending prefill tokens go at the first token and the rest at the end; each
// attempt writes its decision-log line.
#include <algorithm>

#include "common/strings.h"
#include "experiments/sim/sim_internal.h"

namespace kvf::experiments::sim {

bool Sim::decide(Flight& f, Nanos t) {
  bool chosen = core(f).decide(f.route, t);
  f.decided_at = t;
  f.status = 0;
  return chosen;
}

void Sim::onRoute(uint32_t index, Nanos t) {
  Flight* f = flights_[index].get();
  if (f == nullptr) return;  // timed out before reaching the router
  router::ShedReason why{};
  switch (core(*f).admit(f->route, index, t, &why)) {
    case router::RoutingCore::Admission::kDispatch:
      routeAdmitted(index, t);
      return;
    case router::RoutingCore::Admission::kQueued:
      push(t + core(*f).overloadConfig().max_wait, Ev::kQueueTimeout, index);
      return;
    case router::RoutingCore::Admission::kShed:
      f->status = 429;
      failAtClient(*f, t + ms(setup_.sim.overheads.response_ms), 429,
                   strCat("HTTP 429: overloaded (", router::shedReasonName(why), ")"));
      return;
  }
}

void Sim::drainQueue(Nanos t) {
  if (draining_queue_) return;
  draining_queue_ = true;      // a request sent on may free capacity again: this loop takes it
  for (auto& core : cores_) {  // each replica holds its own queue
    if (core->queueDepth() == 0) continue;
    while (std::optional<uint64_t> ticket = core->nextDispatch(t)) {
      routeAdmitted(static_cast<uint32_t>(*ticket), t);
    }
  }
  draining_queue_ = false;
}

void Sim::onQueueTimeout(uint32_t index, Nanos t) {
  Flight* f = flights_[index].get();
  if (f == nullptr || !core(*f).expireQueued(index, t)) return;
  f->status = 429;
  failAtClient(*f, t + ms(setup_.sim.overheads.response_ms), 429,
               "HTTP 429: overloaded (wait_timeout)");
}

void Sim::routeAdmitted(uint32_t index, Nanos t) {
  Flight* f = flights_[index].get();
  if (f == nullptr) return;
  const router::RouterConfig& rc = setup_.router;
  const Overheads& o = setup_.sim.overheads;
  Nanos back = t + ms(o.response_ms);
  router::RequestRoute& route = f->route;
  while (route.attempt() < rc.max_attempts) {
    if (!decide(*f, t)) {
      if (route.attempt() > 1) break;
      f->status = 503;
      finishAttempt(*f, t);
      failAtClient(*f, back, 503, "HTTP 503: no healthy instance available");
      return;
    }
    const int instance = route.instance();
    SimEngine& e = engines_[instance];
    if (!e.up) {  // connection refused: exclude the instance and decide again
      core(*f).upstreamFailure(instance, t);
      route.exclude();
      finishAttempt(*f, t);
      if (route.attempt() < rc.max_attempts) ++stats_.retries;
      continue;
    }
    core(*f).upstreamSuccess(instance);
    f->incarnation = e.incarnation;
    core(*f).predict(route, t);
    const policy::Decision& d = route.decision();
    f->outcome.instance = instance_ids_[instance];
    f->outcome.decision = std::string(policy::modeName(d.mode));
    f->outcome.reason = std::string(d.reason);
    f->outcome.predicted_cached_tokens = route.predictedCachedTokens();
    f->outcome.http_status = 200;
    f->status = 200;
    if (d.mode == policy::Mode::kPrefillOffload && route.peer() >= 0) {
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

// Releases the attempt's leases and writes its decision-log line.
void Sim::finishAttempt(Flight& f, Nanos t) {
  if (f.prefill_phase) {  // abandoned during the offload's prefill: give the cap back
    SimEngine& p = engines_[f.route.peer()];
    if (p.up && p.incarnation == f.peer_incarnation) p.core->abort(std::to_string(f.index));
    f.prefill_phase = false;
    f.route.releaseOffload();
  }
  f.route.endAttempt();
  drainQueue(t);
  if (!decisions_) return;
  router::DecisionRecord record;
  core(f).fillRecord(f.route, &record);
  record.ts = nanosToSeconds(f.decided_at);
  record.request_id = requests_[f.index].id;
  if (f.outcome.cached_tokens >= 0) record.actual_cached_tokens = f.outcome.cached_tokens;
  record.status = f.status;
  record.duration_s = nanosToSeconds(t - f.decided_at);
  decisions_->write(std::move(record));
}

void Sim::onFirstToken(uint32_t index, Nanos t) {
  if (Flight* f = flights_[index].get()) f->route.endPrefill();
  drainQueue(t);
}

void Sim::onFinish(uint32_t index, Nanos t) {
  Flight* f = flights_[index].get();
  if (f == nullptr) return;
  f->in_engine = false;
  finishAttempt(*f, t);
  complete(*f, t);
}

namespace {

policy::StoredBlocks storedBlocks(const worker::BlockStored& stored) {
  policy::StoredBlocks blocks;
  std::span<const uint64_t> hashes = protocol::rawHashes(stored.block_hashes);
  blocks.engine_hashes.assign(hashes.begin(), hashes.end());
  blocks.has_parent = stored.parent_block_hash.has_value();
  blocks.engine_parent = stored.parent_block_hash.value_or(worker::BlockHash()).value();
  blocks.token_ids.assign(stored.token_ids.begin(), stored.token_ids.end());
  blocks.block_size = static_cast<size_t>(stored.block_size);
  return blocks;
}

// The event's tier when it is not the GPU cache ("CPU", "DISK", ...), else empty.
template <class Event>
std::string_view lowerTier(const Event& event) {
  if (!event.medium || *event.medium == protocol::kMediumGpu) return {};
  return *event.medium;
}

}  // namespace

void Sim::applyKv(int instance, std::vector<SimKvEvent>& batch) {
  // Every replica subscribes to every engine: each index gets the same events.
  for (auto& core : cores_) applyKv(*core, instance, batch);
}

void Sim::applyKv(router::RoutingCore& core, int instance, const std::vector<SimKvEvent>& batch) {
  policy::CacheIndex& index = core.index();
  for (const SimKvEvent& event : batch) {
    if (auto* stored = std::get_if<worker::BlockStored>(&event);
        stored && !lowerTier(*stored).empty()) {  // the engine's tiers: the routing core's own
      core.storeTierBlocks(instance, 0, lowerTier(*stored), storedBlocks(*stored));
    } else if (auto* tier_removed = std::get_if<worker::BlockRemoved>(&event);
               tier_removed && !lowerTier(*tier_removed).empty()) {
      core.removeTierBlocks(instance, lowerTier(*tier_removed),
                            protocol::rawHashes(tier_removed->block_hashes));
    } else if (stored && stored->token_ids.empty()) {  // token-free: the engine hashes as the index
      index.storeOwnHashes(instance, protocol::rawHashes(stored->block_hashes),
                           stored->parent_block_hash.has_value(),
                           stored->parent_block_hash.value_or(worker::BlockHash()).value(),
                           static_cast<size_t>(stored->block_size));
    } else if (stored) {
      index.storeBlocks(instance, storedBlocks(*stored));
    } else if (auto* removed = std::get_if<worker::BlockRemoved>(&event)) {
      index.removeBlocks(instance, protocol::rawHashes(removed->block_hashes));
    } else {
      index.clearInstance(instance);
      core.clearTiers(instance);
    }
  }
}

}  // namespace kvf::experiments::sim
