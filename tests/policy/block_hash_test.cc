#include "policy/block_hash.h"

#include <gtest/gtest.h>

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
  EXPECT_EQ(hashTokenBlocks(tokens, 16),
            (std::vector<BlockHash>{0x44e7ac411788da4bULL, 0x69bde196371ed5dfULL,
                                    0x6446b71b0a9985e1ULL, 0x5dd782d7ffb63048ULL}));
}

TEST(BlockHashTest, TextBlocksAndEngineBytes) {
  EXPECT_EQ(hashTextBlocks("abcdefgh", 4).size(), 2u);
  EXPECT_EQ(hashTextBlocks("abcdefgh", 4)[0], hashTextBlocks("abcdXXXX", 4)[0]);
  EXPECT_NE(hashTextBlocks("abcdefgh", 4)[1], hashTextBlocks("abcdXXXX", 4)[1]);
  EXPECT_NE(engineHashFromBytes(std::string(32, 'a')), engineHashFromBytes(std::string(32, 'b')));
}

}  // namespace
}  // namespace kvf::policy
