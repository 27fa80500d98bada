#include "worker/block_table.h"

#include <cassert>

#include "common/strings.h"

namespace kvf::worker {

bool BlockTable::insert(BlockHash hash, BlockIndex block) {
  return entries_.try_emplace(hash, Entry{block, 0}).second;
}

void BlockTable::erase(BlockHash hash) {
  auto it = entries_.find(hash);
  if (it == entries_.end()) return;
  assert(it->second.pins == 0 && "evicting a pinned block");
  entries_.erase(it);
}

std::optional<BlockIndex> BlockTable::find(BlockHash hash) const {
  auto it = entries_.find(hash);
  if (it == entries_.end()) return std::nullopt;
  return it->second.block;
}

absl::Status BlockTable::pin(BlockHash hash) {
  auto it = entries_.find(hash);
  if (it == entries_.end()) {
    return absl::NotFoundError(strCat("block ", hash, " is not cached"));
  }
  ++it->second.pins;
  return absl::OkStatus();
}

absl::Status BlockTable::unpin(BlockHash hash) {
  auto it = entries_.find(hash);
  if (it == entries_.end() || it->second.pins == 0) {
    return absl::FailedPreconditionError(strCat("block ", hash, " is not pinned"));
  }
  --it->second.pins;
  return absl::OkStatus();
}

uint32_t BlockTable::pins(BlockHash hash) const {
  auto it = entries_.find(hash);
  return it == entries_.end() ? 0 : it->second.pins;
}

}  // namespace kvf::worker
