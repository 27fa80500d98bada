#include "trace/token_synth.h"

#include <algorithm>
#include <random>

#include <gtest/gtest.h>

namespace kvf::trace {
namespace {

TokenSynthesizer synth(TokenSynthOptions o = {}) {
  auto s = TokenSynthesizer::create(o);
  EXPECT_TRUE(s.ok());
  return *s;
}

Request request(std::vector<HashId> ids, int64_t input_length, int32_t block_size) {
  Request r;
  r.hash_ids = std::move(ids);
  r.input_length = input_length;
  r.block_size = block_size;
  return r;
}

// Number of leading full engine blocks of `block` tokens that are equal in both prompts: what a
// prefix cache with chained block hashes would share.
int64_t sharedEngineBlocks(const std::vector<int32_t>& a, const std::vector<int32_t>& b,
                           int64_t block) {
  int64_t n = static_cast<int64_t>(std::min(a.size(), b.size())) / block;
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t p = j * block; p < (j + 1) * block; ++p) {
      if (a[static_cast<size_t>(p)] != b[static_cast<size_t>(p)]) return j;
    }
  }
  return n;
}

TEST(TokenSynth, RejectsBadRanges) {
  EXPECT_FALSE(TokenSynthesizer::create({.vocab_min = -1, .vocab_max = 10}).ok());
  EXPECT_FALSE(TokenSynthesizer::create({.vocab_min = 10, .vocab_max = 11}).ok());
  EXPECT_TRUE(TokenSynthesizer::create({.vocab_min = 10, .vocab_max = 12}).ok());
}

TEST(TokenSynth, PinnedValuesKeepReplaysReproducible) {
  // Changing the function silently would make old replay results incomparable.
  TokenSynthesizer s = synth();
  EXPECT_EQ(s.blockToken(0, 512, 0), s.blockToken(0, 512, 0));
  std::vector<int32_t> got = {s.blockToken(0, 512, 0), s.blockToken(0, 512, 1),
                              s.blockToken(1, 512, 0), s.blockToken(12345, 64, 63),
                              s.blockToken(~HashId{0}, 16, 15)};
  std::vector<int32_t> pinned = {3754, 24717, 18110, 27268, 10518};
  EXPECT_EQ(got, pinned);
}

// Block keys are pinned too (the simulator's cache behaviour and results follow from them): a
// digest of every key and the prompt key, for engine blocks that tile the trace blocks (with and
// without a partial last trace block and an unhashed tail) and blocks that do not.
TEST(TokenSynth, PinnedBlockKeysKeepSimulationsReproducible) {
  TokenSynthesizer s = synth();
  struct Case {
    Request r;
    int64_t bs;
    uint64_t pinned;
  };
  std::vector<Case> cases = {
      {request({1, 2, 3}, 1100, 512), 16, 0x7499b260c83e0389ULL},
      {request({1, 2, 3}, 1536, 512), 16, 0xc3180ab6c1408905ULL},
      {request({1, 2}, 1300, 512), 16, 0xfa2a005038f3d02fULL},
      {request({1, 2, 3}, 1100, 512), 48, 0xaca0964462e7c3d9ULL},
      {request({10, 11, 12, 13}, 250, 64), 16, 0x3f325db47ea5c6efULL},
      {request({1, 2, 3}, 1536, 512), 512, 0x1613694de424e5cbULL},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    std::vector<uint64_t> keys;
    uint64_t digest = s.appendBlockKeys(cases[i].r, i, cases[i].bs, &keys);
    for (uint64_t k : keys) digest = digest * 0x100000001B3ULL ^ k;
    EXPECT_EQ(digest, cases[i].pinned) << "case " << i;
  }
}

