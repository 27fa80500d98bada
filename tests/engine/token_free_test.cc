// Token-free prompts (PromptBlocks): block keys instead of token ids give the same prefix-cache
// behaviour as the tokens (full blocks only, last token always computed), BlockStored goes to
// a KeyedKvEventSink with one key per block, and malformed specs are refused by name.
#include <gtest/gtest.h>

#include "engine/engine_core.h"
#include "tests/engine/engine_test_util.h"

namespace kvf::engine {
namespace {

using testing::hashList;
using testing::makeConfig;

class KeyedSink final : public KeyedKvEventSink {
 public:
  void onBlockStored(worker::BlockStored event) override { token_stores.push_back(event); }
  void onBlockStoredKeys(worker::BlockStored event, std::vector<uint64_t> block_keys) override {
    stores.push_back({std::move(event), std::move(block_keys)});
  }
  void onBlockRemoved(worker::BlockRemoved event) override { removed.push_back(event); }
  void onAllBlocksCleared() override {}
  std::vector<std::pair<worker::BlockStored, std::vector<uint64_t>>> stores;
  std::vector<worker::BlockStored> token_stores;
  std::vector<worker::BlockRemoved> removed;
};

RequestSpec keyed(std::string id, int64_t tokens, std::vector<uint64_t> keys, uint64_t seed,
                  int64_t max_tokens) {
  RequestSpec s;
  s.id = std::move(id);
  s.prompt_blocks = PromptBlocks{tokens, std::move(keys), seed};
  s.sampling.max_tokens = max_tokens;
  s.sampling.ignore_eos = true;
  return s;
}

// Runs the core until `id` has its first token; returns its cached_tokens.
int64_t runUntilFirstToken(EngineCore& core, const std::string& id, Nanos* now) {
  for (int i = 0; i < 1000 && core.hasWork(); ++i) {
    StepResult r = core.step(*now);
    *now += r.duration;
    for (const RequestOutput& out : r.outputs) {
      if (out.id == id && !out.new_tokens.empty()) return out.cached_tokens;
    }
  }
  ADD_FAILURE() << id << " never produced a token";
  return -1;
}

// a (50 tokens: 3 full blocks with keys 1, 2, 3 and a partial one) from cold, then b with the
// same first two blocks and another third: 2 of b's blocks hit.
void runSharedPrefixPair(EngineCore& core, Nanos* now) {
  ASSERT_TRUE(core.add(keyed("a", 50, {1, 2, 3}, 77, 1), *now).ok());
  EXPECT_EQ(runUntilFirstToken(core, "a", now), 0);
  ASSERT_TRUE(core.add(keyed("b", 60, {1, 2, 9}, 78, 1), *now).ok());
  EXPECT_EQ(runUntilFirstToken(core, "b", now), 32);
}

TEST(TokenFree, SharedKeysHitLikeSharedTokens) {
  KeyedSink sink;
  auto core = EngineCore::create(makeConfig(16, 64, 8192), &sink);
  ASSERT_TRUE(core.ok()) << core.status();
  Nanos now = 0;
  ASSERT_NO_FATAL_FAILURE(runSharedPrefixPair(**core, &now));
  // Exactly 3 full blocks: the last token is computed, so only 2 blocks can hit.
  ASSERT_TRUE((*core)->add(keyed("c", 48, {1, 2, 3}, 79, 1), now).ok());
  EXPECT_EQ(runUntilFirstToken(**core, "c", &now), 32);
  // Another first block: nothing hits (the chain covers the prefix, not the key alone).
  ASSERT_TRUE((*core)->add(keyed("d", 50, {5, 2, 3}, 80, 1), now).ok());
  EXPECT_EQ(runUntilFirstToken(**core, "d", &now), 0);

  ASSERT_FALSE(sink.stores.empty());
  EXPECT_TRUE(sink.token_stores.empty());
  for (const auto& [ev, keys] : sink.stores) {
    EXPECT_TRUE(ev.token_ids.empty());
    EXPECT_EQ(ev.block_hashes.size(), keys.size());
    EXPECT_EQ(ev.block_size, 16);
  }
  // a stored its 3 prompt blocks first, keys in order.
  EXPECT_EQ(sink.stores[0].second, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_FALSE(sink.stores[0].first.parent_block_hash.has_value());
}

// A supplied keyed hasher (a simulator's: its router index's function) replaces the engine's
// own: the published hashes are its chain from its root, and the cache behaves as before.
uint64_t toyHash(uint64_t parent, uint64_t key) { return parent * 1000003 + key; }

TEST(TokenFree, SuppliedKeyedHasherNamesTheBlocks) {
  KeyedSink sink;
  EngineConfig config = makeConfig(16, 64, 8192);
  config.scheduler.keyed_hasher = {&toyHash, 7};
  auto core = EngineCore::create(config, &sink);
  ASSERT_TRUE(core.ok()) << core.status();
  Nanos now = 0;
  ASSERT_NO_FATAL_FAILURE(runSharedPrefixPair(**core, &now));
  ASSERT_GE(sink.stores.size(), 2u);
  uint64_t h1 = toyHash(7, 1), h2 = toyHash(h1, 2), h3 = toyHash(h2, 3);
  EXPECT_EQ(sink.stores[0].first.block_hashes, (hashList({h1, h2, h3})));
  EXPECT_EQ(sink.stores[1].first.block_hashes, (hashList({toyHash(h2, 9)})));
  EXPECT_EQ(sink.stores[1].first.parent_block_hash, BlockHash(h2));
  EXPECT_TRUE((*core)->pool().table().contains(BlockHash(h3)));
}

// A caller that already chained the prompt's hashes with the core's keyed hasher (a simulator's
// router) hands them over: the core caches and publishes under them, hashes only the blocks
// after them (generated tokens), and caches exactly as when it hashes the prompt itself.
TEST(TokenFree, GivenPromptHashesAreTakenAsTheCoresOwn) {
  EngineConfig config = makeConfig(16, 64, 8192);
  config.scheduler.keyed_hasher = {&toyHash, 7};
  KeyedSink hashed_sink, given_sink;
  auto hashed = EngineCore::create(config, &hashed_sink);
  auto given = EngineCore::create(config, &given_sink);
  ASSERT_TRUE(hashed.ok() && given.ok());
  uint64_t h1 = toyHash(7, 1), h2 = toyHash(h1, 2), h3 = toyHash(h2, 3);
  Nanos now_a = 0, now_b = 0;
  ASSERT_TRUE((*hashed)->add(keyed("a", 50, {1, 2, 3}, 77, 40), now_a).ok());
  RequestSpec spec = keyed("a", 50, {1, 2, 3}, 77, 40);
  spec.prompt_blocks->block_hashes = hashList({h1, h2, h3});
  ASSERT_TRUE((*given)->add(std::move(spec), now_b).ok());
  while ((*hashed)->hasWork()) now_a += (*hashed)->step(now_a).duration;
  while ((*given)->hasWork()) now_b += (*given)->step(now_b).duration;
  ASSERT_EQ(given_sink.stores.size(), hashed_sink.stores.size());
  for (size_t i = 0; i < given_sink.stores.size(); ++i) {
    EXPECT_EQ(given_sink.stores[i].first.block_hashes, hashed_sink.stores[i].first.block_hashes);
    EXPECT_EQ(given_sink.stores[i].second, hashed_sink.stores[i].second);
  }
  // 90 tokens: the 3 given prompt blocks and 2 generated ones, chained from h3.
  ASSERT_FALSE(given_sink.stores.empty());
  EXPECT_EQ(given_sink.stores[0].first.block_hashes, (hashList({h1, h2, h3})));
  EXPECT_TRUE((*given)->pool().table().contains(BlockHash(h3)));
  EXPECT_EQ(now_a, now_b);

  // Their number must match the keys, and a core without a keyed hasher cannot agree with them.
  RequestSpec short_hashes = keyed("b", 50, {1, 2, 3}, 77, 1);
  short_hashes.prompt_blocks->block_hashes = hashList({h1, h2});
  auto wrong = (*given)->validate(short_hashes);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(wrong.message()).find("prompt_blocks.block_hashes"), std::string::npos);
  KeyedSink plain_sink;
  auto own = EngineCore::create(makeConfig(16, 64, 8192), &plain_sink);
  ASSERT_TRUE(own.ok());
  RequestSpec unhashable = keyed("b", 50, {1, 2, 3}, 77, 1);
  unhashable.prompt_blocks->block_hashes = hashList({h1, h2, h3});
  EXPECT_EQ((*own)->validate(unhashable).code(), absl::StatusCode::kFailedPrecondition);
}

// A sink that takes the hashes alone (wantsBlockKeys false) gets its stores without keys.
TEST(TokenFree, SinkWithoutKeysGetsHashesOnly) {
  class HashOnlySink final : public KeyedKvEventSink {
   public:
    bool wantsBlockKeys() const override { return false; }
    void onBlockStored(worker::BlockStored) override { ADD_FAILURE() << "token store"; }
    void onBlockStoredKeys(worker::BlockStored event, std::vector<uint64_t> keys) override {
      EXPECT_TRUE(keys.empty());
      hashes.insert(hashes.end(), event.block_hashes.begin(), event.block_hashes.end());
    }
    void onBlockRemoved(worker::BlockRemoved) override {}
    void onAllBlocksCleared() override {}
    std::vector<BlockHash> hashes;
  };
  EngineConfig config = makeConfig(16, 64, 8192);
  config.scheduler.keyed_hasher = {&toyHash, 7};
  HashOnlySink sink;
  auto core = EngineCore::create(config, &sink);
  ASSERT_TRUE(core.ok());
  Nanos now = 0;
  ASSERT_TRUE((*core)->add(keyed("a", 50, {1, 2, 3}, 77, 1), now).ok());
  while ((*core)->hasWork()) now += (*core)->step(now).duration;
  uint64_t h1 = toyHash(7, 1), h2 = toyHash(h1, 2);
  EXPECT_EQ(sink.hashes, (hashList({h1, h2, toyHash(h2, 3)})));
}

// A driver that finds its requests by tag turns the id copies off: outputs carry the tag only.
TEST(TokenFree, OutputsWithoutIdsCarryTheTag) {
  EngineConfig config = makeConfig(16, 64, 8192);
  config.scheduler.output_ids = false;
  auto core = EngineCore::create(config, nullptr);
  ASSERT_TRUE(core.ok());
  RequestSpec spec = keyed("a", 20, {4}, 55, 3);
  spec.tag = 42;
  ASSERT_TRUE((*core)->add(std::move(spec), 0).ok());
  Nanos now = 0;
  int outputs = 0;
  while ((*core)->hasWork()) {
    StepResult r = (*core)->step(now);
    now += r.duration;
    for (const RequestOutput& out : r.outputs) {
      EXPECT_TRUE(out.id.empty());
      EXPECT_EQ(out.tag, 42u);
      ++outputs;
    }
  }
  EXPECT_EQ(outputs, 3);
}

TEST(TokenFree, GeneratedBlocksAreCachedAndEqualForEqualPrompts) {
  KeyedSink sink;
  auto core = EngineCore::create(makeConfig(16, 64, 8192), &sink);
  ASSERT_TRUE(core.ok()) << core.status();
  Nanos now = 0;
  // 20 prompt tokens + 30 generated: blocks 1 and 2 hold generated tokens.
  ASSERT_TRUE((*core)->add(keyed("a", 20, {4}, 55, 30), now).ok());
  while ((*core)->hasWork()) now += (*core)->step(now).duration;
  std::vector<BlockHash> hashes_a;
  for (const auto& [ev, keys] : sink.stores) {
    hashes_a.insert(hashes_a.end(), ev.block_hashes.begin(), ev.block_hashes.end());
  }
  EXPECT_EQ(hashes_a.size(), 3u);  // 50 tokens in all: 3 full blocks
  // The same prompt again (same seed): its generated blocks are the same blocks, already cached
  // (no new store); a prompt with another seed generates other blocks.
  sink.stores.clear();
  ASSERT_TRUE((*core)->add(keyed("b", 20, {4}, 55, 30), now).ok());
  while ((*core)->hasWork()) now += (*core)->step(now).duration;
  EXPECT_TRUE(sink.stores.empty());
  ASSERT_TRUE((*core)->add(keyed("c", 20, {4}, 56, 30), now).ok());
  while ((*core)->hasWork()) now += (*core)->step(now).duration;
  size_t stored = 0;
  for (const auto& [ev, keys] : sink.stores) stored += ev.block_hashes.size();
  EXPECT_EQ(stored, 2u);  // each generated block as it fills
  ASSERT_FALSE(sink.stores.empty());
  EXPECT_EQ(*sink.stores[0].first.parent_block_hash, hashes_a[0]);
  EXPECT_NE(sink.stores[0].first.block_hashes[0], hashes_a[1]);
}

TEST(TokenFree, MalformedSpecsAreRefused) {
  KeyedSink sink;
  auto core = EngineCore::create(makeConfig(16, 64, 8192), &sink);
  ASSERT_TRUE(core.ok());
  auto wrong_count = (*core)->validate(keyed("a", 50, {1, 2}, 1, 1));
  EXPECT_FALSE(wrong_count.ok());
  EXPECT_NE(std::string(wrong_count.message()).find("prompt_blocks.block_keys"), std::string::npos);
  auto empty = (*core)->validate(keyed("a", 0, {}, 1, 1));
  EXPECT_FALSE(empty.ok());
  RequestSpec both = keyed("a", 16, {1}, 1, 1);
  both.prompt = {1, 2, 3};
  EXPECT_FALSE((*core)->validate(both).ok());
  EXPECT_TRUE((*core)->validate(keyed("a", 16, {1}, 1, 1)).ok());

  // A sink without keys could not map the stores: refused.
  worker::VectorEventSink plain;
  auto plain_core = EngineCore::create(makeConfig(16, 64, 8192), &plain);
  ASSERT_TRUE(plain_core.ok());
  EXPECT_EQ((*plain_core)->validate(keyed("a", 16, {1}, 1, 1)).code(),
            absl::StatusCode::kFailedPrecondition);
  auto no_sink = EngineCore::create(makeConfig(16, 64, 8192), nullptr);
  ASSERT_TRUE(no_sink.ok());
  EXPECT_TRUE((*no_sink)->validate(keyed("a", 16, {1}, 1, 1)).ok());
}

}  // namespace
}  // namespace kvf::engine
