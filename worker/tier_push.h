// The engine side of a KV push served from the tiers below the pool: for an engine whose lower
// tiers are a TieredStore, what EngineAdapter::pinTierRun / unpinTierRun / tierRegion do. Host
// blocks are pinned in their slots (the transport sends them from there), disk blocks are read
// into the caller's buffers through the store's onboard, checksum checked. Owned by the adapter
// and called on its engine thread only; the store must outlive it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "worker/engine_adapter.h"
#include "worker/tiers/tiered_store.h"

namespace kvf::worker {

class TierPushSource {
 public:
  explicit TierPushSource(TieredStore& store) : store_(store) {}
  ~TierPushSource();  // releases every pin still held
  TierPushSource(const TierPushSource&) = delete;
  TierPushSource& operator=(const TierPushSource&) = delete;

  // Any thread: the host tier's slot arena.
  PayloadRegion region() const;
  // EngineAdapter::pinTierRun's contract.
  TierPushRun pin(std::span<const BlockHash> hashes,
                  std::span<const std::span<std::byte>> disk_buffers,
                  absl::AnyInvocable<void(size_t) &&> on_disk_read);
  // EngineAdapter::unpinTierRun's contract.
  void unpin(uint64_t id);
  // Runs whose pins are held.
  size_t pinnedRuns() const { return pins_.size(); }

 private:
  TieredStore& store_;
  absl::flat_hash_map<uint64_t, std::vector<HostTier::Pin>> pins_;
  uint64_t next_id_ = 1;
};

}  // namespace kvf::worker
