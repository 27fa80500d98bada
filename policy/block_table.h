// The cache index's block table: BlockHash -> InstanceMask of holders, as one open-addressed
// array of 16-byte {hash, mask} slots with linear probing, so a lookup touches one cache line
// (a second only when its probe run crosses a line). Block hashes are already uniform, so the
// slot comes from one salted multiply; big tables ask for transparent huge pages (a probe into
// a 32 MB table otherwise misses the TLB as well as the cache). Single-threaded, owned by
// CacheIndex.
#pragma once

#include <cstddef>
#include <cstdint>

#include "policy/block_hash.h"

namespace kvf::policy {

using InstanceMask = uint64_t;

class BlockTable {
 public:
  // `salt` must be odd: it keys the slot choice, so crafted prompts cannot aim at one probe run.
  explicit BlockTable(uint64_t salt);
  ~BlockTable();
  BlockTable(const BlockTable&) = delete;
  BlockTable& operator=(const BlockTable&) = delete;

  // Holders of `hash`; 0 when absent (a present block always has a non-zero mask).
  InstanceMask get(BlockHash hash) const {
    if (hash == kEmpty) return zero_key_mask_;
    if (slots_ == nullptr) return 0;
    for (size_t i = home(hash);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.hash == hash) return s.holders;
      if (s.hash == kEmpty) return 0;
    }
  }
  // Brings the home slot of `hash` towards the cache ahead of get().
  void prefetch(BlockHash hash) const {
    if (slots_ != nullptr) __builtin_prefetch(&slots_[home(hash)]);
  }
  // holders |= bits (inserting the block); `bits` must be non-zero.
  void add(BlockHash hash, InstanceMask bits);
  // holders &= ~bits; the block goes once no holder is left.
  void remove(BlockHash hash, InstanceMask bits);

  size_t size() const { return size_; }
  size_t capacity() const { return mask_ + 1; }

 private:
  struct Slot {
    BlockHash hash;
    InstanceMask holders;
  };
  static constexpr BlockHash kEmpty = 0;  // hash 0 itself lives in zero_key_mask_

  size_t home(BlockHash hash) const { return static_cast<size_t>((hash * salt_) >> shift_); }
  void grow();
  void eraseAt(size_t i);

  uint64_t salt_;
  Slot* slots_ = nullptr;
  size_t bytes_ = 0;
  size_t mask_ = 0;  // capacity - 1 (0 before the first insert)
  int shift_ = 63;   // 64 - log2(capacity)
  size_t size_ = 0;
  InstanceMask zero_key_mask_ = 0;
};

}  // namespace kvf::policy
