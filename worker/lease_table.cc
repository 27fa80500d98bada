#include "worker/lease_table.h"

#include <algorithm>
#include <utility>

namespace kvf::worker {

std::vector<BlockHash> LeaseTable::take(const std::string& id, Lease lease) {
  auto [it, inserted] = leases_.try_emplace(id);
  std::vector<BlockHash> replaced;
  if (!inserted) replaced = std::move(it->second.hashes);
  blocks_ = blocks_ - replaced.size() + lease.hashes.size();
  it->second = std::move(lease);
  return replaced;
}

std::optional<std::vector<BlockHash>> LeaseTable::release(const std::string& id) {
  std::optional<Lease> lease = detach(id);
  if (!lease) return std::nullopt;
  return std::move(lease->hashes);
}

std::optional<Lease> LeaseTable::detach(const std::string& id) {
  auto it = leases_.find(id);
  if (it == leases_.end()) return std::nullopt;
  Lease lease = std::move(it->second);
  leases_.erase(it);
  blocks_ -= lease.hashes.size();
  return lease;
}

std::vector<Lease> LeaseTable::expire(Nanos now) {
  std::vector<Lease> due;
  if (leases_.empty()) return due;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expires_at <= now) {
      blocks_ -= it->second.hashes.size();
      due.push_back(std::move(it->second));
      leases_.erase(it++);
    } else {
      ++it;
    }
  }
  return due;
}

std::optional<Nanos> LeaseTable::nextExpiry() const {
  std::optional<Nanos> next;
  for (const auto& [id, lease] : leases_) {
    if (!next || lease.expires_at < *next) next = lease.expires_at;
  }
  return next;
}

const Lease* LeaseTable::heartbeat(const std::string& id, Nanos now) {
  auto it = leases_.find(id);
  if (it == leases_.end()) return nullptr;
  Lease& lease = it->second;
  if (lease.expires_at <= now) return nullptr;  // due: expire() frees it, no resurrection
  Nanos extended = now + lease.duration * 2 / 3;
  if (lease.not_after > 0) extended = std::min(extended, lease.not_after);
  lease.expires_at = std::max(lease.expires_at, extended);
  return &lease;
}

}  // namespace kvf::worker
