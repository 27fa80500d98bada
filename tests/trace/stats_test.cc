#include "trace/stats.h"

#include <random>

#include <gtest/gtest.h>

#include "common/strings.h"

#include "tests/trace/trace_test_util.h"

namespace kvf::trace {
namespace {

Request req(double t_s, const std::string& session, int64_t in, int64_t out,
            std::vector<HashId> ids, int32_t bs = 4) {
  Request r;
  r.arrival = secondsToNanos(t_s);
  r.session_id = session;
  r.input_length = in;
  r.output_length = out;
  r.block_size = bs;
  r.hash_ids = std::move(ids);
  return r;
}

TraceStats statsOf(const std::vector<Request>& requests, StatsOptions options = {}) {
  auto acc = StatsAccumulator::create(std::move(options));
  EXPECT_TRUE(acc.ok());
  for (const auto& r : requests) acc->add(r);
  return acc->finish();
}

// Worked by hand in docs/traces.md ("A worked example").
TEST(Stats, HandCheckedSessionTrace) {
  std::vector<Request> t = {
      req(0, "A", 8, 2, {1, 2}),
      req(1, "A", 12, 2, {1, 2, 3}),  // hits 1,2: 8 tokens, intra (A stored them)
      req(2, "B", 6, 4, {1, 4}),      // hits 1: 4 tokens, cross; last block partial (2 tokens)
      req(3, "B", 10, 0, {1, 6, 7}),  // hits 1: 4 tokens, cross
  };
  StatsOptions options;
  options.round_robin_instances = {2};
  options.sticky_instances = {2};
  options.qps_window_s = 2;
  TraceStats s = statsOf(t, options);
  EXPECT_EQ(s.requests, 4);
  EXPECT_TRUE(s.has_sessions);
  EXPECT_EQ(s.sessions, 2);
  EXPECT_DOUBLE_EQ(s.multi_turn_share, 1.0);
  EXPECT_DOUBLE_EQ(s.turns_per_session, 2.0);
  EXPECT_DOUBLE_EQ(s.span_s, 3.0);
  EXPECT_DOUBLE_EQ(s.mean_qps, 4.0 / 3.0);
  EXPECT_DOUBLE_EQ(s.peak_qps, 1.0);  // windows [0,2) and [2,4) hold 2 each
  EXPECT_DOUBLE_EQ(s.input.mean, 9.0);
  EXPECT_EQ(s.input.p50, 8);
  EXPECT_EQ(s.input.p90, 12);
  EXPECT_EQ(s.input.max, 12);
  EXPECT_DOUBLE_EQ(s.output.mean, 2.0);
  EXPECT_EQ(s.input_tokens, 36);
  EXPECT_EQ(s.output_tokens, 8);
  EXPECT_DOUBLE_EQ(s.io_ratio, 4.5);
  EXPECT_DOUBLE_EQ(s.prefill_token_share, 36.0 / 44.0);
  EXPECT_EQ(s.total_blocks, 10);
  EXPECT_EQ(s.unique_blocks, 6);
  EXPECT_DOUBLE_EQ(s.hit_all.block, 4.0 / 10.0);
  EXPECT_DOUBLE_EQ(s.hit_all.token, 16.0 / 36.0);
  EXPECT_DOUBLE_EQ(s.hit_last_half.block, 2.0 / 5.0);
  EXPECT_DOUBLE_EQ(s.hit_last_half.token, 8.0 / 16.0);
  EXPECT_DOUBLE_EQ(s.intra_session_reuse, 0.5);
  EXPECT_DOUBLE_EQ(s.cross_session_reuse, 0.5);
  EXPECT_DOUBLE_EQ(s.blocks_shared_across_sessions, 1.0 / 6.0);
  EXPECT_DOUBLE_EQ(s.block_occurrences_shared_across_sessions, 4.0 / 10.0);  // block 1, 4 times
  ASSERT_EQ(s.round_robin.size(), 1u);
  // Requests 0,2 go to instance 0 and 1,3 to instance 1: r2 hits {1} on 0, r3 hits {1} on 1.
  EXPECT_DOUBLE_EQ(s.round_robin[0].hit.block, 2.0 / 10.0);
  EXPECT_DOUBLE_EQ(s.round_robin[0].hit.token, 8.0 / 36.0);
  // Session-sticky x2: A on instance 0, B on instance 1: r1 hits {1,2}, r3 hits {1}.
  ASSERT_EQ(s.session_sticky.size(), 1u);
  EXPECT_DOUBLE_EQ(s.session_sticky[0].hit.block, 3.0 / 10.0);
  EXPECT_DOUBLE_EQ(s.session_sticky[0].hit.token, 12.0 / 36.0);
}

TEST(Stats, ResultsDoNotDependOnHowIdsAreNumbered) {
  // Small dense ids use a table, large sparse ids a hash map; mixing both must not matter.
  std::mt19937_64 rng(5);
  std::vector<Request> dense, sparse;
  for (int i = 0; i < 3000; ++i) {
    std::vector<HashId> ids;
    auto n = 1 + rng() % 20;
    HashId root = rng() % 50;
    for (uint64_t b = 0; b < n; ++b) ids.push_back(root * 1000 + (b < 3 ? b : rng() % 2000));
    std::string session = strCat("s", rng() % 300);
    dense.push_back(req(i, session, static_cast<int64_t>(n) * 4, 1, ids));
    for (auto& id : ids) id = id % 3 == 0 ? id : (HashId{1} << 45) + id * 7919;
    sparse.push_back(req(i, session, static_cast<int64_t>(n) * 4, 1, ids));
  }
  TraceStats a = statsOf(dense), b = statsOf(sparse);
  EXPECT_EQ(a.unique_blocks, b.unique_blocks);
  EXPECT_GT(a.hit_all.block, 0.1);
  EXPECT_DOUBLE_EQ(a.hit_all.block, b.hit_all.block);
  EXPECT_DOUBLE_EQ(a.hit_all.token, b.hit_all.token);
  EXPECT_DOUBLE_EQ(a.intra_session_reuse, b.intra_session_reuse);
  EXPECT_DOUBLE_EQ(a.blocks_shared_across_sessions, b.blocks_shared_across_sessions);
  EXPECT_DOUBLE_EQ(a.block_occurrences_shared_across_sessions,
                   b.block_occurrences_shared_across_sessions);
  for (size_t k = 0; k < a.round_robin.size(); ++k) {
    EXPECT_DOUBLE_EQ(a.round_robin[k].hit.block, b.round_robin[k].hit.block);
  }
  ASSERT_EQ(a.session_sticky.size(), 1u);
  EXPECT_DOUBLE_EQ(a.session_sticky[0].hit.block, b.session_sticky[0].hit.block);
}

TEST(Stats, PrefixMatchStopsAtFirstMiss) {
  // Block 3 was seen, but after a miss at block 1 it cannot count (prefix caching).
  std::vector<Request> t = {req(0, "", 12, 1, {1, 2, 3}), req(1, "", 12, 1, {1, 9, 3})};
  TraceStats s = statsOf(t);
  EXPECT_FALSE(s.has_sessions);
  EXPECT_DOUBLE_EQ(s.hit_all.block, 1.0 / 6.0);
  // With one instance per request parity, round-robin x2 never hits.
  EXPECT_DOUBLE_EQ(s.round_robin[0].hit.block, 0.0);
  // x1 behaves like the single cache.
  StatsOptions one;
  one.round_robin_instances = {1};
  EXPECT_DOUBLE_EQ(statsOf(t, one).round_robin[0].hit.block, 1.0 / 6.0);
}

TEST(Stats, ChainIdsForPerBlockHashes) {
  // Per-block content hashes: block 7 after prefix 1 differs from block 7 after prefix 2.
  std::vector<Request> t = {req(0, "", 8, 1, {1, 7}), req(1, "", 8, 1, {2, 7}),
                            req(2, "", 8, 1, {1, 7})};
  StatsOptions chained;
  chained.chain_ids = true;
  TraceStats plain = statsOf(t), with_chain = statsOf(t, chained);
  EXPECT_EQ(plain.unique_blocks, 3);
  EXPECT_EQ(with_chain.unique_blocks, 4);                 // (1), (1,7), (2), (2,7)
  EXPECT_DOUBLE_EQ(with_chain.hit_all.block, 2.0 / 6.0);  // only the third request hits
  EXPECT_DOUBLE_EQ(plain.hit_all.block, 2.0 / 6.0);       // a miss at block 0 stops the match
  // Where plain ids would wrongly hit: the same id after a prefix that was also seen.
  std::vector<Request> u = {req(0, "", 8, 1, {1, 7}), req(1, "", 8, 1, {2, 9}),
                            req(2, "", 8, 1, {2, 7})};
  EXPECT_DOUBLE_EQ(statsOf(u).hit_all.block, 2.0 / 6.0);  // r2 hits 2 and 7
  EXPECT_DOUBLE_EQ(statsOf(u, chained).hit_all.block, 1.0 / 6.0);
}

TEST(Stats, UnhashedTailTokensNeverHit) {
  // 64-token blocks, floor hashing: 100 tokens -> 1 hashed block + 36 unhashed tokens.
  std::vector<Request> t = {req(0, "s", 100, 1, {7}, 64), req(1, "s", 100, 1, {7}, 64)};
  TraceStats s = statsOf(t);
  EXPECT_DOUBLE_EQ(s.hit_all.block, 0.5);
  EXPECT_DOUBLE_EQ(s.hit_all.token, 64.0 / 200.0);
}

TEST(Stats, CountsOutOfOrderArrivals) {
  std::vector<Request> t = {req(5, "", 4, 1, {1}), req(3, "", 4, 1, {2}), req(6, "", 4, 1, {3})};
  TraceStats s = statsOf(t);
  EXPECT_EQ(s.out_of_order, 1);
  EXPECT_DOUBLE_EQ(s.span_s, 3.0);
}

TEST(Stats, RejectsTooManyInstances) {
  StatsOptions options;
  options.round_robin_instances = {32, 33};
  EXPECT_FALSE(StatsAccumulator::create(options).ok());
  options.round_robin_instances = {32, 32};  // plus the default sticky 8
  EXPECT_FALSE(StatsAccumulator::create(options).ok());
  options.sticky_instances = {};
  EXPECT_TRUE(StatsAccumulator::create(options).ok());
  options.round_robin_instances = {0};
  EXPECT_FALSE(StatsAccumulator::create(options).ok());
}

// The published figures: Mooncake FAST'25 Table 2 and NVIDIA Dynamo's 36.64%.
TEST(Stats, MooncakeBundledTracesMatchPublishedFigures) {
  auto conv = openTrace(testing::repoTracesDir() + "/mooncake/conversation_trace.jsonl");
  ASSERT_TRUE(conv.ok());
  auto s = computeStats(**conv, {});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->requests, 12031);
  EXPECT_EQ(std::llround(s->input.mean), 12035);
  EXPECT_EQ(std::llround(s->output.mean), 343);
  EXPECT_EQ(std::llround(s->hit_all.block * 10000), 3664);  // 36.64%
  EXPECT_EQ(s->out_of_order, 0);

  auto syn = openTrace(testing::repoTracesDir() + "/mooncake/synthetic_trace.jsonl");
  ASSERT_TRUE(syn.ok());
  auto t = computeStats(**syn, {});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->requests, 3993);
  EXPECT_EQ(std::llround(t->input.mean), 15325);
  EXPECT_EQ(std::llround(t->output.mean), 149);
}

}  // namespace
}  // namespace kvf::trace
