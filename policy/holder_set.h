// Sets of instances (cache-index holders of a block, a request's excluded instances) for clusters
// of up to kMaxInstances instances. Instances below kWordInstances are bits of one 64-bit word,
// the fast path every cluster of up to 63 instances stays on; the others are listed as sorted
// 16-bit ids. HolderView reads a set owned elsewhere (the holder table, a soft-tree node);
// HolderSet owns one. Value types, no thread affinity.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <span>
#include <vector>

#include "policy/block_hash.h"

namespace kvf::policy {

// Instance slots run 0 .. kMaxInstances - 1.
inline constexpr int kMaxInstances = 1024;
// Slots below this are bits of the word (the word's top bit is the holder table's flag).
inline constexpr int kWordInstances = 63;
using ListedInstance = uint16_t;
static_assert(kMaxInstances - 1 <= 0xffff);

inline InstanceMask instanceBit(int instance) { return InstanceMask{1} << instance; }

// A holder set owned elsewhere: valid until its owner next changes.
struct HolderView {
  InstanceMask word = 0;                   // bit i: instance i < kWordInstances
  std::span<const ListedInstance> listed;  // instances >= kWordInstances, ascending

  bool empty() const { return word == 0 && listed.empty(); }
  bool contains(int instance) const {
    if (instance < kWordInstances) return instance >= 0 && (word & instanceBit(instance)) != 0;
    return std::binary_search(listed.begin(), listed.end(), static_cast<ListedInstance>(instance));
  }
};

class HolderSet {
 public:
  HolderSet() = default;
  HolderSet(std::initializer_list<int> instances) {
    for (int i : instances) insert(i);
  }
  explicit HolderSet(HolderView v) : word_(v.word), listed_(v.listed.begin(), v.listed.end()) {}

  // Out-of-range instances (< 0, >= kMaxInstances) are ignored.
  void insert(int instance) {
    if (instance < 0 || instance >= kMaxInstances) return;
    if (instance < kWordInstances) {
      word_ |= instanceBit(instance);
      return;
    }
    const auto id = static_cast<ListedInstance>(instance);
    auto it = std::lower_bound(listed_.begin(), listed_.end(), id);
    if (it == listed_.end() || *it != id) listed_.insert(it, id);
  }
  void erase(int instance) {
    if (instance < 0 || instance >= kMaxInstances) return;
    if (instance < kWordInstances) {
      word_ &= ~instanceBit(instance);
      return;
    }
    const auto id = static_cast<ListedInstance>(instance);
    auto it = std::lower_bound(listed_.begin(), listed_.end(), id);
    if (it != listed_.end() && *it == id) listed_.erase(it);
  }
  HolderSet& operator|=(HolderView v) {
    word_ |= v.word;
    for (ListedInstance id : v.listed) insert(id);
    return *this;
  }
  bool contains(int instance) const { return view().contains(instance); }
  bool empty() const { return word_ == 0 && listed_.empty(); }
  size_t size() const { return static_cast<size_t>(std::popcount(word_)) + listed_.size(); }
  HolderView view() const { return HolderView{word_, listed_}; }
  // f(instance) for each member, ascending.
  template <class F>
  void forEach(F&& f) const {
    for (InstanceMask m = word_; m != 0; m &= m - 1) f(std::countr_zero(m));
    for (ListedInstance id : listed_) f(static_cast<int>(id));
  }
  friend bool operator==(const HolderSet& a, const HolderSet& b) {
    return a.word_ == b.word_ && a.listed_ == b.listed_;
  }
  friend std::ostream& operator<<(std::ostream& os, const HolderSet& s) {
    os << '{';
    const char* sep = "";
    s.forEach([&](int i) {
      os << sep << i;
      sep = ",";
    });
    return os << '}';
  }

 private:
  InstanceMask word_ = 0;
  std::vector<ListedInstance> listed_;
};

}  // namespace kvf::policy
