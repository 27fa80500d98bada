#include "worker/tiers/tier_types.h"

namespace kvf::worker {

std::string_view tierMedium(TierId tier) {
  switch (tier) {
    case TierId::kHost:
      return "CPU";
    case TierId::kDisk:
      return "DISK";
  }
  return "UNKNOWN";
}

std::string_view dropReasonName(DropReason reason) {
  switch (reason) {
    case DropReason::kCapacity:
      return "capacity";
    case DropReason::kFrequencyFilter:
      return "frequency_filter";
    case DropReason::kCorrupt:
      return "corrupt";
    case DropReason::kWriteFailed:
      return "write_failed";
    case DropReason::kRemoved:
      return "removed";
    case DropReason::kLostBeforeWrite:
      return "lost_before_write";
  }
  return "unknown";
}

}  // namespace kvf::worker
