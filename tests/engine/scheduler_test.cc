#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>
#include <variant>

#include <xxhash.h>

#include "engine/block_hasher.h"
#include "engine/engine_core.h"
#include "tests/engine/engine_test_util.h"

namespace kvf::engine {
namespace {

using testing::makeConfig;
using testing::promptOf;
using testing::spec;

// Mirrors the cache from the event stream, as a router would, and checks it against the pool.
class EventMirror : public worker::KvEventSink {
 public:
  void onBlockStored(worker::BlockStored s) override {
    EXPECT_EQ(s.token_ids.size(), s.block_hashes.size() * s.block_size);
    for (auto h : s.block_hashes) EXPECT_TRUE(cached.insert(h).second) << "stored twice " << h;
    ++stored_events;
  }
  void onBlockRemoved(worker::BlockRemoved r) override {
    for (auto h : r.block_hashes) {
      EXPECT_EQ(cached.erase(h), 1u) << "removed unknown " << h;
      removed.push_back(h);
    }
  }
  void onAllBlocksCleared() override { cached.clear(); }
  void expectMatches(const KvPool& pool) const {
    EXPECT_EQ(cached.size(), pool.table().size());
    for (auto h : cached) EXPECT_TRUE(pool.table().contains(h));
  }
  std::set<BlockHash> cached;
  std::vector<BlockHash> removed;
  int stored_events = 0;
};

struct Finished {
  std::vector<TokenId> tokens;
  RequestOutput last;
};

// Steps until idle; returns each request's tokens and final output. Checks step bookkeeping.
std::map<std::string, Finished> runToCompletion(EngineCore& core, Nanos* now,
                                                int max_steps = 100000) {
  std::map<std::string, Finished> done;
  for (int i = 0; i < max_steps && core.hasWork(); ++i) {
    StepResult r = core.step(*now);
    EXPECT_FALSE(r.empty());
    EXPECT_LE(r.num_scheduled_tokens, core.scheduler().config().max_num_batched_tokens);
    EXPECT_GT(r.duration, 0);
    *now += r.duration;
    for (auto& o : r.outputs) {
      auto& f = done[o.id];
      f.tokens.insert(f.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      f.last = o;
    }
  }
  EXPECT_FALSE(core.hasWork());
  return done;
}

// Leaves `seed` and garbage where the next call's locals will sit: a seeded XXH3 reset on an
// uninitialised stack state that reads this seed skips deriving its secret (it did, under
// ASan, and blocks of equal tokens got different hashes).
__attribute__((noinline)) void dirtyStack(uint64_t seed) {
  // XXH3_state_t is 64-byte aligned with its seed at word 69 and its external-secret pointer
  // at word 71: every 64-byte-aligned place gets seed there and null there.
  alignas(64) uint64_t words[1024];
  for (size_t i = 0; i < 1024; ++i) words[i] = i % 4 == 1 ? seed : i % 4 == 3 ? 0 : ~seed;
  asm volatile("" : : "r"(words) : "memory");  // the stores are kept
}

// hashBlock (streaming over parent then tokens) equals one XXH3 call over the same bytes, also
// right after the stack was filled with the seed.
TEST(BlockHasherTest, StreamingHashIsTheOneShotHashWhateverTheStackHolds) {
  const uint64_t seed = 0x1234567890abcdefULL;
  for (size_t n : {1u, 16u, 48u, 64u, 100u}) {
    std::vector<worker::TokenId> tokens(n);
    for (size_t i = 0; i < n; ++i) tokens[i] = static_cast<worker::TokenId>(i * 7919 + n);
    const uint64_t parent = 0xfeedface00000000ULL + n;
    // Token ids are hashed as 64-bit integers (hashBlock widens them in chunks of 64).
    std::vector<int64_t> wide(tokens.begin(), tokens.end());
    std::vector<unsigned char> bytes(sizeof(parent) + n * sizeof(int64_t));
    std::memcpy(bytes.data(), &parent, sizeof(parent));
    std::memcpy(bytes.data() + sizeof(parent), wide.data(), n * sizeof(int64_t));
    const worker::BlockHash expected(XXH3_64bits_withSeed(bytes.data(), bytes.size(), seed));
    for (int round = 0; round < 4; ++round) {
      dirtyStack(seed);
      EXPECT_EQ(hashBlock(seed, worker::BlockHash(parent), tokens), expected)
          << n << " tokens, round " << round;
    }
  }
}

TEST(SchedulerTest, GeneratesDeterministicTokensUntilMaxTokens) {
  auto core = EngineCore::create(makeConfig(16, 1000, 8192), nullptr);
  ASSERT_TRUE(core.ok());
  auto prompt = promptOf(100, 1);
  ASSERT_TRUE((*core)->add(spec("a", prompt, 5), 0).ok());
  Nanos now = 0;
  auto done = runToCompletion(**core, &now);
  ASSERT_EQ(done["a"].tokens.size(), 5u);
  uint64_t seed = outputSeed(prompt);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(done["a"].tokens[i], generatedToken(seed, i, (*core)->vocabSize()));
  }
  EXPECT_EQ(*done["a"].last.finish, FinishReason::kLength);
  EXPECT_EQ((*core)->pool().numFreeBlocks(), 1000);
}

TEST(SchedulerTest, RepeatedPromptHitsCacheAndPrefillsFasterByModelledAmount) {
  EventMirror mirror;
  auto core = EngineCore::create(makeConfig(16, 1000, 8192), &mirror);
  ASSERT_TRUE(core.ok());
  auto prompt = promptOf(1008, 2);  // exactly 63 blocks
  Nanos now = 0;
  ASSERT_TRUE((*core)->add(spec("a", prompt, 1), now).ok());
  auto first = runToCompletion(**core, &now);
  Nanos ttft_a = first["a"].last.first_token_time - first["a"].last.arrival_time;
  EXPECT_EQ(first["a"].last.cached_tokens, 0);
  EXPECT_EQ(mirror.cached.size(), 63u);

  Nanos arrival = now;
  ASSERT_TRUE((*core)->add(spec("b", prompt, 1), arrival).ok());
  auto second = runToCompletion(**core, &now);
  // Full blocks only, and the last token is never served from cache: floor(1007/16)*16 = 992.
  EXPECT_EQ(second["b"].last.cached_tokens, 992);
  Nanos ttft_b = second["b"].last.first_token_time - arrival;
  const TimingModel& t = (*core)->timing();
  BatchEntry cold{1008, 0}, warm{16, 992};
  EXPECT_EQ(ttft_a, t.stepDuration({&cold, 1}));
  EXPECT_EQ(ttft_b, t.stepDuration({&warm, 1}));
  EXPECT_LT(ttft_b, ttft_a);
  EXPECT_EQ(second["b"].tokens, first["a"].tokens);  // output does not depend on the cache
  auto stats = (*core)->stats();
  EXPECT_EQ(stats.prefix_cache_queries, 2016u);
  EXPECT_EQ(stats.prefix_cache_hits, 992u);
  mirror.expectMatches((*core)->pool());
}

TEST(SchedulerTest, ChunkedPrefillRunsDecodesFirstWithinBudget) {
  auto core = EngineCore::create(makeConfig(16, 1000, 64), nullptr);
  ASSERT_TRUE(core.ok());
  Nanos now = 0;
  ASSERT_TRUE((*core)->add(spec("short", promptOf(10, 3), 20), now).ok());
  StepResult s1 = (*core)->step(now);
  EXPECT_EQ(s1.num_scheduled_tokens, 10);
  now += s1.duration;
  ASSERT_TRUE((*core)->add(spec("long", promptOf(200, 4), 1), now).ok());
  // Every step: the decode (1 token) first, then 63 prefill tokens of the long prompt.
  int long_steps = 0;
  while (true) {
    StepResult s = (*core)->step(now);
    now += s.duration;
    ASSERT_EQ(s.num_decode_requests, 1);
    EXPECT_LE(s.num_scheduled_tokens, 64);
    ++long_steps;
    bool long_done = false;
    for (auto& o : s.outputs) long_done |= o.id == "long" && o.finish.has_value();
    if (long_done) break;
    ASSERT_LT(long_steps, 10);
  }
  EXPECT_EQ(long_steps, 4);  // 63 + 63 + 63 + 11
}

TEST(SchedulerTest, RespectsMaxNumSeqsAndFcfs) {
  auto core = EngineCore::create(makeConfig(16, 1000, 8192, 2), nullptr);
  ASSERT_TRUE(core.ok());
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE((*core)->add(spec("r" + std::to_string(i), promptOf(20, i), 3), 0).ok());
  }
  StepResult s = (*core)->step(0);
  ASSERT_EQ(s.outputs.size(), 2u);
  EXPECT_EQ(s.outputs[0].id, "r0");
  EXPECT_EQ(s.outputs[1].id, "r1");
  EXPECT_EQ((*core)->stats().num_waiting, 2);
}

TEST(SchedulerTest, PreemptionByRecomputeKeepsEveryRequestCorrect) {
  // Reference: a pool large enough that nothing is preempted.
  std::map<std::string, Finished> reference;
  {
    auto core = EngineCore::create(makeConfig(4, 1000, 8192), nullptr);
    ASSERT_TRUE(core.ok());
    for (int i = 0; i < 6; ++i) {
      ASSERT_TRUE((*core)->add(spec("r" + std::to_string(i), promptOf(10 + i, i), 24), 0).ok());
    }
    Nanos now = 0;
    reference = runToCompletion(**core, &now);
    EXPECT_EQ((*core)->stats().num_preemptions, 0u);
  }
  // 24 blocks of 4 tokens: the six requests need up to 10 blocks each, so decodes run out.
  EventMirror mirror;
  auto core = EngineCore::create(makeConfig(4, 24, 8192), &mirror);
  ASSERT_TRUE(core.ok());
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE((*core)->add(spec("r" + std::to_string(i), promptOf(10 + i, i), 24), 0).ok());
  }
  Nanos now = 0;
  auto got = runToCompletion(**core, &now);
  EXPECT_GT((*core)->stats().num_preemptions, 0u);
  ASSERT_EQ(got.size(), reference.size());
  for (auto& [id, f] : reference) {
    EXPECT_EQ(got[id].tokens, f.tokens) << id;
    EXPECT_EQ(*got[id].last.finish, FinishReason::kLength) << id;
  }
  EXPECT_EQ((*core)->pool().numFreeBlocks(), 24);
  mirror.expectMatches((*core)->pool());
}

