// The cache index's holder table: for each BlockHash, the instances that hold the block exactly
// (from their KV events), as one open-addressed array of 16-byte slots with linear probing
// (common/flat_u64_map.h), so a lookup touches one cache line (a second only when its probe run
// crosses one), kept at most a quarter full by default (CacheIndexConfig::table_max_load).
// Block hashes are already uniform, so the slot comes from one salted multiply; big tables ask
// for transparent huge pages. A slot's value is the holder word (instances below
// kWordInstances, policy/holder_set.h); its top bit says the block also has holders at or past
// kWordInstances, listed in a second table of the same kind (up to three ids in the slot, more
// in a side vector). A cluster of up to 63 instances never sets the bit and never looks there.
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
  // The holder word; kListedFlag set when listed holders exist. A present block has a holder.
  using Entry = InstanceMask;
  static constexpr InstanceMask kListedFlag = InstanceMask{1} << kWordInstances;

  // `salt` must be odd: it keys the slot choice, so crafted prompts cannot aim at one probe run.
  // The array doubles once more than max_load_eighths / 8 of its slots would be used.
  HolderTable(uint64_t salt, int max_load_eighths)
      : map_(salt, max_load_eighths), listed_(salt * 3, 4) {}

  // Holders of `hash`; empty when absent. Valid until the table next changes.
  HolderView get(BlockHash hash) const {
    const Entry* e = map_.find(hash.value);
    if (e == nullptr) return {};
    if ((*e & kListedFlag) == 0) [[likely]]
      return HolderView{*e, {}};
    return HolderView{*e & ~kListedFlag, listedOf(hash)};
  }
  // Brings the home slot of `hash` towards the cache ahead of get() / find() / insert() (and
  // its listed slot, once any block has listed holders).
  void prefetch(BlockHash hash) const {
    map_.prefetch(hash.value);
    if (!listed_.empty()) [[unlikely]]
      listed_.prefetch(hash.value);
  }
  // The same plus the next slot's line when the home slot ends one (erase scans past it).
  void prefetchRun(BlockHash hash) const { map_.prefetchRun(hash.value); }

  // Entry-level access, one probe for several updates. Pointers stay valid until the next
  // insert(). find: null when absent. insert: finds or inserts an empty entry, which the caller
  // must then give a holder with add().
  Entry* find(BlockHash hash) { return map_.find(hash.value); }
  const Entry* find(BlockHash hash) const { return map_.find(hash.value); }
  Entry* insert(BlockHash hash) { return map_.tryEmplace(hash.value, Entry{}).first; }
  // Whether `instance` holds `hash`, whose entry is `e` (null: absent).
  bool holds(const Entry* e, BlockHash hash, int instance) const {
    if (e == nullptr) return false;
    if (instance < kWordInstances) return (*e & instanceBit(instance)) != 0;
    return (*e & kListedFlag) != 0 && HolderView{0, listedOf(hash)}.contains(instance);
  }
  // Adds / removes `instance` as a holder of `hash` (entry `e`); remove erases the entry once
  // no holder is left (then `e` is invalid).
  void add(Entry* e, BlockHash hash, int instance);
  void remove(Entry* e, BlockHash hash, int instance);
  // f(hash, holders) for every block; f must not change the table.
  template <class F>
  void forEach(F&& f) const {
    map_.forEach([&](uint64_t key, Entry e) {
      const BlockHash hash{key};
      f(hash, (e & kListedFlag) == 0 ? HolderView{e, {}}
                                     : HolderView{e & ~kListedFlag, listedOf(hash)});
    });
  }

  size_t size() const { return map_.size(); }
  // Blocks with a holder at or past kWordInstances.
  size_t listedBlocks() const { return listed_.size(); }

 private:
  // A block's listed holders, ascending: up to kInline in the slot itself, more in overflow_.
  static constexpr uint16_t kInline = 3;
  struct Listed {
    uint16_t count;
    ListedInstance ids[kInline];  // count > kInline: ids[0] | ids[1] << 16 indexes overflow_
  };
  static uint32_t overflowIndex(const Listed& l) {
    return static_cast<uint32_t>(l.ids[0]) | static_cast<uint32_t>(l.ids[1]) << 16;
  }
  std::span<const ListedInstance> listedOf(BlockHash hash) const;
  void addListed(BlockHash hash, ListedInstance id);
  // False once the block has no listed holder left.
  bool removeListed(BlockHash hash, ListedInstance id);

  FlatU64Map<Entry> map_;
  FlatU64Map<Listed> listed_;
  std::vector<std::vector<ListedInstance>> overflow_;
  std::vector<uint32_t> free_overflow_;
};

}  // namespace kvf::policy
