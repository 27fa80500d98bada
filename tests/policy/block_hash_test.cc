#include "policy/block_hash.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <numeric>
#include <random>
#include <set>

namespace kvf::policy {
namespace {

std::vector<TokenId> iota(size_t n, TokenId start = 0) {
  std::vector<TokenId> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

using Block = std::array<TokenId, 16>;

// The content hash the hot path uses on this machine (AES-NI when present).
uint64_t content(const Block& b) {
  uint64_t h = 0;
  if (internal::contentHash16Native(b.data(), &h)) return h;
  return internal::contentHash16Portable(b.data());
}

// Number of equal pairs among `hashes` (sorted in place).
size_t duplicates(std::vector<uint64_t>& hashes) {
  std::sort(hashes.begin(), hashes.end());
  return hashes.size() -
         static_cast<size_t>(std::unique(hashes.begin(), hashes.end()) - hashes.begin());
}

TEST(BlockHashTest, OnlyFullBlocksAreHashed) {
  EXPECT_EQ(hashTokenBlocks(iota(15), 16).size(), 0u);
  EXPECT_EQ(hashTokenBlocks(iota(16), 16).size(), 1u);
  EXPECT_EQ(hashTokenBlocks(iota(47), 16).size(), 2u);
  EXPECT_EQ(hashTokenBlocks(iota(48), 0).size(), 0u);
}

TEST(BlockHashTest, ChainSharesPrefixAndDivergesAfterFirstDifference) {
  auto a = iota(64);
  auto b = a;
  b[40] = 99999;  // third block differs
  auto ha = hashTokenBlocks(a, 16);
  auto hb = hashTokenBlocks(b, 16);
  ASSERT_EQ(ha.size(), 4u);
  EXPECT_EQ(ha[0], hb[0]);
  EXPECT_EQ(ha[1], hb[1]);
  EXPECT_NE(ha[2], hb[2]);
  EXPECT_NE(ha[3], hb[3]);  // the chain carries the difference forward
}

TEST(BlockHashTest, SameBlockUnderDifferentParentsDiffers) {
  auto block = iota(16, 500);
  EXPECT_NE(hashBlock(kRootBlockHash, block), hashBlock(hashBlock(kRootBlockHash, block), block));
  // Deterministic across calls and equal to the incremental form.
  auto tokens = iota(32);
  auto chained = hashTokenBlocks(tokens, 16);
  BlockHash h0 = hashBlock(kRootBlockHash, std::span<const TokenId>(tokens).first(16));
  EXPECT_EQ(chained[0], h0);
  EXPECT_EQ(chained[1], hashBlock(h0, std::span<const TokenId>(tokens).subspan(16, 16)));
}

TEST(BlockHashTest, NoCollisionsOverManyBlocks) {
  std::set<BlockHash> seen;
  auto tokens = iota(16 * 20000);
  for (BlockHash h : hashTokenBlocks(tokens, 16)) EXPECT_TRUE(seen.insert(h).second);
  EXPECT_EQ(seen.size(), 20000u);
}

// The prompt path (16-token blocks, a constant length for xxh3) must equal the per-block hash
// that maps engine events, or engine events would never match prompts.
TEST(BlockHashTest, FastPathEqualsPerBlockHashOnRandomTokens) {
  std::mt19937_64 rng(3);
  std::vector<TokenId> tokens(16 * 5000);
  for (auto& t : tokens) t = static_cast<TokenId>(rng());
  auto chained = hashTokenBlocks(tokens, 16);
  ASSERT_EQ(chained.size(), 5000u);
  BlockHash parent = kRootBlockHash;
  for (size_t i = 0; i < chained.size(); ++i) {
    parent = hashBlock(parent, std::span<const TokenId>(tokens).subspan(16 * i, 16));
    ASSERT_EQ(chained[i], parent) << "block " << i;
  }
}

// Known answers: the formula is part of the index's contract (docs/policies.md); a change
// here invalidates every persisted decision log and simulator comparison.
TEST(BlockHashTest, KnownAnswers) {
  std::mt19937 rng(7);
  std::vector<TokenId> tokens(16 * 4);
  for (auto& t : tokens) t = static_cast<TokenId>(rng() % 200000);
  EXPECT_EQ(hashTokenBlocks(tokens, 16), (std::vector<BlockHash>{{0xbc7c53cd11866caeULL},
                                                                 {0xe565a8fe8850f78cULL},
                                                                 {0x87d5b2824a7e7755ULL},
                                                                 {0xe78482292842a0ceULL}}));
  // Other block sizes hash their content with xxh3.
  EXPECT_EQ(hashTokenBlocks(tokens, 32),
            (std::vector<BlockHash>{{0xdecb8c40f6114844ULL}, {0xe437be6906309856ULL}}));
  // The portable path gives the same answers on every CPU.
  Block b;
  std::copy_n(tokens.begin(), 16, b.begin());
  EXPECT_EQ(internal::contentHash16Portable(b.data()), 0x604a8e64cc9c45aaULL);
}

// AES-NI and the portable AES round must agree bit for bit on any token values, or routers on
// different CPUs would disagree on every block.
TEST(BlockHashTest, PortableContentHashEqualsAesNi) {
  std::mt19937_64 rng(11);
  Block b{};
  uint64_t native = 0;
  if (!internal::contentHash16Native(b.data(), &native)) GTEST_SKIP() << "no AES-NI here";
  for (int i = 0; i < 20000; ++i) {
    // Full 32-bit tokens, vocabulary-sized ones and sparse blocks.
    for (auto& t : b) {
      uint64_t r = rng();
      t = static_cast<TokenId>(i % 3 == 0 ? r : i % 3 == 1 ? r % 200000 : (r % 8 == 0 ? r : 0));
    }
    ASSERT_TRUE(internal::contentHash16Native(b.data(), &native));
    ASSERT_EQ(native, internal::contentHash16Portable(b.data())) << "block " << i;
  }
}

// The batched prompt path equals block-at-a-time hashing for every length (whole blocks plus
// any remainder), from the root and when resuming a partial chain.
TEST(BlockHashTest, BatchedPathEqualsPerBlockForEveryLength) {
  std::mt19937_64 rng(5);
  std::vector<TokenId> tokens(16 * 40 + 15);
  for (auto& t : tokens) t = static_cast<TokenId>(rng() % 200000);
  std::vector<BlockHash> reference;
  BlockHash parent = kRootBlockHash;
  for (size_t i = 0; i + 16 <= tokens.size(); i += 16) {
    parent = hashBlock(parent, std::span<const TokenId>(tokens).subspan(i, 16));
    reference.push_back(parent);
  }
  std::span<const TokenId> all(tokens);
  for (size_t n = 0; n <= tokens.size(); ++n) {
    auto got = hashTokenBlocks(all.first(n), 16);
    ASSERT_EQ(got.size(), n / 16);
    ASSERT_TRUE(std::equal(got.begin(), got.end(), reference.begin())) << "length " << n;
    // Resume from a prefix of the chain.
    got.resize(got.size() / 2);
    completeBlockHashes(all, 16, &got);
    ASSERT_EQ(got, reference) << "resumed at length " << n;
  }
}

// The caller-owned form writes only what the tokens cover and chains from the given parent.
TEST(BlockHashTest, HashIntoCallerMemory) {
  auto tokens = iota(16 * 5 + 3);
  auto full = hashTokenBlocks(tokens, 16);
  std::vector<BlockHash> out(8, BlockHash{7});
  EXPECT_EQ(hashTokenBlocksTo(tokens, 16, kRootBlockHash, out), full.back());
  EXPECT_TRUE(std::equal(full.begin(), full.end(), out.begin()));
  EXPECT_EQ(out[5], BlockHash{7});  // past the 5 full blocks: untouched
  std::span<const TokenId> rest = std::span<const TokenId>(tokens).subspan(32);
  std::vector<BlockHash> tail(3);
  EXPECT_EQ(hashTokenBlocksTo(rest, 16, full[1], tail), full[4]);
  EXPECT_EQ(tail, (std::vector<BlockHash>{full[2], full[3], full[4]}));
  EXPECT_EQ(hashTokenBlocksTo(tokens, 0, BlockHash{42}, out), BlockHash{42});
  EXPECT_EQ(hashTokenBlocksTo({}, 16, BlockHash{42}, out), BlockHash{42});
}

// 64-bit quality of the content hash: no collision among millions of random and structured
// blocks (a random 64-bit function collides among 4M values with probability ~5e-7), and every
// input bit flips every output bit about half the time.
TEST(BlockHashTest, ContentHashHasNoCollisionsOnRandomAndStructuredBlocks) {
  std::mt19937_64 rng(17);
  std::vector<uint64_t> hashes;
  hashes.reserve(5u << 20);
  Block b;
  for (int i = 0; i < (1 << 21); ++i) {  // random vocabulary-sized blocks
    for (auto& t : b) t = static_cast<TokenId>(rng() % 200000);
    hashes.push_back(content(b));
  }
  Block base;
  for (auto& t : base) t = static_cast<TokenId>(rng() % 200000);
  for (int pos = 0; pos < 16; ++pos) {  // one token differs: every position x 65,536 values
    for (TokenId v = 0; v < 65536; ++v) {
      b = base;
      b[pos] = v;
      if (v != base[pos]) hashes.push_back(content(b));
    }
  }
  for (TokenId v = 0; v < 200000; ++v) {  // a single repeated token; a counting run
    b.fill(v);
    hashes.push_back(content(b));
    std::iota(b.begin(), b.end(), v + 1);
    hashes.push_back(content(b));
  }
  for (int pos = 0; pos < 16; ++pos) {  // sparse: zeros and one token at any position
    for (TokenId v = 1; v < 20000; ++v) {
      b.fill(0);
      b[pos] = v;
      hashes.push_back(content(b));
    }
  }
  for (int i = 0; i < 200000; ++i) {  // two adjacent tokens of the base differ by small steps
    b = base;
    int pos = i % 15;
    b[pos] += static_cast<TokenId>(1 + (i / 15) % 97);
    b[pos + 1] -= static_cast<TokenId>(1 + (i / 15) / 97);
    hashes.push_back(content(b));
  }
  size_t n = hashes.size();
  EXPECT_GT(n, 4'000'000u);
  EXPECT_EQ(duplicates(hashes), 0u) << "among " << n << " blocks";
}

TEST(BlockHashTest, ContentHashAvalanche) {
  std::mt19937_64 rng(23);
  constexpr int kTrials = 2000;
  std::vector<int> flips(512 * 64, 0);
  Block b;
  for (int trial = 0; trial < kTrials; ++trial) {
    for (auto& t : b) t = static_cast<TokenId>(rng());
    uint64_t h = content(b);
    for (int bit = 0; bit < 512; ++bit) {
      Block c = b;
      c[bit / 32] ^= TokenId{1} << (bit % 32);
      uint64_t d = h ^ content(c);
      for (int out = 0; out < 64; ++out) flips[bit * 64 + out] += (d >> out) & 1;
    }
  }
  // Each cell is Binomial(2000, 1/2): mean 1000, sd 22.4; 6 sd either side.
  auto [lo, hi] = std::minmax_element(flips.begin(), flips.end());
  EXPECT_GE(*lo, 866) << "input bit " << (lo - flips.begin()) / 64 << " output bit "
                      << (lo - flips.begin()) % 64;
  EXPECT_LE(*hi, 1134) << "input bit " << (hi - flips.begin()) / 64 << " output bit "
                       << (hi - flips.begin()) % 64;
}

TEST(BlockHashTest, TextBlocksAndEngineBytes) {
  EXPECT_EQ(hashTextBlocks("abcdefgh", 4).size(), 2u);
  EXPECT_EQ(hashTextBlocks("abcdefgh", 4)[0], hashTextBlocks("abcdXXXX", 4)[0]);
  EXPECT_NE(hashTextBlocks("abcdefgh", 4)[1], hashTextBlocks("abcdXXXX", 4)[1]);
  EXPECT_NE(engineHashFromBytes(std::string(32, 'a')), engineHashFromBytes(std::string(32, 'b')));
}

}  // namespace
}  // namespace kvf::policy
