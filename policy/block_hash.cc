#include "policy/block_hash.h"

#include <cstring>

// Inlined so the per-block call on the routing hot path has no PLT hop.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvf::policy {
namespace {

constexpr uint64_t kTokenSeed = 0x9e3779b97f4a7c15ULL;
constexpr uint64_t kTextSeed = 0xc2b2ae3d27d4eb4fULL;
constexpr uint64_t kEngineSeed = 0x165667b19e3779f9ULL;
constexpr BlockHash kTextRoot = 0x6b7666746578742dULL;

}  // namespace

BlockHash hashBlock(BlockHash parent, std::span<const TokenId> tokens) {
  // The parent goes through the seed so the token bytes are hashed in place without a copy;
  // mixing it with our constant keeps the chain independent of any engine's scheme.
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), parent ^ kTokenSeed);
}

void hashTokenBlocks(std::span<const TokenId> tokens, size_t block_size,
                     std::vector<BlockHash>* out, BlockHash parent) {
  if (block_size == 0) return;
  size_t blocks = tokens.size() / block_size;
  out->reserve(out->size() + blocks);
  for (size_t i = 0; i < blocks; ++i) {
    parent = hashBlock(parent, tokens.subspan(i * block_size, block_size));
    out->push_back(parent);
  }
}

std::vector<BlockHash> hashTokenBlocks(std::span<const TokenId> tokens, size_t block_size) {
  std::vector<BlockHash> out;
  hashTokenBlocks(tokens, block_size, &out);
  return out;
}

std::vector<BlockHash> hashTextBlocks(std::string_view text, size_t bytes_per_block) {
  std::vector<BlockHash> out;
  if (bytes_per_block == 0) return out;
  BlockHash parent = kTextRoot;
  for (size_t off = 0; off + bytes_per_block <= text.size(); off += bytes_per_block) {
    parent = XXH3_64bits_withSeed(text.data() + off, bytes_per_block, parent ^ kTextSeed);
    out.push_back(parent);
  }
  return out;
}

uint64_t engineHashFromBytes(std::string_view bytes) {
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), kEngineSeed);
}

}  // namespace kvf::policy
