// The cache index's holder table: for each BlockHash, the instances that hold the block exactly
// (from their KV events), as one open-addressed array of 16-byte slots with linear probing
// (common/flat_u64_map.h), so a lookup touches one cache line (a second only when its probe run
// crosses one), kept at most a quarter full by default (CacheIndexConfig::table_max_load).
// Block hashes are already uniform, so the slot comes from one salted multiply; big tables ask
// for transparent huge pages. Routed (soft) holders live in policy/soft_tree.h instead.
// Single-threaded, owned by CacheIndex.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/flat_u64_map.h"
#include "policy/block_hash.h"

namespace kvf::policy {

class HolderTable {
 public:
  // A present block's holders are non-zero.
  using Entry = InstanceMask;

  // `salt` must be odd: it keys the slot choice, so crafted prompts cannot aim at one probe run.
  // The array doubles once more than max_load_eighths / 8 of its slots would be used.
  HolderTable(uint64_t salt, int max_load_eighths) : map_(salt, max_load_eighths) {}

  // Holders of `hash`; 0 when absent.
  InstanceMask get(BlockHash hash) const {
    const Entry* e = map_.find(hash.value);
    return e == nullptr ? 0 : *e;
  }
  // Brings the home slot of `hash` towards the cache ahead of get() / find() / insert().
  void prefetch(BlockHash hash) const { map_.prefetch(hash.value); }
  // The same plus the next slot's line when the home slot ends one (erase scans past it).
  void prefetchRun(BlockHash hash) const { map_.prefetchRun(hash.value); }
  // Entry-level access, one probe for several updates. Pointers stay valid until the next
  // insert(). find: null when absent. insert: finds or inserts 0; the caller then sets
  // holders (an entry must not stay empty). clearBits: holders &= ~bits, erasing the entry
  // once no holder is left.
  Entry* find(BlockHash hash) { return map_.find(hash.value); }
  const Entry* find(BlockHash hash) const { return map_.find(hash.value); }
  Entry* insert(BlockHash hash) { return map_.tryEmplace(hash.value, Entry{}).first; }
  void clearBits(Entry* e, InstanceMask bits) {
    *e &= ~bits;
    if (*e == 0) map_.eraseValue(e);
  }
  // f(hash, holders) for every block; f must not insert or erase.
  template <class F>
  void forEach(F&& f) const {
    map_.forEach([&](uint64_t key, Entry e) { f(BlockHash{key}, e); });
  }

  size_t size() const { return map_.size(); }

 private:
  FlatU64Map<Entry> map_;
};

}  // namespace kvf::policy
