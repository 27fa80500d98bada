#include "worker/block_payload.h"

#include <cstring>

namespace kvf::worker {
namespace {

// splitmix64: a fast, well-mixed stream from one 64-bit seed.
uint64_t nextWord(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

void fillBlockPayload(BlockHash hash, std::span<std::byte> out) {
  uint64_t state = hash.value();
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    uint64_t w = nextWord(&state);
    std::memcpy(out.data() + i, &w, 8);
  }
  if (i < out.size()) {
    uint64_t w = nextWord(&state);
    std::memcpy(out.data() + i, &w, out.size() - i);
  }
}

bool verifyBlockPayload(BlockHash hash, std::span<const std::byte> bytes) {
  uint64_t state = hash.value();
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t w = nextWord(&state);
    if (std::memcmp(bytes.data() + i, &w, 8) != 0) return false;
  }
  if (i < bytes.size()) {
    uint64_t w = nextWord(&state);
    if (std::memcmp(bytes.data() + i, &w, bytes.size() - i) != 0) return false;
  }
  return true;
}

}  // namespace kvf::worker