TEST(TokenSynth, TokensStayInTheVocabularyRange) {
  for (auto range : {std::pair{1000, 32000}, std::pair{5, 7}, std::pair{100000, 151000}}) {
    TokenSynthesizer s = synth({.vocab_min = range.first, .vocab_max = range.second});
    auto prompt = s.prompt(request({1, 2, 3, 4}, 2000, 512), 9);
    ASSERT_EQ(prompt.size(), 2000u);
    std::vector<int> hist(static_cast<size_t>(range.second - range.first), 0);
    for (int32_t t : prompt) {
      ASSERT_GE(t, range.first);
      ASSERT_LT(t, range.second);
      ++hist[static_cast<size_t>(t - range.first)];
    }
    if (range.second - range.first == 2) {
      EXPECT_GT(hist[0], 800);  // both ids used, roughly evenly
      EXPECT_GT(hist[1], 800);
    }
  }
}

TEST(TokenSynth, PartialBlockIsPrefixOfTheFullBlock) {
  TokenSynthesizer s = synth();
  auto full = s.prompt(request({7, 8}, 1024, 512), 1);
  auto partial = s.prompt(request({7, 8}, 600, 512), 2);
  ASSERT_EQ(partial.size(), 600u);
  EXPECT_TRUE(std::equal(partial.begin(), partial.end(), full.begin()));
  for (int32_t p = 0; p < 512; ++p)
    EXPECT_EQ(full[512 + static_cast<size_t>(p)], s.blockToken(8, 512, p));
}

TEST(TokenSynth, SaltChangesEverythingAndIsDeterministic) {
  TokenSynthesizer a = synth({.salt = 1}), a2 = synth({.salt = 1}), b = synth({.salt = 2});
  auto r = request({1, 2}, 1024, 512);
  EXPECT_EQ(a.prompt(r, 0), a2.prompt(r, 0));
  EXPECT_EQ(sharedEngineBlocks(a.prompt(r, 0), b.prompt(r, 0), 16), 0);
}

TEST(TokenSynth, UnhashedTailIsUniquePerRequest) {
  // 64-token blocks hashing only full blocks: 150 tokens = 2 hashed blocks + 22 tail tokens.
  TokenSynthesizer s = synth();
  auto a = s.prompt(request({1, 2}, 150, 64), 10);
  auto b = s.prompt(request({1, 2}, 150, 64), 11);
  auto a_again = s.prompt(request({1, 2}, 150, 64), 10);
  EXPECT_EQ(a, a_again);
  EXPECT_EQ(sharedEngineBlocks(a, b, 16), 8);  // exactly the 128 hashed tokens
  EXPECT_EQ(sharedEngineBlocks(a, b, 2), 64);
}

// The property the replayer relies on: for random request pairs with a common hash-id prefix,
// an engine with block size E shares exactly floor(shared_tokens / E) leading blocks, where
// shared_tokens is what the trace guarantees equal. E divides or does not divide the trace
// block size, or exceeds it.
TEST(TokenSynth, EngineSharesExactlyTheTracePrefixForAnyEngineBlockSize) {
  TokenSynthesizer s = synth();
  std::mt19937_64 rng(20261122);
  const int64_t engine_blocks[] = {2, 7, 16, 48, 64, 100, 128, 256, 333, 512, 1000, 1536};
  HashId next_id = 1;
  int64_t checks = 0;
  for (int32_t bs : {16, 64, 512}) {
    for (int trial = 0; trial < 400; ++trial) {
      const bool floor_hashed = trial % 2 == 1;  // agentic-style: only full blocks hashed
      auto make = [&](std::vector<HashId> ids, int64_t extra_blocks) {
        for (int64_t i = 0; i < extra_blocks; ++i) ids.push_back(next_id++);
        auto n = static_cast<int64_t>(ids.size());
        int64_t len =
            n == 0 ? 0 : (n - 1) * bs + 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(bs));
        if (floor_hashed) len = n * bs + static_cast<int64_t>(rng() % static_cast<uint64_t>(bs));
        return request(std::move(ids), len, bs);
      };
      std::vector<HashId> common;
      auto k = static_cast<int64_t>(rng() % 12);
      for (int64_t i = 0; i < k; ++i) common.push_back(next_id++);
      Request a = make(common, static_cast<int64_t>(rng() % 4));
      Request b = make(common, static_cast<int64_t>(rng() % 4));
      auto na = static_cast<int64_t>(a.hash_ids.size()),
           nb = static_cast<int64_t>(b.hash_ids.size());
      int64_t covered_a = std::min(a.input_length, na * bs);
      int64_t covered_b = std::min(b.input_length, nb * bs);
      int64_t shared = (k < na && k < nb) ? k * bs : std::min(covered_a, covered_b);
      auto pa = s.prompt(a, 2 * static_cast<uint64_t>(trial));
      auto pb = s.prompt(b, 2 * static_cast<uint64_t>(trial) + 1);
      ASSERT_EQ(static_cast<int64_t>(pa.size()), a.input_length);
      for (int64_t e : engine_blocks) {
        ASSERT_EQ(sharedEngineBlocks(pa, pb, e), shared / e)
            << "trace block " << bs << ", engine block " << e << ", common ids " << k
            << ", lengths " << a.input_length << "/" << b.input_length;
        ++checks;
      }
    }
  }
  EXPECT_EQ(checks, 3 * 400 * 12);
}

