#include "policy/tier_holdings.h"

namespace kvf::policy {

TierHoldings::Tier* TierHoldings::find(std::string_view medium) {
  for (Tier& t : tiers_) {
    if (t.medium == medium) return &t;
  }
  return nullptr;
}

const TierHoldings::Tier* TierHoldings::find(std::string_view medium) const {
  return const_cast<TierHoldings*>(this)->find(medium);
}

bool TierHoldings::store(std::string_view medium, std::span<const uint64_t> engine_hashes,
                         size_t capacity) {
  Tier* tier = find(medium);
  if (tier == nullptr) {
    if (tiers_.size() >= kMaxTiers) return false;
    tier = &tiers_.emplace_back();
    tier->medium = std::string(medium);
  }
  for (uint64_t hash : engine_hashes) {
    auto [copies, inserted] = tier->copies.tryEmplace(hash, 0);
    if (inserted && capacity != 0 && tier->copies.size() > capacity) {
      tier->copies.eraseValue(copies);
      return false;
    }
    ++*copies;
  }
  return true;
}

size_t TierHoldings::remove(std::string_view medium, std::span<const uint64_t> engine_hashes) {
  Tier* tier = find(medium);
  if (tier == nullptr) return engine_hashes.size();
  size_t unknown = 0;
  for (uint64_t hash : engine_hashes) {
    uint32_t* copies = tier->copies.find(hash);
    if (copies == nullptr) {
      ++unknown;
    } else if (--*copies == 0) {
      tier->copies.eraseValue(copies);
    }
  }
  return unknown;
}

size_t TierHoldings::blocks(std::string_view medium) const {
  const Tier* tier = find(medium);
  return tier == nullptr ? 0 : tier->copies.size();
}

bool TierHoldings::holds(std::string_view medium, uint64_t engine_hash) const {
  const Tier* tier = find(medium);
  return tier != nullptr && tier->copies.find(engine_hash) != nullptr;
}

std::vector<std::pair<std::string, size_t>> TierHoldings::summary() const {
  std::vector<std::pair<std::string, size_t>> out;
  for (const Tier& t : tiers_) out.emplace_back(t.medium, t.copies.size());
  return out;
}

}  // namespace kvf::policy
