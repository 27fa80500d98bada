// Inline kernels of the block hash (policy/block_hash.h), shared by block_hash.cc and the fused
// hash-and-probe loop of CacheIndex::hashAndMatch: the chain step and the AES-NI content hash
// of a 16-token block. Internal to policy/; the formula is in docs/policies.md. Pure functions.
#pragma once

#include <cstdint>

#include "policy/block_hash.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define KVF_POLICY_AESNI 1
#else
#define KVF_POLICY_AESNI 0
#endif

namespace kvf::policy::kernels {

inline constexpr uint64_t kChainParentKey = 0x27d4eb2f165667c5ULL;
inline constexpr uint64_t kChainContentKey = 0x85ebca77c2b2ae63ULL;

// The chain step: the 64-bit fold (lo ^ hi) of the 128-bit product of (parent, content), each
// xored with a key (xxh3's 16-byte mixer). Its latency (~5 cycles) is the only serial part.
__extension__ using Uint128 = unsigned __int128;  // GCC / Clang, every 64-bit target
inline BlockHash chain(BlockHash parent, uint64_t content) {
  Uint128 product = static_cast<Uint128>(parent ^ kChainParentKey) * (content ^ kChainContentKey);
  return static_cast<uint64_t>(product) ^ static_cast<uint64_t>(product >> 64);
}

// K0..K3 of the 16-token content hash: hexadecimal digits of pi, as little-endian 64-bit halves
// {lo, hi}.
inline constexpr uint64_t kAesKeys[4][2] = {{0x13198a2e03707344ULL, 0x243f6a8885a308d3ULL},
                                            {0x082efa98ec4e6c89ULL, 0xa4093822299f31d0ULL},
                                            {0xbe5466cf34e90c6cULL, 0x452821e638d01377ULL},
                                            {0x3f84d5b5b5470917ULL, 0xc0ac29b7c97c50ddULL}};

// Whether this CPU runs the AES-NI kernels (checked once).
bool cpuHasAes();

#if KVF_POLICY_AESNI
// The content hash of one 16-token block with AES-NI; callers check cpuHasAes() first and are
// themselves compiled with target("aes,sse4.1") so that this inlines.
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
#endif

}  // namespace kvf::policy::kernels
