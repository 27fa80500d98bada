// The cache index's holder table: for each BlockHash, the instances that hold the block exactly
// (from their KV events), as one open-addressed array of 16-byte slots with linear probing
// (common/flat_u64_map.h), so a lookup touches one cache line (a second only when its probe run
// crosses one), kept at most a quarter full by default (CacheIndexConfig::table_max_load).
// Block hashes are already uniform, so the slot comes from one salted multiply; big tables ask
// for transparent huge pages. A slot's value is a holder set in one of three forms:
//   - the word: bit i for instance i < kWordInstances (top bit clear), every block of a cluster
//     of up to 63 instances, so a small cluster's path is the single-word one;
//   - compact: top bit set, up to six 10-bit instance ids (any of the 1,024) and their count,
//     the usual block of a large cluster (one to a few holders), still one slot;
//   - far: top bit set, count 7, and the index of its set in a side table, for blocks past six
//     holders when one of them is past the word (a shared system prompt on a large cluster).
//     Far sets are shared: blocks with the same holders (a shared prefix's) point at one set,
//     so their entries are equal and a match walk decodes and compares the set once, not once
//     per block.
// Routed (soft) holders live in policy/soft_tree.h instead. Single-threaded, owned by
// CacheIndex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/flat_u64_map.h"
#include "policy/block_hash.h"
#include "policy/holder_set.h"

namespace kvf::policy {

class HolderTable {
 public:
  using Entry = uint64_t;  // a present block has a holder (a nonzero entry)
  // Listed ids a compact entry can give: get() decodes them into a caller's buffer this long.
  static constexpr size_t kCompactIds = 6;
  using Scratch = std::span<ListedInstance, kCompactIds>;

  // `salt` must be odd: it keys the slot choice, so crafted prompts cannot aim at one probe run.
  // The array doubles once more than max_load_eighths / 8 of its slots would be used.
  HolderTable(uint64_t salt, int max_load_eighths)
      : map_(salt, max_load_eighths), far_by_digest_(salt * 3, 4) {}

  // Holders of `hash`; empty when absent. The listed part may lie in `scratch` (a compact
  // entry's): valid until the table next changes and `scratch` is reused.
  HolderView get(BlockHash hash, Scratch scratch) const { return view(hash, raw(hash), scratch); }
  // The same in two steps, for loops that skip decoding an entry equal to the one before: the
  // entry of `hash` (0 when absent), then its holders.
  Entry raw(BlockHash hash) const {
    const Entry* e = map_.find(hash.value);
    return e == nullptr ? 0 : *e;
  }
  HolderView view(BlockHash hash, Entry e, Scratch scratch) const {
    if (isWord(e)) [[likely]]
      return HolderView{e, {}};
    (void)hash;
    return decode(e, scratch);
  }
  // Word entries hold their set; a far entry's set is elsewhere (equal far entries: one set).
  static bool isWord(Entry e) { return (e & kNotWord) == 0; }
  static bool isFar(Entry e) { return !isWord(e) && compactCount(e) == kFar; }
  HolderSet getSet(BlockHash hash) const {
    ListedInstance scratch[kCompactIds];
    return HolderSet(get(hash, scratch));
  }
  // Brings the home slot of `hash` towards the cache ahead of get() / find() / insert().
  void prefetch(BlockHash hash) const { map_.prefetch(hash.value); }
  // The same plus the next slot's line when the home slot ends one (erase scans past it).
  void prefetchRun(BlockHash hash) const { map_.prefetchRun(hash.value); }

  // Entry-level access, one probe for several updates. Pointers stay valid until the next
  // insert(). find: null when absent. insert: finds or inserts an empty entry, which the caller
  // must then give a holder with add().
  Entry* find(BlockHash hash) { return map_.find(hash.value); }
  const Entry* find(BlockHash hash) const { return map_.find(hash.value); }
  Entry* insert(BlockHash hash) { return map_.tryEmplace(hash.value, Entry{}).first; }
  // Whether `instance` holds `hash`, whose entry is `e` (null: absent).
  bool holds(const Entry* e, BlockHash hash, int instance) const;
  // Adds / removes `instance` (0 .. kMaxInstances - 1) as a holder of `hash` (entry `e`);
  // remove erases the entry once no holder is left (then `e` is invalid).
  void add(Entry* e, BlockHash hash, int instance);
  void remove(Entry* e, BlockHash hash, int instance);
  // f(hash, holders) for every block; f must not change the table.
  template <class F>
  void forEach(F&& f) const {
    ListedInstance scratch[kCompactIds];
    map_.forEach([&](uint64_t key, Entry e) {
      const BlockHash hash{key};
      f(hash, (e & kNotWord) == 0 ? HolderView{e, {}} : decode(e, scratch));
    });
  }

  size_t size() const { return map_.size(); }
  // Blocks whose holders live in the side table.
  size_t farBlocks() const { return far_blocks_; }
  // Distinct far sets in use (blocks sharing their holders share one).
  size_t farSets() const { return far_sets_.size() - free_far_.size(); }

 private:
  static constexpr Entry kNotWord = Entry{1} << 63;
  static constexpr int kCountShift = 60;
  static constexpr Entry kFar = 7;  // the count field of a far entry
  static constexpr int kIdBits = 10;
  static_assert(kMaxInstances <= 1 << kIdBits && kCompactIds * kIdBits <= kCountShift);

  static size_t compactCount(Entry e) { return static_cast<size_t>((e >> kCountShift) & 7); }
  static int compactId(Entry e, size_t k) {
    return static_cast<int>((e >> (k * kIdBits)) & ((1u << kIdBits) - 1));
  }
  static uint32_t farIndex(Entry e) { return static_cast<uint32_t>(e); }
  HolderView decode(Entry e, Scratch scratch) const;
  // The entry for `holders`: word, compact or far (one more block on the shared far set).
  Entry encode(const HolderSet& holders);
  // One block fewer on far set `index`; the set is freed with its last block.
  void releaseFar(uint32_t index);

  struct FarSet {
    HolderSet holders;
    uint64_t digest = 0;
    uint32_t blocks = 0;  // entries pointing here; 0: free
  };
  FlatU64Map<Entry> map_;
  // digest of the holders -> far_sets_ index, for the first set with that digest (another set
  // with the same digest, rare, is simply not shared).
  FlatU64Map<uint32_t> far_by_digest_;
  std::vector<FarSet> far_sets_;
  std::vector<uint32_t> free_far_;
  size_t far_blocks_ = 0;
};

}  // namespace kvf::policy
