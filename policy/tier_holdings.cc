#include "policy/tier_holdings.h"

#include "common/strings.h"

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

void TierHoldings::clear() {
  tiers_.clear();
  cpu_ = nullptr;
  disk_ = nullptr;
  credited_ours_ = 0;
  unresolved_ = 0;
}

bool TierHoldings::store(std::string_view medium, std::span<const uint64_t> engine_hashes,
                         std::span<const BlockHash> ours, size_t capacity) {
  Tier* tier = find(medium);
  if (tier == nullptr) {
    if (tiers_.size() >= kMaxTiers) return false;
    tiers_.reserve(kMaxTiers);  // cpu_ and disk_ point into it
    tier = &tiers_.emplace_back();
    tier->medium = std::string(medium);
    // vLLM's specs name their medium in upper case ("CPU"); other connectors vary the case
    // ("Disk"), so the two credited tiers are matched without it.
    tier->kind = equalsIgnoreCase(medium, "CPU")    ? Kind::kCpu
                 : equalsIgnoreCase(medium, "DISK") ? Kind::kDisk
                                                    : Kind::kOther;
    if (tier->kind == Kind::kCpu) cpu_ = tier;
    if (tier->kind == Kind::kDisk) disk_ = tier;
  }
  for (size_t i = 0; i < engine_hashes.size(); ++i) {
    uint64_t our = i < ours.size() ? ours[i].value : 0;
    auto [held, inserted] = tier->blocks.tryEmplace(engine_hashes[i], Held{our, 0});
    if (inserted) {
      if (capacity != 0 && tier->blocks.size() > capacity) {
        tier->blocks.eraseValue(held);
        return false;
      }
      if (our == 0) ++unresolved_;
    } else if (held->ours != 0 || our == 0) {
      our = 0;  // known already (the first mapping stays), or still unknown
    } else {
      held->ours = our;  // a later event resolved it
    }
    if (our != 0 && ++tier->ours.tryEmplace(our, 0).first[0] == 1 && tier->kind != Kind::kOther) {
      ++credited_ours_;
    }
    ++held->copies;
  }
  return true;
}

void TierHoldings::dropOurs(Tier& tier, uint64_t ours) {
  uint32_t* refs = ours == 0 ? nullptr : tier.ours.find(ours);
  if (refs == nullptr || --*refs != 0) return;
  tier.ours.eraseValue(refs);
  if (tier.kind != Kind::kOther) --credited_ours_;
}

size_t TierHoldings::remove(std::string_view medium, std::span<const uint64_t> engine_hashes) {
  Tier* tier = find(medium);
  if (tier == nullptr) return engine_hashes.size();
  size_t unknown = 0;
  for (uint64_t hash : engine_hashes) {
    Held* held = tier->blocks.find(hash);
    if (held == nullptr) {
      ++unknown;
    } else if (--held->copies == 0) {
      dropOurs(*tier, held->ours);
      tier->blocks.eraseValue(held);
    }
  }
  return unknown;
}

size_t TierHoldings::blocks(std::string_view medium) const {
  const Tier* tier = find(medium);
  return tier == nullptr ? 0 : tier->blocks.size();
}

bool TierHoldings::holds(std::string_view medium, uint64_t engine_hash) const {
  const Tier* tier = find(medium);
  return tier != nullptr && tier->blocks.find(engine_hash) != nullptr;
}

std::optional<BlockHash> TierHoldings::ourHash(uint64_t engine_hash) const {
  for (const Tier& t : tiers_) {
    const Held* held = t.blocks.find(engine_hash);
    if (held != nullptr && held->ours != 0) return BlockHash{held->ours};
  }
  return std::nullopt;
}

LowerTierRun TierHoldings::run(std::span<const BlockHash> chain, size_t from) const {
  LowerTierRun out;
  if (credited_ours_ == 0) return out;
  for (size_t i = from; i < chain.size(); ++i) {
    const uint64_t h = chain[i].value;
    if (cpu_ != nullptr && cpu_->ours.contains(h)) {
      ++out.cpu_blocks;
    } else if (disk_ != nullptr && disk_->ours.contains(h)) {
      ++out.disk_blocks;
    } else {
      break;
    }
  }
  return out;
}

std::vector<std::pair<std::string, size_t>> TierHoldings::summary() const {
  std::vector<std::pair<std::string, size_t>> out;
  for (const Tier& t : tiers_) out.emplace_back(t.medium, t.blocks.size());
  return out;
}

}  // namespace kvf::policy
