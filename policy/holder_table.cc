#include "policy/holder_table.h"

#include <algorithm>

namespace kvf::policy {

std::span<const ListedInstance> HolderTable::listedOf(BlockHash hash) const {
  const Listed* l = listed_.find(hash.value);
  if (l == nullptr) return {};
  if (l->count <= kInline) return {l->ids, l->count};
  return overflow_[overflowIndex(*l)];
}

void HolderTable::add(Entry* e, BlockHash hash, int instance) {
  if (instance < kWordInstances) {
    *e |= instanceBit(instance);
    return;
  }
  *e |= kListedFlag;
  addListed(hash, static_cast<ListedInstance>(instance));
}

void HolderTable::remove(Entry* e, BlockHash hash, int instance) {
  if (instance < kWordInstances) {
    *e &= ~instanceBit(instance);
  } else if ((*e & kListedFlag) != 0 &&
             !removeListed(hash, static_cast<ListedInstance>(instance))) {
    *e &= ~kListedFlag;
  }
  if (*e == 0) map_.eraseValue(e);
}

void HolderTable::addListed(BlockHash hash, ListedInstance id) {
  Listed* l = listed_.tryEmplace(hash.value, Listed{}).first;
  if (l->count < kInline) {
    ListedInstance* end = l->ids + l->count;
    ListedInstance* at = std::lower_bound(l->ids, end, id);
    if (at != end && *at == id) return;
    std::copy_backward(at, end, end + 1);
    *at = id;
    ++l->count;
    return;
  }
  if (l->count == kInline) {
    if (std::binary_search(l->ids, l->ids + kInline, id)) return;
    uint32_t index;
    if (!free_overflow_.empty()) {
      index = free_overflow_.back();
      free_overflow_.pop_back();
    } else {
      index = static_cast<uint32_t>(overflow_.size());
      overflow_.emplace_back();
    }
    overflow_[index].assign(l->ids, l->ids + kInline);
    l->ids[0] = static_cast<ListedInstance>(index & 0xffff);
    l->ids[1] = static_cast<ListedInstance>(index >> 16);
  }
  std::vector<ListedInstance>& ids = overflow_[overflowIndex(*l)];
  auto at = std::lower_bound(ids.begin(), ids.end(), id);
  if (at != ids.end() && *at == id) return;
  ids.insert(at, id);
  l->count = static_cast<uint16_t>(ids.size());
}

bool HolderTable::removeListed(BlockHash hash, ListedInstance id) {
  Listed* l = listed_.find(hash.value);
  if (l == nullptr) return false;
  if (l->count <= kInline) {
    ListedInstance* end = l->ids + l->count;
    ListedInstance* at = std::lower_bound(l->ids, end, id);
    if (at != end && *at == id) {
      std::copy(at + 1, end, at);
      --l->count;
    }
  } else {
    const uint32_t index = overflowIndex(*l);
    std::vector<ListedInstance>& ids = overflow_[index];
    auto at = std::lower_bound(ids.begin(), ids.end(), id);
    if (at != ids.end() && *at == id) ids.erase(at);
    l->count = static_cast<uint16_t>(ids.size());
    if (ids.size() == kInline) {  // back into the slot
      std::copy(ids.begin(), ids.end(), l->ids);
      ids = {};
      free_overflow_.push_back(index);
    }
  }
  if (l->count > 0) return true;
  listed_.eraseValue(l);
  return false;
}

}  // namespace kvf::policy
