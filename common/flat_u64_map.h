// FlatU64Map<V>: a map from uniform 64-bit keys (block hashes) to a small trivially copyable
// value, as one open-addressed array of {key, value} slots with linear probing, at most half
// full by default (the owner picks the bound), and backward-shift deletion (no tombstones). The
// slot comes from one multiply by an odd salt, so keys must already be well mixed; the salt keeps
// crafted keys from aiming at one probe run. One probe usually touches one cache line (absl's
// tables touch a control byte and a slot). Pointers to values stay valid until the next insertion.
// Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/prefetch.h"

namespace kvf {

// Zeroed memory for a slot array of `bytes` (a power of two); tables of 2 MB and more are
// 2 MB-aligned and advised for transparent huge pages. Throws std::bad_alloc.
void* allocateZeroedTable(size_t bytes);
void freeTable(void* p);
// An odd per-process salt derived from the address space layout (ASLR).
uint64_t processSalt();

template <class V>
class FlatU64Map {
  static_assert(std::is_trivially_copyable_v<V>);

 public:
  // max_load_eighths: the array doubles once more than this many eighths of its slots would be
  // used (1-6; 4 = half). A lower load buys shorter probe runs (fewer probes past the home
  // slot, erases that shift fewer slots) with memory.
  explicit FlatU64Map(uint64_t salt = processSalt(), int max_load_eighths = 4)
      : salt_(salt | 1),
        max_load_eighths_(max_load_eighths < 1   ? 1
                          : max_load_eighths > 6 ? 6
                                                 : max_load_eighths) {}
  ~FlatU64Map() { freeTable(slots_); }
  FlatU64Map(FlatU64Map&& o) noexcept { *this = std::move(o); }
  FlatU64Map& operator=(FlatU64Map&& o) noexcept {
    if (this != &o) {
      freeTable(slots_);
      salt_ = o.salt_;
      max_load_eighths_ = o.max_load_eighths_;
      slots_ = std::exchange(o.slots_, nullptr);
      mask_ = std::exchange(o.mask_, 0);
      shift_ = std::exchange(o.shift_, 63);
      size_ = std::exchange(o.size_, 0);
      grow_at_ = std::exchange(o.grow_at_, 0);
      has_zero_ = std::exchange(o.has_zero_, false);
      zero_value_ = o.zero_value_;
    }
    return *this;
  }
  FlatU64Map(const FlatU64Map&) = delete;
  FlatU64Map& operator=(const FlatU64Map&) = delete;

  V* find(uint64_t key) {
    if (key == kEmpty) return has_zero_ ? &zero_value_ : nullptr;
    if (slots_ == nullptr) return nullptr;
    for (size_t i = home(key);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.key == key) return &s.value;
      if (s.key == kEmpty) return nullptr;
    }
  }
  const V* find(uint64_t key) const { return const_cast<FlatU64Map*>(this)->find(key); }
  bool contains(uint64_t key) const { return find(key) != nullptr; }
  // Brings the home slot of `key` towards the cache ahead of find().
  void prefetch(uint64_t key) const {
    if (slots_ == nullptr) return;
    prefetchLine(&slots_[home(key)]);
  }

  // prefetch() plus the slot after the home one when it starts another cache line: an erase
  // scans the slots after the hole, and a probe run often continues past its home line.
  void prefetchRun(uint64_t key) const {
    if (slots_ == nullptr) return;
    size_t i = home(key);
    const Slot* p = &slots_[i];
    const Slot* q = &slots_[(i + 1) & mask_];
    prefetchLine(p);
    if ((reinterpret_cast<uintptr_t>(q) >> 6) != (reinterpret_cast<uintptr_t>(p) >> 6)) {
      prefetchLine(q);
    }
  }

