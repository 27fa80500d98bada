// KV push and prefill offload in the simulator: what router/migration.cc reports to the
// routing core, over the engine core's remote-KV API (engine/engine_core.h). Push-migrate sends
// the request to D with the holder C as its KV source; offload first runs a one-token prefill
// on P under a lease, then sends the request to D with P's blocks as the source (D prefills
// locally if P fails). A fetch pins the holder's leading run, lasts the profile's link time
// (TimingModel::transferDuration) and then completes (or fails) on D.
#include <charconv>

#include "common/strings.h"
#include "experiments/sim/sim_internal.h"

namespace kvf::experiments::sim {

namespace {

uint32_t indexOf(const std::string& id) {
  uint32_t index = 0;
  std::from_chars(id.data(), id.data() + id.size(), index);
  return index;
}

}  // namespace

void Sim::sendToDecoder(Flight& f, Nanos t) {
  const Overheads& o = setup_.sim.overheads;
  double forward =
      o.forward_ms + o.forward_per_ktoken_ms * static_cast<double>(f.route.prompt_tokens) / 1000.0;
  push(t + ms(forward), Ev::kEngineArrive, f.index);
}

void Sim::startPrefill(Flight& f, Nanos t) {
  SimEngine& p = engines_[f.route.peer()];
  if (!p.up) {  // connection refused: D prefills locally
    core(f).upstreamFailure(f.route.peer(), t);
    prefillFailed(f, t);
    return;
  }
  f.prefill_phase = true;
  f.peer_incarnation = p.incarnation;
  sendToDecoder(f, t);  // the same hop, to P
}

void Sim::onPrefillArrive(Flight& f, Nanos t) {
  const int peer = f.route.peer();
  SimEngine& p = engines_[peer];
  if (!p.up || p.incarnation != f.peer_incarnation) {
    core(f).upstreamFailure(peer, t);
    prefillFailed(f, t);
    return;
  }
  if (p.error_status != 0) {  // P answers an error: D prefills locally
    prefillFailed(f, t);
    return;
  }
  if (p.stalled) {  // P never answers: the router gives up after prefill_timeout
    push(t + core(f).policy().offloadTerms().prefill_timeout, Ev::kPrefillTimeout, f.index);
    return;
  }
  engine::RequestSpec spec;
  spec.id = std::to_string(f.index);
  spec.tag = f.index;
  fillPrompt(f, spec, true);  // D needs the prompt too
  spec.sampling.max_tokens = 1;
  spec.sampling.ignore_eos = true;
  double lease_ns = static_cast<double>(core(f).policy().offloadTerms().lease_ms) * 1e6;
  spec.remote_decode_lease = engineTime(static_cast<Nanos>(lease_ns));
  absl::Status added = p.core->validate(spec);
  if (added.ok()) added = p.core->add(std::move(spec), engineTime(t));
  if (!added.ok()) {
    prefillFailed(f, t);
    return;
  }
  publish(p);
  if (!p.busy) startStep(peer, t);
}

void Sim::onPrefillDone(uint32_t index, Nanos t) {
  Flight* f = flights_[index].get();
  if (f == nullptr || !f->prefill_phase) return;  // abandoned: the lease expires on P
  f->prefill_phase = false;
  router::RequestRoute& route = f->route;
  route.endPeerLoad();
  route.releaseOffload();
  route.peerSucceeded();
  core(*f).upstreamSuccess(route.peer());
  core(*f).predictPeer(route, t);  // P caches the prompt's blocks too
  sendToDecoder(*f, t);
}

void Sim::onPrefillTimeout(uint32_t index, Nanos t) {
  Flight* f = flights_[index].get();
  if (f == nullptr || !f->prefill_phase) return;  // answered, or abandoned, meanwhile
  core(*f).upstreamFailure(f->route.peer(), t);
  prefillFailed(*f, t, "timeout");
}

void Sim::prefillFailed(Flight& f, Nanos t, std::string_view outcome) {
  if (f.prefill_phase) {
    SimEngine& p = engines_[f.route.peer()];
    if (p.up && p.incarnation == f.peer_incarnation) p.core->abort(std::to_string(f.index));
  }
  f.prefill_phase = false;
  f.route.endPeerLoad();
  f.route.releaseOffload();
  f.route.peerFailed(outcome);  // D prefills everything it does not hold itself
  f.lease_id.clear();
  f.lease_hashes.clear();
  sendToDecoder(f, t);
}

void Sim::startFetches(int instance, std::vector<engine::RemoteKvFetch>& fetches, Nanos t) {
  SimEngine& d = engines_[instance];
  const auto bs = static_cast<int64_t>(setup_.engine.cache.block_size);
  for (engine::RemoteKvFetch& fetch : fetches) {
    Push p;
    p.dest = instance;
    p.dest_incarnation = d.incarnation;
    p.holder = static_cast<int>(indexOf(fetch.source));
    p.id = fetch.id;
    uint32_t index = indexOf(fetch.id);
    if (index < flights_.size() && flights_[index]) p.lease_id = flights_[index]->lease_id;
    Nanos duration = 0;
    if (p.holder >= 0 && p.holder < static_cast<int>(engines_.size()) && p.holder != instance) {
      SimEngine& h = engines_[p.holder];
      p.holder_incarnation = h.incarnation;
      if (h.up && !h.refuse_push) {
        std::vector<engine::BlockIndex> pinned = h.core->pinLeadingRun(fetch.hashes);
        p.pinned.assign(fetch.hashes.begin(),
                        fetch.hashes.begin() + static_cast<std::ptrdiff_t>(pinned.size()));
        p.blocks = std::min(pinned.size(), fetch.blocks.size());
        if (p.blocks > 0) {
          auto tokens = static_cast<int64_t>(p.blocks) * bs;
          duration = wallDuration(d.core->timing().transferDuration(tokens));
        }
      }
    }
    p.started = t;
    uint64_t id = next_push_++;
    pushes_.emplace(id, std::move(p));
    push(t + duration, Ev::kKvPushDone, static_cast<uint32_t>(instance), id);
  }
}

void Sim::onKvPushDone(uint64_t push_id, Nanos t) {
  auto node = pushes_.extract(push_id);
  if (node.empty()) return;
  Push& p = node.mapped();
  SimEngine& h = engines_[p.holder];
  bool holder_alive = h.up && h.incarnation == p.holder_incarnation;
  if (holder_alive) {
    if (!p.pinned.empty()) h.core->unpin(p.pinned);
    if (!p.lease_id.empty()) h.core->releaseLease(p.lease_id);
  }
  SimEngine& d = engines_[p.dest];
  if (!d.up || d.incarnation != p.dest_incarnation) return;
  if (uint32_t index = indexOf(p.id); holder_alive && p.blocks > 0 && index < flights_.size()) {
    Flight* f = flights_[index].get();
    if (f != nullptr && f->route.peer() == p.holder && f->route.instance() == p.dest) {
      core(*f).reportMove(f->route, nanosToSeconds(t - p.started));
    }
  }
  size_t filled = holder_alive ? p.blocks : 0;
  absl::Status s = filled > 0 ? d.core->completeRemoteKv(p.id, filled, engineTime(t))
                              : d.core->failRemoteKv(p.id, engineTime(t), false);
  // An aborted request (client timeout) left its landing blocks quarantined: no write can
  // land any more.
  if (!s.ok()) d.core->releaseRemoteKvLanding(p.id);
  publish(d);
  if (!d.busy) startStep(p.dest, t);
}

}  // namespace kvf::experiments::sim
