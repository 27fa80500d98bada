#include "policy/block_hash.h"

#include <algorithm>
#include <array>
#include <cstring>

// Inlined so the per-block call on the routing hot path has no PLT hop.
#define XXH_INLINE_ALL
#include <xxhash.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define KVF_POLICY_AESNI 1
#else
#define KVF_POLICY_AESNI 0
#endif

namespace kvf::policy {
namespace {

constexpr uint64_t kTokenSeed = 0x9e3779b97f4a7c15ULL;
constexpr uint64_t kTextSeed = 0xc2b2ae3d27d4eb4fULL;
constexpr uint64_t kEngineSeed = 0x165667b19e3779f9ULL;
constexpr BlockHash kTextRoot{0x6b7666746578742dULL};
constexpr uint64_t kBlockKeySeed = 0x6b76662d6b657973ULL;
constexpr uint64_t kChainParentKey = 0x27d4eb2f165667c5ULL;
constexpr uint64_t kChainContentKey = 0x85ebca77c2b2ae63ULL;

// The chain step: XXH3's 16-byte mixer over (parent, content hash). Its latency (~5 cycles) is
// the only serial part, so the content hashes of consecutive blocks overlap in the CPU.
inline BlockHash chain(BlockHash parent, uint64_t content) {
  return BlockHash{XXH3_mul128_fold64(parent.value ^ kChainParentKey, content ^ kChainContentKey)};
}

// ---- Content hash of a 16-token block (docs/policies.md, "Block hashes") ----
// The 64 bytes are four 128-bit lanes c0..c3 (tokens 4j..4j+3, little-endian). With R = one
// AES encryption round without its key addition (SubBytes, ShiftRows, MixColumns):
//   x = c0 ^ K0;  x = R(x) ^ c1;  x = R(x) ^ c2;  x = R(x) ^ c3;
//   x = R(x) ^ K1;  x = R(x) ^ K2;  x = R(x) ^ K3;  content = lo64(x) ^ hi64(x)
// Each step is a permutation of x for fixed input, so blocks differing in one lane never meet
// before the fold, and three rounds after the last lane diffuse every byte over the state.
// K0..K3: hexadecimal digits of pi, as little-endian 64-bit halves {lo, hi}.
constexpr uint64_t kAesKeys[4][2] = {{0x13198a2e03707344ULL, 0x243f6a8885a308d3ULL},
                                     {0x082efa98ec4e6c89ULL, 0xa4093822299f31d0ULL},
                                     {0xbe5466cf34e90c6cULL, 0x452821e638d01377ULL},
                                     {0x3f84d5b5b5470917ULL, 0xc0ac29b7c97c50ddULL}};

// Portable path (any CPU, and the reference the AES-NI path is tested against). The state is
// four 32-bit columns, byte r of a column being row r (column c of lane j is token 4j + c), as
// AES-NI lays out an xmm register on a little-endian machine.
using AesState = std::array<uint32_t, 4>;

constexpr uint8_t gfMul2(uint8_t a) {
  return static_cast<uint8_t>((a << 1) ^ ((a & 0x80) != 0 ? 0x1b : 0));
}

constexpr std::array<uint8_t, 256> makeSbox() {
  // S(a) = affine(a^-1) in GF(2^8) mod x^8+x^4+x^3+x+1, built rather than typed in.
  std::array<uint8_t, 256> sbox{};
  for (int a = 0; a < 256; ++a) {
    uint8_t inv = 0;
    for (int b = 1; b < 256 && a != 0; ++b) {
      uint8_t prod = 0;
      uint8_t x = static_cast<uint8_t>(a);
      for (int y = b; y != 0; y >>= 1, x = gfMul2(x)) {
        if (y & 1) prod ^= x;
      }
      if (prod == 1) {
        inv = static_cast<uint8_t>(b);
        break;
      }
    }
    auto rotl8 = [](uint8_t v, int s) { return static_cast<uint8_t>((v << s) | (v >> (8 - s))); };
    sbox[a] = static_cast<uint8_t>(inv ^ rotl8(inv, 1) ^ rotl8(inv, 2) ^ rotl8(inv, 3) ^
                                   rotl8(inv, 4) ^ 0x63);
  }
  return sbox;
}

// T[a] = the MixColumns column of S(a) entering row 0: bytes (2S, S, S, 3S); a byte entering
// row k contributes T[a] rotated left by 8k bits.
constexpr std::array<uint32_t, 256> makeTable() {
  constexpr std::array<uint8_t, 256> sbox = makeSbox();
  static_assert(sbox[0x00] == 0x63 && sbox[0x01] == 0x7c && sbox[0x53] == 0xed);
  std::array<uint32_t, 256> t{};
  for (int a = 0; a < 256; ++a) {
    uint32_t s1 = sbox[a];
    uint32_t s2 = gfMul2(sbox[a]);
    t[a] = s2 | (s1 << 8) | (s1 << 16) | ((s2 ^ s1) << 24);
  }
  return t;
}
constexpr std::array<uint32_t, 256> kAesTable = makeTable();

constexpr uint32_t rotl32(uint32_t v, int s) { return (v << s) | (v >> (32 - s)); }

// One round as x86 AESENC computes it: MixColumns(ShiftRows(SubBytes(x))) ^ key. Output column
// c takes row r from input column c + r (ShiftRows).
inline uint32_t mixColumn(uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  return kAesTable[r0 & 0xff] ^ rotl32(kAesTable[(r1 >> 8) & 0xff], 8) ^
         rotl32(kAesTable[(r2 >> 16) & 0xff], 16) ^ rotl32(kAesTable[r3 >> 24], 24);
}

inline AesState aesRound(const AesState& x, const AesState& key) {
  return {mixColumn(x[0], x[1], x[2], x[3]) ^ key[0], mixColumn(x[1], x[2], x[3], x[0]) ^ key[1],
          mixColumn(x[2], x[3], x[0], x[1]) ^ key[2], mixColumn(x[3], x[0], x[1], x[2]) ^ key[3]};
}

inline AesState lane(const TokenId* tokens) { return {tokens[0], tokens[1], tokens[2], tokens[3]}; }

constexpr AesState keyState(int k) {
  return {static_cast<uint32_t>(kAesKeys[k][0]), static_cast<uint32_t>(kAesKeys[k][0] >> 32),
          static_cast<uint32_t>(kAesKeys[k][1]), static_cast<uint32_t>(kAesKeys[k][1] >> 32)};
}

uint64_t portableContent16(const TokenId* tokens) {
  constexpr AesState k0 = keyState(0);
  AesState x = lane(tokens);
  for (int c = 0; c < 4; ++c) x[c] ^= k0[c];
  x = aesRound(x, lane(tokens + 4));
  x = aesRound(x, lane(tokens + 8));
  x = aesRound(x, lane(tokens + 12));
  x = aesRound(x, keyState(1));
  x = aesRound(x, keyState(2));
  x = aesRound(x, keyState(3));
  return ((uint64_t{x[1]} << 32) | x[0]) ^ ((uint64_t{x[3]} << 32) | x[2]);
}

// Whether this CPU runs the AES-NI path (checked once; the build is not -march=native).
bool cpuHasAes() {
#if KVF_POLICY_AESNI
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("aes") && __builtin_cpu_supports("sse4.1");
  }();
  return has;
#else
  return false;
#endif
}

#if KVF_POLICY_AESNI
__attribute__((target("aes,sse4.1"))) inline uint64_t aesniContent16(const TokenId* tokens) {
  const __m128i* lanes = reinterpret_cast<const __m128i*>(tokens);
  auto key = [](int k) {
    return _mm_set_epi64x(static_cast<long long>(kAesKeys[k][1]),
                          static_cast<long long>(kAesKeys[k][0]));
  };
  __m128i x = _mm_xor_si128(_mm_loadu_si128(lanes), key(0));
  x = _mm_aesenc_si128(x, _mm_loadu_si128(lanes + 1));
  x = _mm_aesenc_si128(x, _mm_loadu_si128(lanes + 2));
  x = _mm_aesenc_si128(x, _mm_loadu_si128(lanes + 3));
  x = _mm_aesenc_si128(x, key(1));
  x = _mm_aesenc_si128(x, key(2));
  x = _mm_aesenc_si128(x, key(3));
  return static_cast<uint64_t>(_mm_cvtsi128_si64(x)) ^
         static_cast<uint64_t>(_mm_extract_epi64(x, 1));
}

// The whole 16-token chain in one AES-NI function, so the rounds of consecutive blocks overlap
// (each block's rounds are independent; only chain() waits for the previous block).
__attribute__((target("aes,sse4.1"))) BlockHash aesniChain16(const TokenId* src, size_t blocks,
                                                             BlockHash parent, BlockHash* dst) {
  for (size_t i = 0; i < blocks; ++i, src += kDefaultBlockSize) {
    parent = chain(parent, aesniContent16(src));
    dst[i] = parent;
  }
  return parent;
}

#endif

uint64_t content16(const TokenId* tokens) {
#if KVF_POLICY_AESNI
  if (cpuHasAes()) return aesniContent16(tokens);
#endif
  return portableContent16(tokens);
}

// Blocks of any other size: xxh3 over their bytes.
inline uint64_t contentHash(const TokenId* tokens, size_t count) {
  if (count == kDefaultBlockSize) return content16(tokens);
  return XXH3_64bits_withSeed(tokens, count * sizeof(TokenId), kTokenSeed);
}

}  // namespace

