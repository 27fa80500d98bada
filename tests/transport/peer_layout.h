// Shared by the multi-process transport tests and kvf-transport-peer: the deterministic block
// layout (block i of the source lands in slot perm[i] of the target) and the source pattern, so
// both processes agree on what a batch contains without exchanging it. Stateless.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "transport/transport.h"

namespace kvf::transport::testing {

inline std::vector<BlockCopy> layoutBlocks(uint64_t count, uint64_t block, uint64_t seed,
                                           uint64_t remote_base) {
  std::vector<uint64_t> perm(count);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(seed));
  std::vector<BlockCopy> blocks;
  blocks.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    blocks.push_back({i * block, remote_base + perm[i] * block, block});
  }
  return blocks;
}

inline void fillPattern(char* data, uint64_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  uint64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t v = rng();
    std::copy_n(reinterpret_cast<const char*>(&v), 8, data + i);
  }
  for (; i < bytes; ++i) data[i] = static_cast<char>(rng());
}

}  // namespace kvf::transport::testing
