#include "policy/holder_table.h"

#include <bit>

namespace kvf::policy {

namespace {

// A well-mixed 64-bit digest of a holder set (FlatU64Map keys must be uniform).
uint64_t digestOf(const HolderSet& holders) {
  auto mix = [](uint64_t x) {
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ULL;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dULL;
    return x ^ (x >> 33);
  };
  const HolderView v = holders.view();
  uint64_t h = mix(v.word ^ 0x9e3779b97f4a7c15ULL);
  for (ListedInstance id : v.listed) h = mix(h + id + 1);
  return h;
}

}  // namespace

HolderView HolderTable::decode(Entry e, Scratch scratch) const {
  const size_t count = compactCount(e);
  if (count == kFar) return far_sets_[farIndex(e)].holders.view();
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

bool HolderTable::holds(const Entry* e, BlockHash, int instance) const {
  if (e == nullptr) return false;
  if ((*e & kNotWord) == 0) return instance < kWordInstances && (*e & instanceBit(instance)) != 0;
  const size_t count = compactCount(*e);
  if (count == kFar) return far_sets_[farIndex(*e)].holders.contains(instance);
  for (size_t k = 0; k < count; ++k) {
    if (compactId(*e, k) == instance) return true;
  }
  return false;
}

HolderTable::Entry HolderTable::encode(const HolderSet& holders) {
  if (holders.view().listed.empty()) return holders.view().word;
  if (holders.size() <= kCompactIds) {
    Entry e = kNotWord | static_cast<Entry>(holders.size()) << kCountShift;
    size_t k = 0;
    holders.forEach([&](int id) { e |= static_cast<Entry>(id) << (kIdBits * k++); });
    return e;
  }
  const uint64_t digest = digestOf(holders);
  auto [known, inserted] = far_by_digest_.tryEmplace(digest, 0);
  uint32_t index = *known;
  if (inserted || far_sets_[index].holders != holders) {
    if (!free_far_.empty()) {
      index = free_far_.back();
      free_far_.pop_back();
    } else {
      index = static_cast<uint32_t>(far_sets_.size());
      far_sets_.emplace_back();
    }
    far_sets_[index] = FarSet{holders, digest, 0};
    if (inserted) *known = index;  // else the digest's first set stays the shared one
  }
  ++far_sets_[index].blocks;
  ++far_blocks_;
  return kNotWord | kFar << kCountShift | index;
}

void HolderTable::releaseFar(uint32_t index) {
  FarSet& set = far_sets_[index];
  --far_blocks_;
  if (--set.blocks > 0) return;
  if (uint32_t* known = far_by_digest_.find(set.digest); known != nullptr && *known == index) {
    far_by_digest_.eraseValue(known);
  }
  set = FarSet{};
  free_far_.push_back(index);
}

void HolderTable::add(Entry* e, BlockHash hash, int instance) {
  if ((*e & kNotWord) == 0 && instance < kWordInstances) {
    *e |= instanceBit(instance);
    return;
  }
  ListedInstance scratch[kCompactIds];
  HolderSet holders(view(hash, *e, scratch));
  holders.insert(instance);
  const Entry old = *e;
  *e = encode(holders);  // before the release: an unchanged set is not freed and rebuilt
  if (isFar(old)) releaseFar(farIndex(old));
}

void HolderTable::remove(Entry* e, BlockHash hash, int instance) {
  if ((*e & kNotWord) == 0) {
    if (instance < kWordInstances) *e &= ~instanceBit(instance);
  } else {
    ListedInstance scratch[kCompactIds];
    HolderSet holders(view(hash, *e, scratch));
    holders.erase(instance);
    const Entry old = *e;
    *e = holders.empty() ? 0 : encode(holders);
    if (isFar(old)) releaseFar(farIndex(old));
  }
  if (*e == 0) map_.eraseValue(e);
}

}  // namespace kvf::policy
