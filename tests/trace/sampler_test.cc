#include "trace/sampler.h"

#include <set>

#include <gtest/gtest.h>

#include "common/strings.h"
#include "tests/trace/trace_test_util.h"

namespace kvf::trace {
namespace {

using testing::TempDir;

// Sessions m0..m9 are multi-turn (3 turns, 100 s apart), s0..s19 single-turn; session i starts
// at 10*i seconds. All share block 1 (a system prompt).
std::string writeTrace(const TempDir& dir) {
  std::vector<Request> all;
  HashId next = 100;
  for (int i = 0; i < 30; ++i) {
    bool multi = i % 3 == 0;
    std::string session = multi ? strCat("m", i / 3) : strCat("s", i);
    std::vector<HashId> ids = {1};
    for (int turn = 0; turn < (multi ? 3 : 1); ++turn) {
      ids.push_back(next++);
      Request r;
      r.arrival = secondsToNanos(10.0 * i + 100.0 * turn);
      r.session_id = session;
      r.turn = turn + 1;
      r.block_size = 4;
      r.hash_ids = ids;
      r.input_length = static_cast<int64_t>(ids.size()) * 4;
      r.output_length = 1;
      all.push_back(r);
    }
  }
  std::sort(all.begin(), all.end(),
            [](const Request& a, const Request& b) { return a.arrival < b.arrival; });
  auto path = dir.path("in.jsonl");
  auto w = SessionWriter::create(path);
  for (const auto& r : all) EXPECT_TRUE((*w)->write(r).ok());
  EXPECT_TRUE((*w)->close().ok());
  return path;
}

std::set<std::string> sessionsOf(const std::string& path) {
  std::set<std::string> out;
  auto r = readAll(path);
  EXPECT_TRUE(r.ok());
  for (const auto& q : *r) out.insert(q.session_id);
  return out;
}

TEST(Sampler, KeepsWholeSessionsStartingInTheWindow) {
  TempDir dir;
  auto in = writeTrace(dir);
  SampleOptions o;
  o.window_start_s = 55;  // sessions 6..11 start in [55, 115)
  o.window_s = 60;
  auto out_path = dir.path("out.jsonl");
  auto w = SessionWriter::create(out_path);
  auto rep = sampleTrace(in, {}, o, {}, w->get());
  ASSERT_TRUE(rep.ok()) << rep.status();
  ASSERT_TRUE((*w)->close().ok());
  EXPECT_EQ(rep->sessions_in_window, 6);
  EXPECT_EQ(rep->sessions_kept, 6);
  EXPECT_EQ(sessionsOf(out_path), (std::set<std::string>{"m2", "s7", "s8", "m3", "s10", "s11"}));
  auto out = *readAll(out_path);
  ASSERT_EQ(out.size(), 4u + 6u);  // m2 and m3 keep all 3 turns, past the window end
  EXPECT_EQ(out.front().arrival, secondsToNanos(5));  // rebased: session 6 starts at 60 s
  EXPECT_EQ(rep->input.requests, 50);
  EXPECT_EQ(rep->window.requests, 10);
  EXPECT_EQ(rep->sample.requests, 10);
  EXPECT_EQ(rep->sample.multi_turn_share, 2.0 / 6.0);
}

TEST(Sampler, CapsSingleTurnShareAndIsSeeded) {
  TempDir dir;
  auto in = writeTrace(dir);
  SampleOptions o;
  o.window_s = 0;  // whole trace: 10 multi-turn, 20 single-turn sessions
  o.max_single_turn_ratio = 0.3;
  auto rep = sampleTrace(in, {}, o, {}, nullptr);
  ASSERT_TRUE(rep.ok());
  // 0.3 * 10 / 0.7 = 4.28 -> 4 single-turn sessions allowed.
  EXPECT_EQ(rep->sessions_kept, 14);
  EXPECT_EQ(rep->sample.sessions, 14);
  EXPECT_NEAR(rep->sample.multi_turn_share, 10.0 / 14.0, 1e-12);

  auto sampled = [&](uint64_t seed) {
    SampleOptions t;
    t.window_s = 0;
    t.sample_ratio = 0.5;
    t.seed = seed;
    auto path = dir.path(strCat("s", seed, ".jsonl"));
    auto w = SessionWriter::create(path);
    EXPECT_TRUE(sampleTrace(in, {}, t, {}, w->get()).ok());
    EXPECT_TRUE((*w)->close().ok());
    return sessionsOf(path);
  };
  auto a = sampled(1), b = sampled(1), c = sampled(2);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_GT(a.size(), 5u);  // about half of 30
  EXPECT_LT(a.size(), 25u);
}

TEST(Sampler, RejectsBadOptions) {
  TempDir dir;
  auto in = writeTrace(dir);
  SampleOptions o;
  o.sample_ratio = 0;
  EXPECT_FALSE(sampleTrace(in, {}, o, {}, nullptr).ok());
  o.sample_ratio = 1;
  o.max_single_turn_ratio = 1.5;
  EXPECT_FALSE(sampleTrace(in, {}, o, {}, nullptr).ok());
}

}  // namespace
}  // namespace kvf::trace
