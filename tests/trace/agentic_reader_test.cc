#include "trace/agentic_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/trace/trace_test_util.h"

namespace kvf::trace {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::TempDir;

// Conversation "conv_a": two turns, then a sub-agent with two requests starting at t=5, then a
// third turn. Blocks of 4 tokens; only full blocks are hashed.
const char* kConvA = R"({"id": "conv_a", "block_size": 4, "hash_id_scope": "local",
  "requests": [
    {"t": 0.0, "type": "n", "in": 9, "out": 3, "hash_ids": [1, 2], "think_time": 0.0},
    {"t": 2.5, "type": "n", "in": 13, "out": 2, "hash_ids": [1, 2, 3], "think_time": 1.5},
    {"t": 5.0, "type": "subagent", "agent_id": "agent_001", "requests": [
       {"t": 0.0, "type": "n", "in": 4, "out": 1, "hash_ids": [10]},
       {"t": 1.0, "type": "s", "in": 8, "out": 1, "hash_ids": [10, 11], "think_time": 0.25}]},
    {"t": 7.0, "type": "n", "in": 16, "out": 1, "hash_ids": [1, 2, 3, 4]}
  ]})";
const char* kConvB = R"({"id": "conv_b", "block_size": 4,
  "requests": [{"t": 0.5, "type": "n", "in": 4, "out": 1, "hash_ids": [1]}]})";

TEST(AgenticReader, SessionsSubagentsAndIds) {
  TempDir dir;
  dir.write("trace_0001.json", kConvA);
  dir.write("trace_0002.json", kConvB);
  dir.write("LICENSE", "not json");
  EXPECT_EQ(*detectFormat(dir.path()), TraceFormat::kAgentic);
  ReaderOptions options;
  options.arrivals.kind = ConversationArrivals::Kind::kSequential;
  options.arrivals.gap_s = 100;
  auto requests = readAll(dir.path(), options);
  ASSERT_TRUE(requests.ok()) << requests.status();
  const auto& r = *requests;
  ASSERT_EQ(r.size(), 6u);
  // Sorted by arrival: conv_a 0, 2.5, 5 (sub), 6 (sub), 7; conv_b at 100.5.
  EXPECT_EQ(r[0].session_id, "conv_a");
  EXPECT_EQ(r[0].id, "conv_a#1");
  EXPECT_EQ(r[0].turn, 1);
  EXPECT_EQ(r[0].block_size, 4);
  const HashId base_a = HashId{1} << 40;
  EXPECT_THAT(r[0].hash_ids, ElementsAre(base_a | 1, base_a | 2));
  EXPECT_EQ(r[1].arrival, 2500 * kNanosPerMilli);
  EXPECT_EQ(r[1].parent_id, "conv_a#1");
  EXPECT_EQ(r[1].think_time, 1500 * kNanosPerMilli);
  EXPECT_EQ(r[2].session_id, "conv_a/agent_001");
  EXPECT_EQ(r[2].arrival, 5 * kNanosPerSecond);
  EXPECT_EQ(r[2].turn, 1);
  EXPECT_EQ(r[2].parent_id, "conv_a#2");  // spawned after the second turn
  EXPECT_EQ(r[3].session_id, "conv_a/agent_001");
  EXPECT_EQ(r[3].arrival, 6 * kNanosPerSecond);
  EXPECT_EQ(r[3].turn, 2);
  EXPECT_EQ(r[3].type, "s");
  EXPECT_EQ(r[3].think_time, 250 * kNanosPerMilli);
  EXPECT_EQ(r[4].session_id, "conv_a");
  EXPECT_EQ(r[4].turn, 3);
  EXPECT_EQ(r[4].parent_id, "conv_a#2");
  EXPECT_EQ(r[5].session_id, "conv_b");
  EXPECT_EQ(r[5].arrival, 100500 * kNanosPerMilli);
  // Same local id in another file is another block.
  EXPECT_EQ(r[5].hash_ids[0], (HashId{2} << 40) | 1);
}

TEST(AgenticReader, PoissonArrivalsAreSeeded) {
  TempDir dir;
  dir.write("trace_0001.json", kConvA);
  dir.write("trace_0002.json", kConvB);
  dir.write("trace_0003.json", kConvB);
  auto startsOf = [&](uint64_t seed) {
    ReaderOptions options;
    options.arrivals.rate_per_s = 0.1;
    options.arrivals.seed = seed;
    auto r = readAll(dir.path(), options);
    EXPECT_TRUE(r.ok());
    std::vector<Nanos> starts;
    for (const auto& q : *r) {
      if (q.session_id == "conv_b") starts.push_back(q.arrival);
    }
    return starts;
  };
  auto a = startsOf(7), b = startsOf(7), c = startsOf(8);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_GT(a[0], 0);
}