TEST(SchedulerTest, EvictionEmitsBlockRemovedForExactlyTheEvictedHashes) {
  EventMirror mirror;
  auto core = EngineCore::create(makeConfig(4, 12, 8192), &mirror);
  ASSERT_TRUE(core.ok());
  Nanos now = 0;
  ASSERT_TRUE((*core)->add(spec("a", promptOf(32, 5), 1), now).ok());
  runToCompletion(**core, &now);
  std::set<BlockHash> a_hashes = mirror.cached;
  ASSERT_EQ(a_hashes.size(), 8u);
  EXPECT_TRUE(mirror.removed.empty());
  // b needs 10 blocks: the 4 never-cached blocks go first, then 6 of a's, tail first.
  ASSERT_TRUE((*core)->add(spec("b", promptOf(37, 6), 3), now).ok());
  runToCompletion(**core, &now);
  std::set<BlockHash> removed(mirror.removed.begin(), mirror.removed.end());
  EXPECT_EQ(removed.size(), mirror.removed.size());
  std::set<BlockHash> still;
  for (auto h : a_hashes) {
    if ((*core)->pool().table().contains(h)) still.insert(h);
  }
  // Exactly the a-blocks no longer in the pool were reported removed.
  std::set<BlockHash> gone;
  for (auto h : a_hashes) {
    if (!still.contains(h)) gone.insert(h);
  }
  EXPECT_EQ(removed, gone);
  EXPECT_FALSE(gone.empty());
  mirror.expectMatches((*core)->pool());
}

TEST(SchedulerTest, ValidationNamesTheField) {
  auto core = EngineCore::create(makeConfig(16, 1000, 8192), nullptr);
  ASSERT_TRUE(core.ok());
  auto bad_token = spec("x", {1, 2, 99999999}, 1);
  auto st = (*core)->validate(bad_token);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("prompt[2]"), std::string::npos);
  auto too_long = spec("y", promptOf(10, 1), (*core)->maxModelLen());
  EXPECT_NE(std::string((*core)->validate(too_long).message()).find("max_tokens"),
            std::string::npos);
  EXPECT_FALSE((*core)->validate(spec("z", {}, 1)).ok());
  // Larger than the whole KV cache: rejected instead of waiting forever.
  EXPECT_FALSE((*core)->add(spec("w", promptOf(16001, 1), 1), 0).ok());
}

}  // namespace
}  // namespace kvf::engine
