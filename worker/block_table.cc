#include "worker/block_table.h"

#include "common/strings.h"

namespace kvf::worker {

absl::Status BlockTable::pin(BlockHash hash) {
  Entry* e = entries_.find(hash.value());
  if (e == nullptr) {
    return absl::NotFoundError(strCat("block ", hash.value(), " is not cached"));
  }
  ++e->pins;
  return absl::OkStatus();
}

absl::Status BlockTable::unpin(BlockHash hash) {
  Entry* e = entries_.find(hash.value());
  if (e == nullptr || e->pins == 0) {
    return absl::FailedPreconditionError(strCat("block ", hash.value(), " is not pinned"));
  }
  --e->pins;
  return absl::OkStatus();
}

uint32_t BlockTable::pins(BlockHash hash) const {
  const Entry* e = entries_.find(hash.value());
  return e == nullptr ? 0 : e->pins;
}

}  // namespace kvf::worker