TEST(AgenticReader, MalformedConversationStopsOrIsSkipped) {
  TempDir dir;
  dir.write("trace_0001.json", kConvB);
  dir.write("trace_0002.json", R"({"id": "x", "block_size": 4, "requests": [
      {"t": 0, "in": 9, "out": 1, "hash_ids": [1]}]})");  // 9 tokens need 2 or 3 ids
  dir.write("trace_0003.json", R"({"id": "y", "block_size": 4, "requests": [{"t": 0)");
  auto stop = readAll(dir.path());
  ASSERT_FALSE(stop.ok());
  EXPECT_THAT(std::string(stop.status().message()),
              HasSubstr("trace_0002.json: field 'requests[0].hash_ids'"));
  ReaderOptions skip;
  skip.on_error = OnError::kSkip;
  auto reader = openTrace(dir.path(), skip);
  ASSERT_TRUE(reader.ok());
  Request r;
  int n = 0;
  while (*(*reader)->next(&r)) ++n;
  EXPECT_EQ(n, 1);
  EXPECT_EQ((*reader)->skipped(), 2);
}

// Times and lengths past what fits in int64_t nanoseconds and tokens are errors naming their
// field, not an overflowing conversion (found by fuzzing the reader).
TEST(AgenticReader, TimesAndLengthsOutOfRangeNameTheirField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"("t": 1e33, "in": 4, "out": 1)", "requests[0].t"},
      {R"("t": 0, "in": 1e30, "out": 1)", "requests[0].in"},
      {R"("t": 0, "in": 4, "out": 1e19)", "requests[0].out"},
      {R"("t": 0, "in": 4, "out": 1, "think_time": 1e300)", "requests[0].think_time"},
      {R"("t": 0, "in": 4, "out": 1, "think_time": -1)", "requests[0].think_time"},
  };
  for (const auto& [fields, field] : cases) {
    TempDir dir;
    dir.write("trace_0001.json", std::string(R"({"id": "x", "block_size": 4, "requests": [{)") +
                                     fields + R"(, "hash_ids": [1]}]})");
    auto all = readAll(dir.path());
    ASSERT_FALSE(all.ok()) << fields;
    EXPECT_THAT(std::string(all.status().message()), HasSubstr(std::string("'") + field + "'"))
        << all.status();
  }
}

// Files are parsed when the merge reaches their conversation's start, not on open: with
// conversations 100 s apart, the first one's requests come out before the broken second file
// is even read.
TEST(AgenticReader, StreamsConversationsLazily) {
  TempDir dir;
  dir.write("trace_0001.json", kConvA);
  dir.write("trace_0002.json", R"({"id": "y", "block_size": 4, "requests": [{"t": 0)");
  ReaderOptions options;
  options.arrivals.kind = ConversationArrivals::Kind::kSequential;
  options.arrivals.gap_s = 100;
  auto reader = openTrace(dir.path(), options);
  ASSERT_TRUE(reader.ok()) << reader.status();
  Request r;
  for (int i = 0; i < 5; ++i) {
    auto more = (*reader)->next(&r);
    ASSERT_TRUE(more.ok()) << "request " << i << ": " << more.status();
    ASSERT_TRUE(*more);
    EXPECT_EQ((*reader)->bytesRead(), static_cast<int64_t>(std::string(kConvA).size()));
  }
  auto broken = (*reader)->next(&r);
  ASSERT_FALSE(broken.ok());
  EXPECT_THAT(std::string(broken.status().message()), HasSubstr("trace_0002.json"));
}

TEST(AgenticReader, ReadsTheAgenticCodingSet) {
  if (std::string why = testing::skipReasonWithout("agentic-coding"); !why.empty()) {
    GTEST_SKIP() << why;
  }
  auto r = readAll(testing::optionalTracesDir() + "/agentic-coding");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->size(), 7643u);  // 7522 top-level + 121 sub-agent requests
  for (size_t i = 1; i < r->size(); ++i) ASSERT_LE((*r)[i - 1].arrival, (*r)[i].arrival);
}

}  // namespace
}  // namespace kvf::trace