// Token-free keys stand for the tokens: for every pair of engine blocks of several prompts
// (shared prefixes, partial last trace blocks, unhashed tails, engine blocks that do and do not
// divide the trace block), keys are equal exactly when the tokens are.
TEST(TokenSynth, BlockKeysAreEqualExactlyWhereTokensAre) {
  TokenSynthesizer s = synth();
  std::vector<Request> reqs = {
      request({1, 2, 3}, 1100, 512),       // partial last trace block
      request({1, 2, 3}, 1536, 512),       // the same ids, full
      request({1, 2}, 1300, 512),          // floor format: an unhashed tail
      request({1, 2, 4}, 1500, 512),       // diverges at block 2
      request({7, 2, 3}, 1536, 512),       // another first block
      request({1, 2}, 1300, 512),          // the same as [2] but another tail (unique key)
      request({10, 11, 12, 13}, 250, 64),  // small trace blocks
  };
  for (int64_t bs : {16, 48, 64, 512, 1024}) {
    std::vector<std::vector<int32_t>> tokens;
    std::vector<std::vector<uint64_t>> keys;
    std::vector<uint64_t> seeds;
    for (size_t i = 0; i < reqs.size(); ++i) {
      tokens.push_back(s.prompt(reqs[i], i));
      keys.emplace_back();
      seeds.push_back(s.appendBlockKeys(reqs[i], i, bs, &keys.back()));
      ASSERT_EQ(static_cast<int64_t>(keys.back().size()), reqs[i].input_length / bs);
    }
    for (size_t a = 0; a < reqs.size(); ++a) {
      for (size_t b = 0; b < reqs.size(); ++b) {
        for (size_t i = 0; i < keys[a].size(); ++i) {
          for (size_t j = 0; j < keys[b].size(); ++j) {
            bool same_tokens =
                std::equal(tokens[a].begin() + i * bs, tokens[a].begin() + (i + 1) * bs,
                           tokens[b].begin() + j * bs);
            EXPECT_EQ(keys[a][i] == keys[b][j], same_tokens)
                << "bs " << bs << " prompt " << a << " block " << i << " vs " << b << " " << j;
          }
        }
        EXPECT_EQ(seeds[a] == seeds[b], tokens[a] == tokens[b]) << a << " " << b;
      }
    }
  }
  // Shared leading blocks: prompts 0 and 1 share 1100 / 16 full blocks at 16 tokens.
  std::vector<uint64_t> k0, k1;
  s.appendBlockKeys(reqs[0], 0, 16, &k0);
  s.appendBlockKeys(reqs[1], 1, 16, &k1);
  EXPECT_TRUE(std::equal(k0.begin(), k0.end(), k1.begin()));
}

}  // namespace
}  // namespace kvf::trace