namespace internal {
uint64_t contentHash16Portable(const TokenId* tokens) { return portableContent16(tokens); }
bool contentHash16Native(const TokenId* tokens, uint64_t* out) {
#if KVF_POLICY_AESNI
  if (!cpuHasAes()) return false;
  *out = aesniContent16(tokens);
  return true;
#else
  (void)tokens;
  (void)out;
  return false;
#endif
}
}  // namespace internal

BlockHash hashBlock(BlockHash parent, std::span<const TokenId> tokens) {
  return chain(parent, contentHash(tokens.data(), tokens.size()));
}

BlockHash hashTokenBlocksTo(std::span<const TokenId> tokens, size_t block_size, BlockHash parent,
                            std::span<BlockHash> out) {
  if (block_size == 0) return parent;
  out = out.first(std::min(out.size(), tokens.size() / block_size));  // never read past tokens
  if (out.empty()) return parent;
  const TokenId* src = tokens.data();
#if KVF_POLICY_AESNI
  if (block_size == kDefaultBlockSize && cpuHasAes()) {
    return aesniChain16(src, out.size(), parent, out.data());
  }
#endif
  for (size_t i = 0; i < out.size(); ++i, src += block_size) {
    parent = chain(parent, contentHash(src, block_size));
    out[i] = parent;
  }
  return parent;
}

void hashTokenBlocks(std::span<const TokenId> tokens, size_t block_size,
                     std::vector<BlockHash>* out, BlockHash parent) {
  if (block_size == 0) return;
  size_t blocks = tokens.size() / block_size;
  size_t first = out->size();
  out->resize(first + blocks);
  hashTokenBlocksTo(tokens, block_size, parent, std::span<BlockHash>(*out).subspan(first));
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
    parent = BlockHash{
        XXH3_64bits_withSeed(text.data() + off, bytes_per_block, parent.value ^ kTextSeed)};
    out.push_back(parent);
  }
  return out;
}

uint64_t engineHashFromBytes(std::string_view bytes) {
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), kEngineSeed);
}

BlockHash hashBlockKey(BlockHash parent, uint64_t key) {
  return chain(parent, XXH3_64bits_withSeed(&key, sizeof(key), kBlockKeySeed));
}

void hashKeyBlocks(std::span<const uint64_t> keys, std::vector<BlockHash>* out, BlockHash parent) {
  out->reserve(out->size() + keys.size());
  for (uint64_t key : keys) {
    parent = hashBlockKey(parent, key);
    out->push_back(parent);
  }
}

}  // namespace kvf::policy
