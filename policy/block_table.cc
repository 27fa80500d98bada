#include "policy/block_table.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

namespace kvf::policy {
namespace {

constexpr size_t kMinSlots = 1024;
constexpr size_t kHugePage = 2u << 20;

// Zeroed slot memory. Tables of 2 MB and more are 2 MB-aligned and advised for transparent
// huge pages (the machine's THP mode is usually "madvise"): one TLB entry then covers 131,072
// slots instead of 256.
void* allocateSlots(size_t bytes) {
  if (bytes < kHugePage) {
    void* p = std::calloc(1, bytes);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void* p = std::aligned_alloc(kHugePage, bytes);  // bytes is a power of two >= 2 MB
  if (p == nullptr) throw std::bad_alloc();
  madvise(p, bytes, MADV_HUGEPAGE);  // advisory: a kernel without THP just ignores it
  std::memset(p, 0, bytes);
  return p;
}

}  // namespace

BlockTable::BlockTable(uint64_t salt) : salt_(salt | 1) {}

BlockTable::~BlockTable() { std::free(slots_); }

void BlockTable::add(BlockHash hash, InstanceMask bits) {
  if (hash == kEmpty) {
    if (zero_key_mask_ == 0) ++size_;
    zero_key_mask_ |= bits;
    return;
  }
  // At most half full: probe runs stay short, and a miss ends at an empty slot soon.
  if (slots_ == nullptr || (size_ + 1) * 2 > capacity()) grow();
  size_t i = home(hash);
  for (;; i = (i + 1) & mask_) {
    if (slots_[i].hash == hash) {
      slots_[i].holders |= bits;
      return;
    }
    if (slots_[i].hash == kEmpty) break;
  }
  slots_[i] = Slot{hash, bits};
  ++size_;
}

void BlockTable::remove(BlockHash hash, InstanceMask bits) {
  if (hash == kEmpty) {
    if (zero_key_mask_ != 0 && (zero_key_mask_ &= ~bits) == 0) --size_;
    return;
  }
  if (slots_ == nullptr) return;
  for (size_t i = home(hash);; i = (i + 1) & mask_) {
    if (slots_[i].hash == kEmpty) return;
    if (slots_[i].hash != hash) continue;
    slots_[i].holders &= ~bits;
    if (slots_[i].holders == 0) eraseAt(i);
    return;
  }
}

// Backward-shift deletion: later members of the probe run move up into the hole unless their
// home lies cyclically after it, so lookups never need tombstones.
void BlockTable::eraseAt(size_t hole) {
  --size_;
  for (size_t j = (hole + 1) & mask_; slots_[j].hash != kEmpty; j = (j + 1) & mask_) {
    size_t h = home(slots_[j].hash);
    bool stays = hole <= j ? (hole < h && h <= j) : (hole < h || h <= j);
    if (stays) continue;
    slots_[hole] = slots_[j];
    hole = j;
  }
  slots_[hole] = Slot{kEmpty, 0};
}

void BlockTable::grow() {
  size_t slots = slots_ == nullptr ? kMinSlots : capacity() * 2;
  Slot* old = slots_;
  size_t old_capacity = old == nullptr ? 0 : capacity();
  bytes_ = slots * sizeof(Slot);
  slots_ = static_cast<Slot*>(allocateSlots(bytes_));
  mask_ = slots - 1;
  shift_ = 64 - __builtin_ctzll(slots);
  for (size_t k = 0; k < old_capacity; ++k) {
    if (old[k].hash == kEmpty) continue;
    size_t i = home(old[k].hash);
    while (slots_[i].hash != kEmpty) i = (i + 1) & mask_;
    slots_[i] = old[k];
  }
  std::free(old);
}

}  // namespace kvf::policy
