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
constexpr uint64_t kChainParentKey = 0x27d4eb2f165667c5ULL;
constexpr uint64_t kChainContentKey = 0x85ebca77c2b2ae63ULL;

// The chain step: XXH3's 16-byte mixer over (parent, content hash). Its latency (~6 cycles) is
// the only serial part, so the content hashes of consecutive blocks overlap in the CPU.
inline BlockHash chain(BlockHash parent, uint64_t content) {
  return XXH3_mul128_fold64(parent ^ kChainParentKey, content ^ kChainContentKey);
}

inline uint64_t contentHash(const TokenId* tokens, size_t bytes) {
  return XXH3_64bits_withSeed(tokens, bytes, kTokenSeed);
}

}  // namespace

BlockHash hashBlock(BlockHash parent, std::span<const TokenId> tokens) {
  return chain(parent, contentHash(tokens.data(), tokens.size_bytes()));
}

void hashTokenBlocks(std::span<const TokenId> tokens, size_t block_size,
                     std::vector<BlockHash>* out, BlockHash parent) {
  if (block_size == 0) return;
  size_t blocks = tokens.size() / block_size;
  size_t first = out->size();
  out->resize(first + blocks);
  BlockHash* dst = out->data() + first;
  const TokenId* src = tokens.data();
  if (block_size == kDefaultBlockSize) {
    // A constant length lets the compiler drop xxh3's length dispatch.
    constexpr size_t kBytes = kDefaultBlockSize * sizeof(TokenId);
    for (size_t i = 0; i < blocks; ++i, src += kDefaultBlockSize) {
      parent = chain(parent, contentHash(src, kBytes));
      dst[i] = parent;
    }
    return;
  }
  size_t bytes = block_size * sizeof(TokenId);
  for (size_t i = 0; i < blocks; ++i, src += block_size) {
    parent = chain(parent, contentHash(src, bytes));
    dst[i] = parent;
  }
}

std::vector<BlockHash> hashTokenBlocks(std::span<const TokenId> tokens, size_t block_size) {
  std::vector<BlockHash> out;
  hashTokenBlocks(tokens, block_size, &out);
  return out;
}

void completeBlockHashes(std::span<const TokenId> tokens, size_t block_size,
                         std::vector<BlockHash>* hashes) {
  if (block_size == 0) return;
  size_t done = hashes->size();
  if (done >= tokens.size() / block_size) return;
  BlockHash parent = done == 0 ? kRootBlockHash : hashes->back();
  hashTokenBlocks(tokens.subspan(done * block_size), block_size, hashes, parent);
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
