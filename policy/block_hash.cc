#include "policy/block_hash.h"

#include <bit>
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

// 64x64 -> 128-bit multiply folded to 64 bits (XXH3's mixer), kept in registers: the library's
// version goes through a struct that GCC spills to the stack on the chain's critical path.
__extension__ typedef unsigned __int128 U128;  // GCC/Clang builtin; __extension__ for -pedantic
inline uint64_t mulFold(uint64_t a, uint64_t b) {
  U128 p = static_cast<U128>(a) * b;
  return static_cast<uint64_t>(p) ^ static_cast<uint64_t>(p >> 64);
}

// The chain step: XXH3's 16-byte mixer over (parent, content hash). Its latency (~6 cycles) is
// the only serial part, so the content hashes of consecutive blocks overlap in the CPU.
inline BlockHash chain(BlockHash parent, uint64_t content) {
  return mulFold(parent ^ kChainParentKey, content ^ kChainContentKey);
}

inline uint64_t contentHash(const TokenId* tokens, size_t bytes) {
  return XXH3_64bits_withSeed(tokens, bytes, kTokenSeed);
}

inline uint64_t read64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// XXH3_64bits_withSeed(block, 64, kTokenSeed) for one 16-token block, bit for bit (its 17-128
// byte path: four 16-byte mixes and an avalanche), with the seeded secret worked out once.
// block_hash_test checks it against the library on random blocks.
static_assert(std::endian::native == std::endian::little, "token ids are hashed as LE bytes");
struct BlockKeys {
  uint64_t k[8];  // secret[16j] + seed, secret[16j + 8] - seed for j = 0..3
};
const BlockKeys kBlockKeys = [] {
  BlockKeys keys;
  const char* secret = reinterpret_cast<const char*>(XXH3_kSecret);
  for (int j = 0; j < 4; ++j) {
    keys.k[2 * j] = read64(secret + 16 * j) + kTokenSeed;
    keys.k[2 * j + 1] = read64(secret + 16 * j + 8) - kTokenSeed;
  }
  return keys;
}();

inline uint64_t contentHash64(const TokenId* tokens) {
  constexpr size_t kBytes = kDefaultBlockSize * sizeof(TokenId);
  static_assert(kBytes == 64);
  const char* in = reinterpret_cast<const char*>(tokens);
  const uint64_t* k = kBlockKeys.k;
  uint64_t acc = kBytes * XXH_PRIME64_1;
  acc += mulFold(read64(in + 16) ^ k[4], read64(in + 24) ^ k[5]);
  acc += mulFold(read64(in + 32) ^ k[6], read64(in + 40) ^ k[7]);
  acc += mulFold(read64(in) ^ k[0], read64(in + 8) ^ k[1]);
  acc += mulFold(read64(in + 48) ^ k[2], read64(in + 56) ^ k[3]);
  acc ^= acc >> 37;  // XXH3_avalanche
  acc *= 0x165667919E3779F9ULL;
  return acc ^ (acc >> 32);
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
    for (size_t i = 0; i < blocks; ++i, src += kDefaultBlockSize) {
      parent = chain(parent, contentHash64(src));
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
