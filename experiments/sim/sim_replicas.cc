// Router replicas in the simulator: every sync_interval each replica builds its load message
// from its own leases with the same publisher kvf-router uses (router/core/peer_load.h), and
// link_ms later every other replica applies it to its peer table and folds the sums into its
// routing core. With sync off the replicas are blind to each other's in-flight load; the KV
// events reach every replica's index either way.
#include "common/strings.h"
#include "experiments/sim/sim_internal.h"

namespace kvf::experiments::sim {

void Sim::initReplicaSync() {
  const ReplicaSim& r = setup_.sim.replicas;
  if (cores_.size() < 2 || !r.sync) return;
  for (size_t i = 0; i < cores_.size(); ++i) {
    const std::string id = strCat("r", i);
    publishers_.emplace_back(id, /*epoch=*/1);
    peer_tables_.emplace_back(id, ms(r.peer_timeout_ms));
  }
  push(ms(r.sync_interval_ms), Ev::kReplicaSync, 0);
}

void Sim::onReplicaSync(Nanos t) {
  const ReplicaSim& r = setup_.sim.replicas;
  const bool snapshot = t - last_replica_snapshot_ >= ms(r.snapshot_interval_ms);
  if (snapshot) last_replica_snapshot_ = t;
  std::map<std::string, router::InFlightLoad> own;
  for (size_t i = 0; i < cores_.size(); ++i) {
    own.clear();
    for (int slot = 0; slot < cores_[i]->slotEnd(); ++slot) {
      own.emplace(instance_ids_[static_cast<size_t>(slot)], cores_[i]->ownLoad(slot));
    }
    router::ReplicaMessage message;
    const Nanos unix_ns = t;  // the simulator's one clock
    if (snapshot) {
      publishers_[i].snapshot(own, unix_ns, &message);
    } else if (!publishers_[i].delta(own, unix_ns, &message)) {
      continue;
    }
    const uint64_t id = next_replica_message_++;
    replica_messages_.emplace(id, std::move(message));
    push(t + ms(r.link_ms), Ev::kReplicaDeliver, 0, id);
  }
  if (unfinished_ > 0) push(t + ms(r.sync_interval_ms), Ev::kReplicaSync, 0);
}

void Sim::onReplicaDeliver(uint64_t id, Nanos t) {
  auto it = replica_messages_.find(id);
  if (it == replica_messages_.end()) return;
  const router::ReplicaMessage message = std::move(it->second);
  replica_messages_.erase(it);
  for (size_t i = 0; i < cores_.size(); ++i) {
    router::PeerLoadTable& table = peer_tables_[i];
    table.expire(t);
    if (table.apply(message, t) != router::PeerLoadTable::Outcome::kApplied) continue;
    for (const router::ReplicaLoadEntry& e : message.entries) {
      const int slot = std::stoi(e.instance);
      cores_[i]->setPeerLoad(slot, table.total(e.instance));
    }
    if (message.kind == router::ReplicaMessage::Kind::kSnapshot) {
      for (int slot = 0; slot < cores_[i]->slotEnd(); ++slot) {
        cores_[i]->setPeerLoad(slot, table.total(instance_ids_[static_cast<size_t>(slot)]));
      }
    }
  }
}

}  // namespace kvf::experiments::sim
