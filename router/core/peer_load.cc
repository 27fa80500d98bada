#include "router/core/peer_load.h"

#include <algorithm>

namespace kvf::router {
namespace {

InFlightLoad plus(const InFlightLoad& a, const InFlightLoad& b) {
  return {a.running + b.running, a.pending_prefill_tokens + b.pending_prefill_tokens,
          a.ongoing_tokens + b.ongoing_tokens};
}

InFlightLoad minus(const InFlightLoad& a, const InFlightLoad& b) {
  return {a.running - b.running, a.pending_prefill_tokens - b.pending_prefill_tokens,
          a.ongoing_tokens - b.ongoing_tokens};
}

bool idle(const InFlightLoad& load) { return load == InFlightLoad{}; }

}  // namespace

void ReplicaLoadPublisher::start(ReplicaMessage::Kind kind, int64_t unix_ns, ReplicaMessage* out) {
  out->kind = kind;
  out->replica = replica_;
  out->epoch = epoch_;
  out->seq = ++seq_;
  out->sent_unix_ns = unix_ns;
  out->entries.clear();
}

bool ReplicaLoadPublisher::delta(const std::map<std::string, InFlightLoad>& own, int64_t unix_ns,
                                 ReplicaMessage* out) {
  std::vector<ReplicaLoadEntry> changes;
  // Both maps are sorted by id: one merge walk finds every change.
  auto o = own.begin();
  auto p = published_.begin();
  while (o != own.end() || p != published_.end()) {
    if (p == published_.end() || (o != own.end() && o->first < p->first)) {
      if (!idle(o->second)) changes.push_back({o->first, o->second});
      ++o;
    } else if (o == own.end() || p->first < o->first) {
      changes.push_back({p->first, minus({}, p->second)});
      ++p;
    } else {
      if (o->second != p->second) changes.push_back({o->first, minus(o->second, p->second)});
      ++o;
      ++p;
    }
  }
  if (changes.empty()) return false;
  start(ReplicaMessage::Kind::kDelta, unix_ns, out);
  out->entries = std::move(changes);
  published_.clear();
  for (const auto& [id, load] : own) {
    if (!idle(load)) published_.emplace(id, load);
  }
  return true;
}

void ReplicaLoadPublisher::snapshot(const std::map<std::string, InFlightLoad>& own, int64_t unix_ns,
                                    ReplicaMessage* out) {
  start(ReplicaMessage::Kind::kSnapshot, unix_ns, out);
  published_.clear();
  for (const auto& [id, load] : own) {
    if (idle(load)) continue;
    out->entries.push_back({id, load});
    published_.emplace(id, load);
  }
}

PeerLoadTable::Outcome PeerLoadTable::apply(const ReplicaMessage& m, Nanos now) {
  if (m.replica == self_) return Outcome::kSelf;
  if (m.entries.size() > limits_.max_instances) return Outcome::kTooLarge;
  auto it = peers_.find(m.replica);
  if (it == peers_.end()) {
    if (peers_.size() >= limits_.max_peers) return Outcome::kTooManyPeers;
    it = peers_.emplace(m.replica, Peer{}).first;
    it->second.epoch = m.epoch;
  }
  Peer& peer = it->second;
  if (m.epoch != peer.epoch) {
    // The peer restarted: what it had in flight died with it; its new sequence starts over.
    peer = Peer{};
    peer.epoch = m.epoch;
  } else if (peer.seq != 0 && m.seq <= peer.seq) {
    return Outcome::kDuplicate;
  }
  peer.last_heard = now;
  const bool snapshot = m.kind == ReplicaMessage::Kind::kSnapshot;
  if (!snapshot) {
    if (!peer.synced) {
      peer.seq = m.seq;
      return Outcome::kAwaitingResync;
    }
    if (m.seq != peer.seq + 1) {
      // A delta went missing: the sum is wrong from here on. The last known figures stay until
      // the peer's next snapshot replaces them (at most snapshot_interval away).
      ++gaps_;
      peer.synced = false;
      peer.seq = m.seq;
      return Outcome::kGap;
    }
  }
  peer.seq = m.seq;
  if (snapshot) {
    peer.synced = true;
    peer.load.clear();
  }
  for (const ReplicaLoadEntry& e : m.entries) {
    auto found = peer.load.find(e.instance);
    if (found == peer.load.end()) {
      if (idle(e.load) || peer.load.size() >= limits_.max_instances) continue;
      peer.load.emplace(e.instance, e.load);
      continue;
    }
    found->second = snapshot ? e.load : plus(found->second, e.load);
    if (idle(found->second)) peer.load.erase(found);
  }
  return Outcome::kApplied;
}

size_t PeerLoadTable::expire(Nanos now) {
  size_t dropped = std::erase_if(
      peers_, [&](const auto& entry) { return now - entry.second.last_heard > peer_timeout_; });
  expired_ += dropped;
  return dropped;
}

InFlightLoad PeerLoadTable::clamp(InFlightLoad load) const {
  load.running = std::clamp<int64_t>(load.running, 0, limits_.max_running);
  load.pending_prefill_tokens =
      std::clamp<int64_t>(load.pending_prefill_tokens, 0, limits_.max_tokens);
  load.ongoing_tokens = std::clamp<int64_t>(load.ongoing_tokens, 0, limits_.max_tokens);
  return load;
}

InFlightLoad PeerLoadTable::total(std::string_view instance) const {
  InFlightLoad sum;
  const std::string key(instance);
  for (const auto& [id, peer] : peers_) {
    auto it = peer.load.find(key);
    if (it != peer.load.end()) sum = plus(sum, clamp(it->second));
  }
  return sum;
}

std::vector<PeerLoadTable::PeerView> PeerLoadTable::peers() const {
  std::vector<PeerView> out;
  for (const auto& [id, peer] : peers_) {
    PeerView view{id, peer.epoch, peer.seq, peer.synced, peer.last_heard, {}};
    for (const auto& [instance, load] : peer.load) view.load = plus(view.load, clamp(load));
    out.push_back(std::move(view));
  }
  return out;
}

Nanos PeerLoadTable::maxSilence(Nanos now) const {
  Nanos longest = 0;
  for (const auto& [id, peer] : peers_) longest = std::max(longest, now - peer.last_heard);
  return longest;
}

}  // namespace kvf::router
