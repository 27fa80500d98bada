#include "policy/cache_index.h"

#include <gtest/gtest.h>

#include <numeric>

namespace kvf::policy {
namespace {

constexpr size_t kBs = 16;

std::vector<TokenId> tokens(size_t blocks, TokenId start = 0) {
  std::vector<TokenId> v(blocks * kBs);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// A BlockStored event as an engine with its own hash function would send it: engine hashes
// are arbitrary numbers, token ids carry the content.
StoredBlocks stored(std::vector<uint64_t> engine_hashes, std::optional<uint64_t> parent,
                    std::vector<TokenId> toks) {
  StoredBlocks e;
  e.engine_hashes = std::move(engine_hashes);
  e.has_parent = parent.has_value();
  e.engine_parent = parent.value_or(0);
  e.token_ids = std::move(toks);
  e.block_size = kBs;
  return e;
}

std::vector<uint32_t> match(const CacheIndex& index, const std::vector<BlockHash>& h, int n = 4) {
  std::vector<uint32_t> out(n);
  index.matchLengths(h, out);
  return out;
}

TEST(CacheIndexTest, ExactEventsMapEngineHashesThroughTokens) {
  CacheIndex index;
  auto t = tokens(4);
  auto ours = hashTokenBlocks(t, kBs);
  // Two events: blocks 0-1 without parent, then 2-3 chained on engine hash 1002.
  ASSERT_TRUE(
      index.storeBlocks(1, stored({1001, 1002}, std::nullopt, {t.begin(), t.begin() + 32})));
  ASSERT_TRUE(index.storeBlocks(1, stored({1003, 1004}, 1002, {t.begin() + 32, t.end()})));
  EXPECT_EQ(match(index, ours), (std::vector<uint32_t>{0, 4, 0, 0}));
  EXPECT_EQ(index.instanceBlocks(1), 4u);

  // Removing the engine's hash of block 2 cuts the leading run at 2 on that instance.
  std::vector<uint64_t> removed = {1003};
  index.removeBlocks(1, removed);
  EXPECT_EQ(match(index, ours), (std::vector<uint32_t>{0, 2, 0, 0}));
  EXPECT_EQ(index.exactHolders(ours[3]), HolderSet{1});  // block 3 still held
  EXPECT_EQ(index.stats().exact_entries, 3u);
}

// vLLM can cache one hash in two blocks (a fully cached prompt recomputes its last block): the
// block stays held until its last copy is removed.
TEST(CacheIndexTest, CopiesOfOneHashNeedOneRemovalEach) {
  CacheIndex index;
  auto t = tokens(2);
  auto ours = hashTokenBlocks(t, kBs);
  ASSERT_TRUE(index.storeBlocks(0, stored({7, 8}, std::nullopt, t)));
  ASSERT_TRUE(index.storeBlocks(0, stored({8}, 7, {t.begin() + 16, t.end()})));  // second copy
  std::vector<uint64_t> removed = {8};
  index.removeBlocks(0, removed);
  EXPECT_EQ(match(index, ours), (std::vector<uint32_t>{2, 0, 0, 0}));
  index.removeBlocks(0, removed);
  EXPECT_EQ(match(index, ours), (std::vector<uint32_t>{1, 0, 0, 0}));
  EXPECT_EQ(index.instanceBlocks(0), 1u);
}

// Equal tokens under different extra keys (LoRA adapter, cache salt) are different blocks: they
// never merge, and removing one leaves the other.
TEST(CacheIndexTest, ExtraKeysSeparateEqualTokens) {
  CacheIndex index;
  auto t = tokens(2);
  StoredBlocks plain = stored({1, 2}, std::nullopt, t);
  StoredBlocks salted = stored({11, 12}, std::nullopt, t);
  salted.extras = {0x5a17, 0};  // a salt on block 0 only
  ASSERT_TRUE(index.storeBlocks(0, plain));
  ASSERT_TRUE(index.storeBlocks(0, salted));
  auto unkeyed = hashTokenBlocks(t, kBs);
  std::vector<uint64_t> extras = {0x5a17};
  auto keyed = hashTokenBlocksWithExtras(t, kBs, extras);
  EXPECT_NE(unkeyed[0], keyed[0]);
  EXPECT_NE(unkeyed[1], keyed[1]);  // the chain carries the salt on
  EXPECT_EQ(index.instanceBlocks(0), 4u);
  std::vector<uint64_t> removed = {1, 2};
  index.removeBlocks(0, removed);
  EXPECT_EQ(match(index, unkeyed), (std::vector<uint32_t>{0, 0, 0, 0}));
  EXPECT_EQ(match(index, keyed), (std::vector<uint32_t>{2, 0, 0, 0}));
  // A keyless digest (0) hashes exactly as before.
  std::vector<uint64_t> none = {0, 0};
  EXPECT_EQ(hashTokenBlocksWithExtras(t, kBs, none), unkeyed);
}

// Data-parallel ranks are streams of one instance: a block both hold survives one rank's
// removal and one rank's reset.
TEST(CacheIndexTest, StreamsOfOneInstanceCountSeparately) {
  CacheIndex index;
  auto t = tokens(2);
  auto ours = hashTokenBlocks(t, kBs);
  ASSERT_TRUE(index.storeBlocks(3, stored({1, 2}, std::nullopt, t), /*stream=*/0));
  ASSERT_TRUE(index.storeBlocks(3, stored({1, 2}, std::nullopt, t), /*stream=*/1));
  std::vector<uint64_t> removed = {2};
  index.removeBlocks(3, removed, 0);
  EXPECT_EQ(match(index, ours), (std::vector<uint32_t>{0, 0, 0, 2}));
  index.clearStream(3, 1);
  EXPECT_EQ(match(index, ours), (std::vector<uint32_t>{0, 0, 0, 1}));
  EXPECT_EQ(index.stats().exact_entries, 1u);
  index.clearStream(3, 0);
  EXPECT_EQ(index.stats().exact_entries, 0u);
  EXPECT_EQ(index.instanceBlocks(3), 0u);
}

// An instance's declared KV capacity bounds what its events can make the index hold (three
// 25 MiB BlockStored messages once indexed 3.1M blocks for an engine holding 17,618).
TEST(CacheIndexTest, DeclaredCapacityBoundsAnInstance) {
  CacheIndex index;
  index.setCapacity(0, 100);
  for (uint64_t batch = 0; batch < 3; ++batch) {
    std::vector<uint64_t> hashes(200);
    std::iota(hashes.begin(), hashes.end(), 1 + batch * 1000);
    EXPECT_FALSE(index.storeBlocks(
        0, stored(hashes, std::nullopt, tokens(200, static_cast<TokenId>(batch * 100000)))));
  }
  EXPECT_LE(index.instanceBlocks(0), 100u);
  EXPECT_EQ(index.stats().over_capacity, 3u);
  // Another instance is not bound by it.
  std::vector<uint64_t> hashes(200);
  std::iota(hashes.begin(), hashes.end(), 1);
  EXPECT_TRUE(index.storeBlocks(1, stored(hashes, std::nullopt, tokens(200))));
}

TEST(CacheIndexTest, LongestLeadingRunPerInstance) {
  CacheIndex index;
  auto t = tokens(6);
  auto ours = hashTokenBlocks(t, kBs);
  ASSERT_TRUE(index.storeBlocks(0, stored({1, 2, 3, 4, 5, 6}, std::nullopt, t)));
  ASSERT_TRUE(index.storeBlocks(2, stored({7, 8}, std::nullopt, {t.begin(), t.begin() + 32})));
  std::vector<uint32_t> out(3);
  index.matchLengths(ours, out);
  EXPECT_EQ(out, (std::vector<uint32_t>{6, 0, 2}));
  // A prompt diverging after block 1 matches only two blocks anywhere.
  auto other = t;
  other[2 * kBs] = 777777;
  EXPECT_EQ(match(index, hashTokenBlocks(other, kBs), 3), (std::vector<uint32_t>{2, 0, 2}));
}

TEST(CacheIndexTest, UnknownParentAndSizeMismatchAreRejected) {
  CacheIndex index;
  auto t = tokens(2);
  EXPECT_FALSE(index.storeBlocks(0, stored({5}, 999, {t.begin(), t.begin() + 16})));
  auto bad = stored({5, 6}, std::nullopt, t);
  bad.block_size = 32;
  EXPECT_FALSE(index.storeBlocks(0, bad));
  EXPECT_FALSE(index.storeBlocks(0, stored({5, 6}, std::nullopt, {t.begin(), t.begin() + 20})));
  EXPECT_EQ(index.stats().stored_events_rejected, 3u);
  EXPECT_EQ(index.stats().blocks, 0u);
  std::vector<uint64_t> unknown = {42};
  index.removeBlocks(0, unknown);
  EXPECT_EQ(index.stats().removed_unknown, 1u);
}

TEST(CacheIndexTest, ClearInstanceDropsOnlyThatInstance) {
  CacheIndex index;
  auto t = tokens(3);
  auto ours = hashTokenBlocks(t, kBs);
  ASSERT_TRUE(index.storeBlocks(0, stored({1, 2, 3}, std::nullopt, t)));
  ASSERT_TRUE(index.storeBlocks(3, stored({1, 2, 3}, std::nullopt, t)));
  index.addSoft(0, ours, 0, false);  // routed there as well
  index.addSoft(1, ours, 0, false);
  EXPECT_EQ(index.stats().soft_entries, 6u);
  index.clearInstance(0);
  EXPECT_EQ(match(index, ours), (std::vector<uint32_t>{0, 3, 0, 3}));
  EXPECT_EQ(index.instanceBlocks(0), 0u);
  EXPECT_EQ(index.stats().soft_entries, 3u);
  // After a restart the engine's hashes start over: the same engine hash must map afresh.
  ASSERT_TRUE(index.storeBlocks(0, stored({1}, std::nullopt, {t.begin(), t.begin() + 16})));
  EXPECT_EQ(match(index, ours), (std::vector<uint32_t>{1, 3, 0, 3}));
}

TEST(CacheIndexTest, PredictedEntriesExpireWhereNoEventConfirmedThem) {
  CacheIndexConfig config;
  config.predicted_ttl = 10 * kNanosPerSecond;
  CacheIndex index(config);
  auto t = tokens(4);
  auto ours = hashTokenBlocks(t, kBs);
  index.addSoft(2, ours, 0, false);
  EXPECT_EQ(match(index, ours), (std::vector<uint32_t>{0, 0, 4, 0}));
  EXPECT_EQ(index.holders(std::span(ours).first(3)), HolderSet{2});
  EXPECT_TRUE(index.exactHolders(ours[0]).empty());
  // The engine announces the first two blocks; the others stay predicted only.
  ASSERT_TRUE(index.storeBlocks(2, stored({11, 12}, std::nullopt, {t.begin(), t.begin() + 32})));
  EXPECT_EQ(index.exactHolders(ours[0]), HolderSet{2});
  index.expire(9 * kNanosPerSecond);
  EXPECT_EQ(match(index, ours), (std::vector<uint32_t>{0, 0, 4, 0}));
  index.expire(10 * kNanosPerSecond);
  EXPECT_EQ(match(index, ours), (std::vector<uint32_t>{0, 0, 2, 0}));
  EXPECT_EQ(index.stats().soft_entries, 0u);
  EXPECT_EQ(index.stats().soft_blocks, 0u);
  EXPECT_EQ(index.stats().soft_expired, 4u);
  EXPECT_EQ(index.stats().blocks, 2u);
}

// The routed claim is kept per chain: a BlockRemoved inside the TTL leaves it, and the match
// counts the instance until the claim expires.
TEST(CacheIndexTest, RemovalInsideTheTtlKeepsTheRoutedClaim) {
  CacheIndexConfig config;
  config.predicted_ttl = 10;
  CacheIndex index(config);
  auto t = tokens(3);
  auto ours = hashTokenBlocks(t, kBs);
  index.addSoft(1, ours, 0, false);
  ASSERT_TRUE(index.storeBlocks(1, stored({5, 6, 7}, std::nullopt, t)));
  index.removeBlocks(1, std::vector<uint64_t>{6, 7});
  EXPECT_EQ(match(index, ours), (std::vector<uint32_t>{0, 3, 0, 0}));
  index.expire(10);
  EXPECT_EQ(match(index, ours), (std::vector<uint32_t>{0, 1, 0, 0}));
}

TEST(CacheIndexTest, RefreshedSoftEntryOutlivesItsFirstRecord) {
  CacheIndexConfig config;
  config.approximate_ttl = 100;
  CacheIndex index(config);
  auto ours = hashTokenBlocks(tokens(2), kBs);
  index.addSoft(1, ours, 0, true);
  index.addSoft(1, ours, 60, true);  // routed again: expires at 160
  index.expire(120);
  EXPECT_EQ(match(index, ours), (std::vector<uint32_t>{0, 2, 0, 0}));
  index.expire(160);
  EXPECT_EQ(match(index, ours), (std::vector<uint32_t>{0, 0, 0, 0}));
  EXPECT_EQ(index.stats().blocks, 0u);
  EXPECT_EQ(index.stats().soft_blocks, 0u);
}

TEST(CacheIndexTest, CapacityBoundsExactAndSoftEntries) {
  CacheIndexConfig config;
  config.max_blocks_per_instance = 2;
  config.max_soft_entries = 3;
  CacheIndex index(config);
  auto t = tokens(4);
  EXPECT_FALSE(index.storeBlocks(0, stored({1, 2, 3, 4}, std::nullopt, t)));
  EXPECT_EQ(index.instanceBlocks(0), 2u);
  auto ours = hashTokenBlocks(t, kBs);
  index.addSoft(1, ours, 0, false);
  EXPECT_EQ(index.stats().soft_entries, 3u);
  EXPECT_EQ(match(index, ours)[1], 3u);
  index.addSoft(2, ours, 0, false);  // the three blocks already routed fit, the fourth not
  EXPECT_EQ(index.stats().soft_entries, 6u);
  EXPECT_EQ(index.stats().soft_blocks, 3u);
}

// The fused path hashes only as far as the match needs and agrees with hash-then-match for
// runs ending at every position, including a run covering the whole prompt and a partial
// trailing block; the completed hashes equal the full chain.
TEST(CacheIndexTest, HashAndMatchAgreesWithHashThenMatch) {
  CacheIndex index;
  auto t = tokens(200);
  t.resize(t.size() + 5);  // a trailing partial block is not hashed
  auto full = hashTokenBlocks(t, kBs);
  ASSERT_EQ(full.size(), 200u);
  index.addSoft(0, std::span<const BlockHash>(full).first(3), 0, false);
  index.addSoft(1, std::span<const BlockHash>(full).first(100), 0, false);
  index.addSoft(2, full, 0, true);
  for (size_t upto : {size_t{200}, size_t{100}, size_t{3}, size_t{0}}) {
    if (upto < 200) index.clearInstance(2);
    if (upto < 100) index.clearInstance(1);
    if (upto < 3) index.clearInstance(0);
    std::vector<BlockHash> hashes = {BlockHash{123}};  // cleared by the call
    std::vector<uint32_t> fused(4);
    index.hashAndMatch(t, &hashes, fused);
    EXPECT_EQ(fused, match(index, full)) << "run up to " << upto;
    EXPECT_LE(hashes.size(), full.size());
    EXPECT_TRUE(std::equal(hashes.begin(), hashes.end(), full.begin()));
    if (upto < 100) {
      EXPECT_LT(hashes.size(), full.size()) << "hashed past the end of the run";
    }
    completeBlockHashes(t, kBs, &hashes);
    EXPECT_EQ(hashes, full);
  }
}

// Block sizes other than 16 (xxh3 content, the stepwise pipeline rather than the fused AES-NI
// loop) give the same answers as hash-then-match, for runs ending mid-prompt and at its end.
TEST(CacheIndexTest, HashAndMatchAgreesForOtherBlockSizes) {
  CacheIndexConfig config;
  config.block_size = 32;
  CacheIndex index(config);
  std::vector<TokenId> t(32 * 150 + 7);
  std::iota(t.begin(), t.end(), 9);
  auto full = hashTokenBlocks(t, 32);
  ASSERT_EQ(full.size(), 150u);
  index.addSoft(0, std::span<const BlockHash>(full).first(40), 0, false);
  index.addSoft(1, full, 0, false);
  for (bool whole : {true, false}) {
    if (!whole) index.clearInstance(1);
    std::vector<BlockHash> hashes;
    std::vector<uint32_t> fused(2);
    index.hashAndMatch(t, &hashes, fused);
    EXPECT_EQ(fused, (std::vector<uint32_t>{40, whole ? 150u : 0u}));
    EXPECT_TRUE(std::equal(hashes.begin(), hashes.end(), full.begin()));
    if (!whole) {
      EXPECT_LT(hashes.size(), full.size());
    }
    completeBlockHashes(t, 32, &hashes);
    EXPECT_EQ(hashes, full);
  }
}

}  // namespace
}  // namespace kvf::policy
