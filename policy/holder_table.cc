#include "policy/holder_table.h"

#include <bit>

namespace kvf::policy {

HolderView HolderTable::decode(BlockHash hash, Entry e, Scratch scratch) const {
  const size_t count = compactCount(e);
  if (count == kFar) return far_sets_[*far_index_.find(hash.value)].view();
  HolderView v;
  size_t n = 0;
  for (size_t k = 0; k < count; ++k) {  // ascending: word ids first, then the listed ones
    const int id = compactId(e, k);
    if (id < kWordInstances) {
      v.word |= instanceBit(id);
    } else {
      scratch[n++] = static_cast<ListedInstance>(id);
    }
  }
  v.listed = scratch.first(n);
  return v;
}

bool HolderTable::holds(const Entry* e, BlockHash hash, int instance) const {
  if (e == nullptr) return false;
  if ((*e & kNotWord) == 0) return instance < kWordInstances && (*e & instanceBit(instance)) != 0;
  const size_t count = compactCount(*e);
  if (count == kFar) return far_sets_[*far_index_.find(hash.value)].contains(instance);
  for (size_t k = 0; k < count; ++k) {
    if (compactId(*e, k) == instance) return true;
  }
  return false;
}

HolderTable::Entry HolderTable::encode(BlockHash hash, const HolderSet& holders) {
  if (holders.view().listed.empty()) return holders.view().word;
  if (holders.size() <= kCompactIds) {
    Entry e = kNotWord | static_cast<Entry>(holders.size()) << kCountShift;
    size_t k = 0;
    holders.forEach([&](int id) { e |= static_cast<Entry>(id) << (kIdBits * k++); });
    return e;
  }
  auto [index, inserted] = far_index_.tryEmplace(hash.value, 0);
  if (inserted) {
    if (!free_far_.empty()) {
      *index = free_far_.back();
      free_far_.pop_back();
    } else {
      *index = static_cast<uint32_t>(far_sets_.size());
      far_sets_.emplace_back();
    }
  }
  far_sets_[*index] = holders;
  return kNotWord | kFar << kCountShift;
}

void HolderTable::dropFar(BlockHash hash) {
  uint32_t* index = far_index_.find(hash.value);
  if (index == nullptr) return;
  far_sets_[*index] = HolderSet{};
  free_far_.push_back(*index);
  far_index_.eraseValue(index);
}

void HolderTable::add(Entry* e, BlockHash hash, int instance) {
  if ((*e & kNotWord) == 0 && instance < kWordInstances) {
    *e |= instanceBit(instance);
    return;
  }
  if ((*e & kNotWord) != 0 && compactCount(*e) == kFar) {
    far_sets_[*far_index_.find(hash.value)].insert(instance);
    return;
  }
  ListedInstance scratch[kCompactIds];
  HolderSet holders((*e & kNotWord) == 0 ? HolderView{*e, {}} : decode(hash, *e, scratch));
  holders.insert(instance);
  *e = encode(hash, holders);
}

void HolderTable::remove(Entry* e, BlockHash hash, int instance) {
  if ((*e & kNotWord) == 0) {
    if (instance < kWordInstances) *e &= ~instanceBit(instance);
  } else if (compactCount(*e) == kFar) {
    HolderSet& set = far_sets_[*far_index_.find(hash.value)];
    set.erase(instance);
    if (set.size() <= kCompactIds || set.view().listed.empty()) {  // back into the slot
      HolderSet holders = std::move(set);
      dropFar(hash);
      *e = holders.empty() ? 0 : encode(hash, holders);
    }
  } else {
    ListedInstance scratch[kCompactIds];
    HolderSet holders(decode(hash, *e, scratch));
    holders.erase(instance);
    *e = holders.empty() ? 0 : encode(hash, holders);
  }
  if (*e == 0) map_.eraseValue(e);
}

}  // namespace kvf::policy
