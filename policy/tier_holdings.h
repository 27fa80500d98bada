// The blocks an instance holds in tiers other than its GPU prefix cache ("CPU", "DISK",
// "STORAGE", ... as KV events name them in `medium`), by engine hash with a count of copies.
// Kept and shown, never counted as GPU prefix hits: tier events may carry hashes only (vLLM's
// OffloadingConnector before v0.24, LMCache), matched to GPU blocks by the engine hash (its
// 64-bit form is the same in both). Bounded: a few tier names, a capacity per tier. Pure;
// single-threaded (the router's io thread owns it).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/flat_u64_map.h"

namespace kvf::policy {

class TierHoldings {
 public:
  static constexpr size_t kMaxTiers = 8;

  // Adds one copy of each hash to `medium`. False (nothing past the bound is kept) when the
  // tier would exceed `capacity` distinct blocks (0: unbounded) or a new tier name would exceed
  // kMaxTiers.
  bool store(std::string_view medium, std::span<const uint64_t> engine_hashes, size_t capacity);
  // Drops one copy of each; returns how many hashes it did not hold.
  size_t remove(std::string_view medium, std::span<const uint64_t> engine_hashes);
  void clear() { tiers_.clear(); }

  size_t blocks(std::string_view medium) const;
  bool holds(std::string_view medium, uint64_t engine_hash) const;
  // (medium, distinct blocks) for every tier seen, in first-seen order.
  std::vector<std::pair<std::string, size_t>> summary() const;

 private:
  struct Tier {
    std::string medium;
    FlatU64Map<uint32_t> copies;
  };
  Tier* find(std::string_view medium);
  const Tier* find(std::string_view medium) const;

  std::vector<Tier> tiers_;
};

}  // namespace kvf::policy
