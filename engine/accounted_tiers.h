// The simulator's KV tiers: which blocks host memory (G2) and disk (G3) hold, by the same rules
// as worker::TieredStore (write-through to disk, LRU in each tier, byte budgets counted in the
// same slots, a block leaves host memory only with a copy on disk or as a counted capacity drop)
// but without payload bytes or threads: an onboard is ready at once, and what it costs is the
// timing model's. Owned by one EngineCore; its thread only.
#pragma once

#include <cstdint>
#include <list>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "engine/lower_tiers.h"
#include "worker/tiers/tiered_store.h"

namespace kvf::engine {

class AccountedTiers final : public LowerTiers {
 public:
  // Capacities in blocks as the live tiers cut their budgets: host slots are `block_bytes`
  // rounded up to 4 KiB, disk slots add a header sector (worker/tiers/disk_format.h).
  explicit AccountedTiers(const worker::TieredStoreOptions& options);

  void offload(std::span<const worker::BlockHash> hashes,
               std::span<const std::span<const std::byte>> payloads) override;
  TierRun lookup(std::span<const worker::BlockHash> hashes) override;
  std::unique_ptr<TierOnboard> onboard(std::span<const worker::BlockHash> hashes,
                                       std::span<const std::span<std::byte>> destinations) override;
  // Instant here: the modelled time of a promotion is the engine's (QueuedPrefetch).
  PromoteOutcome promote(worker::BlockHash hash) override;
  HostRoom hostRoom() const override;
  void touch(std::span<const worker::BlockHash> hashes) override;
  std::vector<worker::KvEvent> takeEvents() override;

  struct Counts {
    uint64_t host_stored = 0;       // blocks that entered host memory
    uint64_t host_moved_down = 0;   // left host memory with a copy on disk
    uint64_t disk_written = 0;      // blocks written to disk
    uint64_t dropped_capacity = 0;  // left the lowest tier for good
    uint64_t onboarded_host = 0;
    uint64_t onboarded_disk = 0;
    uint64_t promoted = 0;  // disk -> host promotions
  };
  const Counts& counts() const { return counts_; }
  size_t hostBlocks() const { return host_.size(); }
  size_t diskBlocks() const { return disk_.size(); }
  size_t hostCapacity() const { return host_.capacity; }
  size_t diskCapacity() const { return disk_.capacity; }

 private:
  // One tier's LRU: the front is the least recently used.
  struct Lru {
    size_t capacity = 0;
    std::list<uint64_t> order;
    absl::flat_hash_map<uint64_t, std::list<uint64_t>::iterator> where;
    size_t size() const { return where.size(); }
    bool contains(uint64_t key) const { return where.contains(key); }
    void touch(uint64_t key);
    // Inserts (or refreshes) key; the evicted key, if one had to leave.
    std::optional<uint64_t> insert(uint64_t key);
  };
  // Records a store or removal (Event) of `key` in `tier`, as the live tiers publish them (the
  // router's per-tier index).
  template <class Event>
  void append(worker::TierId tier, uint64_t key);
  // Puts `key` in host memory (its LRU's newest); the evicted block moves down or is dropped.
  void storeInHost(uint64_t key);

  Lru host_;
  Lru disk_;
  std::vector<worker::KvEvent> events_;
  bool has_disk_ = false;
  Counts counts_;
};

}  // namespace kvf::engine
