#include "engine/block_hasher.h"

#include <algorithm>
#include <array>

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

namespace kvf::engine {
namespace {

// Feeds token ids to `state` as 64-bit integers: the engine has always hashed them at that width,
// so block hashes (and the payload bytes derived from them) and generated tokens stay the same
// across releases now that token ids are 32-bit values in memory.
void updateTokens(XXH3_state_t* state, std::span<const worker::TokenId> tokens) {
  std::array<int64_t, 64> wide;
  for (size_t at = 0; at < tokens.size(); at += wide.size()) {
    size_t n = std::min(wide.size(), tokens.size() - at);
    std::copy_n(tokens.begin() + static_cast<std::ptrdiff_t>(at), n, wide.begin());
    XXH3_64bits_update(state, wide.data(), n * sizeof(int64_t));
  }
}

}  // namespace

worker::BlockHash hashBlock(uint64_t seed, worker::BlockHash parent,
                            std::span<const worker::TokenId> tokens) {
  XXH3_state_t state;
  // A state on the stack must be initialised before a seeded reset: the reset compares the
  // seed with the state's own and reuses its derived secret when they match, so stack garbage
  // that happens to hold this seed would hash with garbage (xxhash.h, XXH3_INITSTATE).
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset_withSeed(&state, seed);
  const uint64_t parent_value = parent.value();
  XXH3_64bits_update(&state, &parent_value, sizeof(parent_value));
  updateTokens(&state, tokens);
  return worker::BlockHash(XXH3_64bits_digest(&state));
}

worker::BlockHash hashBlockKey(uint64_t seed, worker::BlockHash parent, uint64_t key) {
  const uint64_t words[2] = {parent.value(), key};
  return worker::BlockHash(XXH3_64bits_withSeed(words, sizeof(words), seed));
}

uint64_t generatedBlockKey(uint64_t content_seed, int64_t index) {
  const uint64_t words[2] = {content_seed, static_cast<uint64_t>(index)};
  return XXH3_64bits_withSeed(words, sizeof(words), 0x6b76662d67656eULL);
}

uint64_t outputSeed(std::span<const worker::TokenId> prompt) {
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset_withSeed(&state, 0x6b76662d6f7574ULL);
  updateTokens(&state, prompt);
  return XXH3_64bits_digest(&state);
}

worker::TokenId generatedToken(uint64_t seed, int64_t index, int64_t vocab_size) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(index + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<worker::TokenId>(z % static_cast<uint64_t>(vocab_size));
}

}  // namespace kvf::engine