  // The value of `key`, inserting `value` first when absent; second = inserted.
  // The rare paths (key 0, growth) are out of line, so the common one inlines into loops.
  std::pair<V*, bool> tryEmplace(uint64_t key, const V& value) {
    if (key == kEmpty) [[unlikely]]
      return emplaceZero(value);
    // At most max_load full: probe runs stay short, and a miss ends at an empty slot soon.
    if (size_ >= grow_at_) [[unlikely]] {
      if (V* v = find(key)) return {v, false};  // no growth for a hit
      grow();
    }
    size_t i = home(key);
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return {&slots_[i].value, false};
      if (slots_[i].key == kEmpty) break;
    }
    slots_[i].key = key;
    slots_[i].value = value;
    ++size_;
    return {&slots_[i].value, true};
  }

  // Removes `key`; false when absent.
  bool erase(uint64_t key) {
    V* v = find(key);
    if (v == nullptr) return false;
    eraseValue(v);
    return true;
  }
  // Removes the entry whose value `v` points to (from find / tryEmplace, still valid).
  void eraseValue(V* v) {
    if (v == &zero_value_) {
      has_zero_ = false;
      --size_;
      return;
    }
    auto offset = reinterpret_cast<char*>(v) - reinterpret_cast<char*>(slots_);
    eraseAt(static_cast<size_t>(offset) / sizeof(Slot));
  }

  // f(key, value) for every entry; f must not insert or erase.
  template <class F>
  void forEach(F&& f) const {
    if (has_zero_) f(uint64_t{0}, zero_value_);
    for (size_t i = 0; slots_ != nullptr && i <= mask_; ++i) {
      if (slots_[i].key != kEmpty) f(slots_[i].key, slots_[i].value);
    }
  }

  // Drops every entry and frees the slot array.
  void clear() {
    freeTable(slots_);
    slots_ = nullptr;
    mask_ = 0;
    shift_ = 63;
    size_ = 0;
    grow_at_ = 0;
    has_zero_ = false;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t capacity() const { return slots_ == nullptr ? 0 : mask_ + 1; }

 private:
  struct Slot {
    uint64_t key;
    V value;
  };
  static constexpr uint64_t kEmpty = 0;  // key 0 itself lives in zero_value_
  static constexpr size_t kMinSlots = 1024;

  size_t home(uint64_t key) const { return static_cast<size_t>((key * salt_) >> shift_); }

  // Backward shift: later members of the probe run move up into the hole unless their home lies
  // cyclically after it, so lookups never need tombstones.
  void eraseAt(size_t hole) {
    --size_;
    for (size_t j = (hole + 1) & mask_; slots_[j].key != kEmpty; j = (j + 1) & mask_) {
      // It stays when its home lies cyclically in (hole, j]: nearer to j than the hole is.
      bool stays = ((j - home(slots_[j].key)) & mask_) < ((j - hole) & mask_);
      if (stays) continue;
      slots_[hole] = slots_[j];
      hole = j;
    }
    slots_[hole].key = kEmpty;
  }

  [[gnu::noinline]] std::pair<V*, bool> emplaceZero(const V& value) {
    if (has_zero_) return {&zero_value_, false};
    has_zero_ = true;
    zero_value_ = value;
    ++size_;
    return {&zero_value_, true};
  }

  [[gnu::noinline]] void grow() {
    size_t slots = slots_ == nullptr ? kMinSlots : capacity() * 2;
    Slot* old = slots_;
    size_t old_capacity = capacity();
    slots_ = static_cast<Slot*>(allocateZeroedTable(slots * sizeof(Slot)));
    mask_ = slots - 1;
    shift_ = 64 - __builtin_ctzll(slots);
    grow_at_ = slots / 8 * static_cast<size_t>(max_load_eighths_);
    for (size_t k = 0; k < old_capacity; ++k) {
      if (old[k].key == kEmpty) continue;
      size_t i = home(old[k].key);
      while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
      slots_[i] = old[k];
    }
    freeTable(old);
  }

  uint64_t salt_;
  int max_load_eighths_ = 4;
  Slot* slots_ = nullptr;
  size_t mask_ = 0;  // capacity - 1
  int shift_ = 63;   // 64 - log2(capacity)
  size_t size_ = 0;
  size_t grow_at_ = 0;  // the size at which the next insertion grows the array
  bool has_zero_ = false;
  V zero_value_{};
};

}  // namespace kvf
