// The worker's view of what its engine caches: engine block hash -> KV pool block index, with
// pin counts that keep a block from being evicted while a peer reads it (KV push). The engine's
// KV pool updates it as blocks are cached and evicted; it is owned by the engine loop thread,
// and other threads (the push server, later) must post to that thread.
#pragma once

#include <cassert>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "common/flat_u64_map.h"
#include "worker/kv_events.h"

namespace kvf::worker {

using BlockIndex = uint32_t;

class BlockTable {
 public:
  // Records that `hash` is cached in pool block `block`. False when the hash is already present
  // (the caller keeps its own block uncached).
  // (insert, erase and find are inline: an engine calls them once per block in its loops.)
  bool insert(BlockHash hash, BlockIndex block) {
    return entries_.tryEmplace(hash.value(), Entry{block, 0}).second;
  }
  // Forgets `hash`; its pin count must be zero (a pinned block is never evicted).
  void erase(BlockHash hash) {
    Entry* e = entries_.find(hash.value());
    if (e == nullptr) return;
    assert(e->pins == 0 && "evicting a pinned block");
    entries_.eraseValue(e);
  }
  std::optional<BlockIndex> find(BlockHash hash) const {
    const Entry* e = entries_.find(hash.value());
    if (e == nullptr) return std::nullopt;
    return e->block;
  }
  // Brings the slot of `hash` towards the cache ahead of an insert / erase / find.
  void prefetch(BlockHash hash) const { entries_.prefetch(hash.value()); }
  bool contains(BlockHash hash) const { return entries_.find(hash.value()) != nullptr; }
  size_t size() const { return entries_.size(); }
  void clear() { entries_.clear(); }

  // Pin / unpin a cached hash. pin() fails with NotFound when the hash is not cached; unpin()
  // fails with FailedPrecondition when it is not pinned.
  absl::Status pin(BlockHash hash);
  absl::Status unpin(BlockHash hash);
  uint32_t pins(BlockHash hash) const;

 private:
  struct Entry {
    BlockIndex block = 0;
    uint32_t pins = 0;
  };
  // Open addressing, one probe per cache line (engine block hashes are uniform xxh3 values).
  FlatU64Map<Entry> entries_;
};

}  // namespace kvf::worker
