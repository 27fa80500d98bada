// Scheduler, KV push part: receiver-side remote-KV fetches (landing blocks, complete / fail,
// quarantine of blocks a late write may still reach) and remote-decode leases.
#include <algorithm>
#include <cassert>

#include "common/strings.h"
#include "engine/scheduler.h"

namespace kvf::engine {
namespace {

void unpinAll(KvPool& pool, std::span<const BlockHash> hashes) {
  for (BlockHash h : hashes) {
    absl::Status s = pool.unpin(h);
    assert(s.ok());
    (void)s;
  }
}

}  // namespace

std::vector<BlockHash> Scheduler::remoteRun(const Request& r, size_t local,
                                            size_t max_blocks) const {
  std::vector<BlockHash> run;
  if (!r.remote_kv || !pool_->prefixCachingEnabled()) return run;
  const auto& want = r.remote_kv->block_hashes.empty() ? r.block_hashes : r.remote_kv->block_hashes;
  size_t end = std::min({max_blocks, want.size(), r.block_hashes.size()});
  for (size_t i = local; i < end && want[i] == r.block_hashes[i]; ++i) run.push_back(want[i]);
  return run;
}

bool Scheduler::holdLanding(Request& r, std::span<const BlockIndex> cached,
                            std::vector<BlockHash> run) {
  const int64_t bs = pool_->blockSize();
  auto need = static_cast<int64_t>(run.size());
  if (need + pool_->countUnreferenced(cached) > pool_->numFreeBlocks()) return false;
  pool_->acquire(cached);  // before allocate(), so eviction cannot take the hit blocks
  auto fresh = pool_->allocate(need);
  assert(fresh.has_value());
  r.blocks.assign(cached.begin(), cached.end());
  r.num_cached_blocks = cached.size();
  r.num_computed_tokens = static_cast<int64_t>(cached.size()) * bs;
  r.local_hit_tokens = r.num_computed_tokens;
  r.landing_blocks = std::move(*fresh);
  r.landing_hashes = std::move(run);
  r.status = RequestStatus::kWaitingForRemoteKv;
  remote_waiting_.emplace(r.id, &r);
  return true;
}

bool Scheduler::startRemoteKv(Request& r, std::span<const BlockIndex> cached,
                              std::vector<BlockHash> run, StepResult& result) {
  const int64_t bs = pool_->blockSize();
  auto need = static_cast<int64_t>(run.size());
  if (!holdLanding(r, cached, std::move(run))) return false;
  ++stats_.remote_kv_fetches;
  RemoteKvFetch f;
  f.id = r.id;
  f.source = r.remote_kv->source;
  f.hashes = r.landing_hashes;
  f.blocks = r.landing_blocks;
  f.local_hit_tokens = r.local_hit_tokens;
  f.remaining_tokens = r.numTokens() - r.local_hit_tokens - need * bs;
  result.remote_kv_fetches.push_back(std::move(f));
  return true;
}

std::optional<bool> Scheduler::startOnboard(Request& r, std::span<const BlockIndex> cached,
                                            std::span<const BlockHash> lookup, StepResult& result) {
  LowerTiers* tiers = pool_->lowerTiers();
  if (tiers == nullptr || r.tiers_failed || cached.size() >= lookup.size()) return std::nullopt;
  TierRun run = tierRun(*tiers, lookup.subspan(cached.size()), result.start);
  if (run.size() == 0) return std::nullopt;
  std::vector<BlockHash> hashes(
      lookup.begin() + static_cast<std::ptrdiff_t>(cached.size()),
      lookup.begin() + static_cast<std::ptrdiff_t>(cached.size() + run.size()));
  if (!holdLanding(r, cached, std::move(hashes))) return false;
  r.onboarding = true;
  ++stats_.tier_onboards;
  TierOnboardStart o;
  o.id = r.id;
  o.hashes = r.landing_hashes;
  o.blocks = r.landing_blocks;
  o.host_blocks = run.host;
  o.disk_blocks = run.disk;
  if (prefetch_ != nullptr) prefetch_->onOnboard(r.landing_hashes, run.tiers);
  r.onboard_tiers = std::move(run.tiers);
  result.tier_onboards.push_back(std::move(o));
  return true;
}

TierRun Scheduler::tierRun(LowerTiers& tiers, std::span<const BlockHash> hashes, Nanos now) {
  TierRun run = tiers.lookup(hashes);
  if (prefetch_ != nullptr) prefetch_->adjustRun(hashes, run, now);
  return run;
}

absl::Status Scheduler::completeRemoteKv(const std::string& id, size_t blocks_filled, Nanos now,
                                         Nanos kv_ready_at) {
  auto it = remote_waiting_.find(id);
  if (it == remote_waiting_.end()) {
    return absl::NotFoundError(strCat("request ", id, " is not waiting for remote KV"));
  }
  Request& r = *it->second;
  if (blocks_filled > r.landing_blocks.size()) {
    return absl::InvalidArgumentError(strCat("blocks_filled: ", blocks_filled, " exceeds the ",
                                             r.landing_blocks.size(), " landing blocks"));
  }
  remote_waiting_.erase(it);
  const int64_t bs = pool_->blockSize();
  auto filled_end = r.landing_blocks.begin() + static_cast<std::ptrdiff_t>(blocks_filled);
  r.blocks.insert(r.blocks.end(), r.landing_blocks.begin(), filled_end);
  std::vector<BlockIndex> unused(filled_end, r.landing_blocks.end());
  pool_->release(unused);  // nothing can land in them any more (the driver's guarantee)
  r.landing_blocks.clear();
  r.landing_hashes.clear();
  r.num_computed_tokens += static_cast<int64_t>(blocks_filled) * bs;
  r.kv_ready_at = blocks_filled > 0 && kv_ready_at > now ? kv_ready_at : -1;
  if (r.onboarding) {
    countOnboarded(r, blocks_filled);
  } else {
    r.remote_kv_tokens = static_cast<int64_t>(blocks_filled) * bs;
    stats_.remote_kv_tokens += static_cast<uint64_t>(r.remote_kv_tokens);
  }
  cacheFullBlocks(r);  // registers the pushed blocks and emits BlockStored
  r.remote_kv.reset();
  r.status = RequestStatus::kWaiting;
  if (r.blocks.empty()) r.num_computed_tokens = 0;  // nothing held: an ordinary admission
  waiting_.push_front(&r);  // it was at the head of the queue when the fetch started
  return absl::OkStatus();
}

absl::Status Scheduler::failRemoteKv(const std::string& id, Nanos /*now*/, bool writes_may_arrive) {
  auto it = remote_waiting_.find(id);
  if (it == remote_waiting_.end()) {
    return absl::NotFoundError(strCat("request ", id, " is not waiting for remote KV"));
  }
  Request& r = *it->second;
  remote_waiting_.erase(it);
  if (r.onboarding) {
    ++stats_.tier_onboard_failures;
    r.onboarding = false;
    r.tiers_failed = true;
    r.onboard_tiers.clear();
  } else {
    ++stats_.remote_kv_failures;
  }
  if (writes_may_arrive) {
    stats_.remote_kv_blocks_quarantined += r.landing_blocks.size();
    auto& q = quarantine_[r.id];
    q.insert(q.end(), r.landing_blocks.begin(), r.landing_blocks.end());
  } else {
    pool_->release(r.landing_blocks);
  }
  // Fall back to a plain admission: the local hits are found again unless evicted meanwhile.
  releaseBlocks(r);
  r.landing_blocks.clear();
  r.landing_hashes.clear();
  r.remote_kv.reset();
  r.status = RequestStatus::kWaiting;
  waiting_.push_front(&r);
  return absl::OkStatus();
}

void Scheduler::countOnboarded(Request& r, size_t blocks_filled) {
  const int64_t bs = pool_->blockSize();
  size_t host = 0;
  for (size_t i = 0; i < blocks_filled && i < r.onboard_tiers.size(); ++i) {
    host += r.onboard_tiers[i] == worker::TierId::kHost ? 1 : 0;
  }
  size_t disk = blocks_filled - host;
  r.onboard_tiers.clear();
  r.tier_tokens = static_cast<int64_t>(blocks_filled) * bs;
  r.tier_disk_tokens = static_cast<int64_t>(disk) * bs;
  stats_.tier_host_tokens += static_cast<uint64_t>(host) * static_cast<uint64_t>(bs);
  stats_.tier_disk_tokens += static_cast<uint64_t>(disk) * static_cast<uint64_t>(bs);
  r.onboarding = false;
  if (blocks_filled == 0) ++stats_.tier_onboard_failures;
}

bool Scheduler::releaseRemoteKvLanding(const std::string& id) {
  auto it = quarantine_.find(id);
  if (it == quarantine_.end()) return false;
  pool_->release(it->second);
  stats_.remote_kv_blocks_quarantined -= it->second.size();
  quarantine_.erase(it);
  return true;
}

void Scheduler::takeLease(Request& r, Nanos now) {
  const int64_t bs = pool_->blockSize();
  ensureHashes(r);
  auto prompt_blocks = std::min(static_cast<size_t>(r.prompt_len / bs), r.block_hashes.size());
  r.lease_hashes.clear();
  for (size_t i = 0; i < prompt_blocks; ++i) {
    if (!pool_->pin(r.block_hashes[i]).ok()) break;  // the leading cached run only
    r.lease_hashes.push_back(r.block_hashes[i]);
  }
  worker::Lease lease;
  lease.hashes = r.lease_hashes;
  lease.expires_at = now + *r.remote_decode_lease;
  lease.duration = *r.remote_decode_lease;
  lease.not_after = now + std::max(*r.remote_decode_lease, r.remote_decode_lease_cap);
  unpinAll(*pool_, leases_.take(r.id, std::move(lease)));  // a reused id replaces its old lease
}

bool Scheduler::releaseLease(const std::string& lease_id) {
  std::optional<std::vector<BlockHash>> hashes = leases_.release(lease_id);
  if (!hashes) return false;
  unpinAll(*pool_, *hashes);
  return true;
}

std::optional<worker::Lease> Scheduler::detachLease(const std::string& lease_id) {
  return leases_.detach(lease_id);
}

int Scheduler::expireLeases(Nanos now) {
  if (leases_.empty()) return 0;  // every step asks
  std::vector<worker::Lease> expired = leases_.expire(now);
  for (const worker::Lease& lease : expired) unpinAll(*pool_, lease.hashes);
  stats_.leases_expired += expired.size();
  return static_cast<int>(expired.size());
}

std::optional<Nanos> Scheduler::nextLeaseExpiry() const { return leases_.nextExpiry(); }

}  // namespace kvf::engine
