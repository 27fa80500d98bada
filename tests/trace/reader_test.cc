#include "trace/reader.h"

#include <algorithm>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/trace/trace_test_util.h"
#include "trace/writer.h"

namespace kvf::trace {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::TempDir;

std::vector<Request> mustRead(const std::string& path, ReaderOptions options = {}) {
  auto requests = readAll(path, options);
  EXPECT_TRUE(requests.ok()) << requests.status();
  return requests.ok() ? *requests : std::vector<Request>{};
}

TEST(MooncakeReader, ParsesFieldsAndDefaults) {
  TempDir dir;
  auto path = dir.write("m.jsonl",
                        "{\"timestamp\": 1500, \"input_length\": 1025, \"output_length\": 7, "
                        "\"hash_ids\": [0, 1, 2]}\n\n"
                        "{\"hash_ids\":[0,9],\"output_length\":0,\"input_length\":600,"
                        "\"timestamp\":2000}\r\n");
  EXPECT_EQ(*detectFormat(path), TraceFormat::kMooncake);
  auto r = mustRead(path);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].arrival, 1500 * kNanosPerMilli);
  EXPECT_EQ(r[0].input_length, 1025);
  EXPECT_EQ(r[0].output_length, 7);
  EXPECT_EQ(r[0].block_size, 512);
  EXPECT_THAT(r[0].hash_ids, ElementsAre(0, 1, 2));
  EXPECT_EQ(r[0].blockTokens(2), 1);
  EXPECT_FALSE(r[0].hasSession());
  EXPECT_EQ(r[0].turn, 0);
  EXPECT_EQ(r[0].think_time, -1);
  EXPECT_EQ(r[1].arrival, 2000 * kNanosPerMilli);
  EXPECT_THAT(r[1].hash_ids, ElementsAre(0, 9));
}

TEST(SessionFormat, RoundTripsEveryField) {
  Request a;
  a.arrival = 1234567891;  // 1234.567891 ms
  a.input_length = 130;
  a.output_length = 17;
  a.block_size = 64;
  a.hash_ids = {5, 6, 18446744073709551615ULL};
  a.id = "req \"1\"\n\\";
  a.session_id = "sess/ü";
  a.turn = 3;
  a.parent_id = "req 0";
  a.think_time = 2500000;  // 2.5 ms
  a.type = "tool_result";
  Request b;  // only the required fields
  b.arrival = 0;
  b.input_length = 0;
  b.output_length = 0;
  b.block_size = 16;
  TempDir dir;
  auto path = dir.path("s.jsonl");
  {
    auto w = SessionWriter::create(path);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->write(a).ok());
    ASSERT_TRUE((*w)->write(b).ok());
    ASSERT_TRUE((*w)->close().ok());
  }
  EXPECT_EQ(*detectFormat(path), TraceFormat::kSession);
  auto r = mustRead(path);
  ASSERT_EQ(r.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const Request& want = i == 0 ? a : b;
    const Request& got = r[static_cast<size_t>(i)];
    EXPECT_EQ(got.arrival, want.arrival);
    EXPECT_EQ(got.input_length, want.input_length);
    EXPECT_EQ(got.output_length, want.output_length);
    EXPECT_EQ(got.block_size, want.block_size);
    EXPECT_EQ(got.hash_ids, want.hash_ids);
    EXPECT_EQ(got.id, want.id);
    EXPECT_EQ(got.session_id, want.session_id);
    EXPECT_EQ(got.turn, want.turn);
    EXPECT_EQ(got.parent_id, want.parent_id);
    EXPECT_EQ(got.think_time, want.think_time);
    EXPECT_EQ(got.type, want.type);
  }
}

TEST(SessionFormat, AcceptsIntegerIdsAndUnknownFields) {
  TempDir dir;
  auto path =
      dir.write("s.jsonl",
                "{\"timestamp\": 1.5, \"input_length\": 32, \"output_length\": 1, "
                "\"block_size\": 16, \"session_id\": 77, \"id\": 3, \"extra\": {\"a\": "
                "[1, {\"b\": null}], \"c\": \"x,}\"}, \"flag\": true, \"hash_ids\": [1, 2]}\n");
  auto r = mustRead(path);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].arrival, 1500000);
  EXPECT_EQ(r[0].session_id, "77");
  EXPECT_EQ(r[0].id, "3");
}

TEST(BailianReader, BuildsSessionsFromParentChains) {
  TempDir dir;
  auto path = dir.write(
      "b.jsonl",
      "{\"chat_id\": 10, \"parent_chat_id\": -1, \"timestamp\": 0.5, \"input_length\": 40, "
      "\"output_length\": 5, \"type\": \"text\", \"turn\": 1, \"hash_ids\": [1, 2, 3]}\n"
      "{\"chat_id\": 11, \"parent_chat_id\": 10, \"timestamp\": 61.114, \"input_length\": 64, "
      "\"output_length\": 6, \"type\": \"search\", \"turn\": 2, \"hash_ids\": [1, 2, 3, 4]}\n"
      "{\"chat_id\": 12, \"parent_chat_id\": 11, \"timestamp\": 62, \"input_length\": 65, "
      "\"output_length\": 6, \"type\": \"text\", \"turn\": 3, \"hash_ids\": [1, 2, 3, 4, 5]}\n"
      "{\"chat_id\": 20, \"parent_chat_id\": 7, \"timestamp\": 63, \"input_length\": 16, "
      "\"output_length\": 1, \"type\": \"file\", \"turn\": 4, \"hash_ids\": [9]}\n");
  EXPECT_EQ(*detectFormat(path), TraceFormat::kBailian);
  auto r = mustRead(path);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].block_size, 16);
  EXPECT_EQ(r[0].arrival, 500 * kNanosPerMilli);
  EXPECT_EQ(r[1].arrival, 61114 * kNanosPerMilli);
  EXPECT_EQ(r[0].session_id, "10");
  EXPECT_EQ(r[1].session_id, "10");
  EXPECT_EQ(r[2].session_id, "10");
  EXPECT_EQ(r[2].parent_id, "11");
  EXPECT_EQ(r[2].id, "12");
  EXPECT_EQ(r[2].turn, 3);
  EXPECT_EQ(r[1].type, "search");
  // The parent (7) is not in the file: the chat roots its own session.
  EXPECT_EQ(r[3].session_id, "20");
  EXPECT_EQ(r[3].parent_id, "7");
}

TEST(BailianReader, MissingChatIdIsReported) {
  TempDir dir;
  auto path =
      dir.write("b.jsonl",
                "{\"parent_chat_id\": -1, \"timestamp\": 0.5, \"input_length\": 16, "
                "\"output_length\": 5, \"type\": \"text\", \"turn\": 1, \"hash_ids\": [1]}\n");
  auto r = readAll(path, {.format = TraceFormat::kBailian});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(":1: field 'chat_id': missing"));
}

TEST(MooncakeReader, BlockSizeOverrideIsChecked) {
  TempDir dir;
  auto path = dir.write("m.jsonl",
                        "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 1, "
                        "\"hash_ids\": [1, 2, 3]}\n");
  ReaderOptions o;
  o.block_size = 256;  // 600 tokens = 3 blocks of 256 (last partial)
  auto r = readAll(path, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].block_size, 256);
  EXPECT_FALSE(readAll(path).ok());  // with Mooncake's 512, 3 ids do not fit 600 tokens
}

struct BadLine {
  std::string line;
  std::string field;
  std::string message;
};

TEST(JsonlReader, ReportsFileLineAndFieldThenStopsOrSkips) {
  const std::string good =
      "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}";
  const std::vector<BadLine> bad = {
      {"{\"timestamp\": 0, \"output_length\": 1, \"hash_ids\": [1]}", "input_length", "missing"},
      {"{\"timestamp\": 0, \"input_length\": \"10\", \"output_length\": 1, \"hash_ids\": [1]}",
       "input_length", "expected a number"},
      {"{\"timestamp\": 0, \"input_length\": 10.5, \"output_length\": 1, \"hash_ids\": [1]}",
       "input_length", "integer"},
      {"{\"timestamp\": 0, \"input_length\": 10, \"output_length\": -1, \"hash_ids\": [1]}",
       "output_length", "negative"},
      {"{\"timestamp\": 0, \"input_length\": 1100, \"output_length\": 1, \"hash_ids\": [1]}",
       "hash_ids", "needs 2 or 3"},
      {"{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1, -2]}",
       "hash_ids", "negative"},
      {"{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1,]}",
       "hash_ids", "non-negative integer"},
      {"{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]",
       "hash_ids", "expected ',' or '}'"},
      {"{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]} x", "",
       "unexpected text"},
      {"[1, 2]", "", "expected a JSON object"},
      {"{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"type\": \"a\tb\", "
       "\"hash_ids\": [1]}",
       "type", "control character"},
      {"{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"type\": \"a\\qb\", "
       "\"hash_ids\": [1]}",
       "type", "bad escape"},
      {"{\"timestamp\": 99999999999999999999, \"input_length\": 10, \"output_length\": 1, "
       "\"hash_ids\": [1]}",
       "timestamp", "out of range"},
      {"{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"block_size\": 0, "
       "\"hash_ids\": [1]}",
       "block_size", "must be in"},
  };
  for (const auto& b : bad) {
    SCOPED_TRACE(b.line);
    TempDir dir;
    auto path = dir.write("bad.jsonl", good + "\n" + b.line + "\n" + good + "\n");
    ReaderOptions stop;
    stop.format = TraceFormat::kMooncake;
    auto result = readAll(path, stop);
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    std::string msg(result.status().message());
    EXPECT_THAT(msg, HasSubstr(path + ":2: "));
    if (!b.field.empty()) {
      EXPECT_THAT(msg, HasSubstr("field '" + b.field + "'"));
    }
    EXPECT_THAT(msg, HasSubstr(b.message));

    ReaderOptions skip = stop;
    skip.on_error = OnError::kSkip;
    auto reader = openTrace(path, skip);
    ASSERT_TRUE(reader.ok());
    Request r;
    int n = 0;
    while (*(*reader)->next(&r)) ++n;
    EXPECT_EQ(n, 2);
    EXPECT_EQ((*reader)->skipped(), 1);
    ASSERT_EQ((*reader)->problems().size(), 1u);
    EXPECT_EQ((*reader)->problems()[0].line, 2);
    EXPECT_EQ((*reader)->problems()[0].field, b.field);
  }
}

TEST(JsonlReader, BoundsLineLength) {
  TempDir dir;
  std::string ids;
  for (int i = 0; i < 5000; ++i) ids += std::to_string(i) + ",";
  ids += "5000";
  auto path = dir.write("long.jsonl",
                        "{\"timestamp\": 0, \"input_length\": 10, "
                        "\"output_length\": 1, \"hash_ids\": [" +
                            ids + "]}\n");
  ReaderOptions options;
  options.max_line_bytes = 1000;
  options.format = TraceFormat::kMooncake;
  auto result = readAll(path, options);
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("longer than 1000 bytes"));
}

TEST(JsonlReader, MissingFileIsNotFound) {
  auto result = openTrace("/nonexistent/kvf/trace.jsonl", {.format = TraceFormat::kMooncake});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
}

TEST(MooncakeReader, ReadsBundledTraces) {
  auto conv = mustRead(testing::repoTracesDir() + "/mooncake/conversation_trace.jsonl");
  ASSERT_EQ(conv.size(), 12031u);
  EXPECT_EQ(conv.back().arrival, 3536999 * kNanosPerMilli);
  auto synth = mustRead(testing::repoTracesDir() + "/mooncake/synthetic_trace.jsonl");
  EXPECT_EQ(synth.size(), 3993u);
}

}  // namespace
}  // namespace kvf::trace

namespace kvf::trace {
namespace {

// Robustness: random byte edits, truncations and splices of valid lines must either parse or be
// reported as a problem, never crash or read out of bounds (run under KVF_SANITIZE in CI).
TEST(JsonlReader, SurvivesRandomlyCorruptedLines) {
  const std::vector<std::string> seeds = {
      "{\"timestamp\": 12.5, \"input_length\": 1025, \"output_length\": 7, \"block_size\": 512, "
      "\"id\": \"a\\\"b\\u00e9\\ud83d\\ude00\", \"session_id\": 5, \"turn\": 2, \"parent_id\": "
      "null, \"think_time_ms\": 1e3, \"type\": \"x\", \"extra\": [1, {\"k\": [true, false]}], "
      "\"hash_ids\": [0, 18446744073709551615, 3]}",
      "{\"chat_id\": 1, \"parent_chat_id\": -1, \"timestamp\": 61.114, \"input_length\": 33, "
      "\"output_length\": 1, \"type\": \"text\", \"turn\": 1, \"hash_ids\": [1, 2, 3]}"};
  std::mt19937_64 rng(99);
  const std::string alphabet = "{}[]\",:\\-+.eE0123456789 nulltrue\x01\xff";
  std::string text;
  for (int i = 0; i < 4000; ++i) {
    std::string line = seeds[static_cast<size_t>(i) % seeds.size()];
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !line.empty(); ++e) {
      size_t pos = rng() % line.size();
      switch (rng() % 4) {
        case 0:
          line[pos] = alphabet[rng() % alphabet.size()];
          break;
        case 1:
          line.erase(pos, 1 + rng() % 8);
          break;
        case 2:
          line.insert(pos, 1, alphabet[rng() % alphabet.size()]);
          break;
        default:
          line.resize(pos);
          break;
      }
    }
    text += line + "\n";
  }
  int64_t non_blank = 0;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    std::string_view line(text.data() + start, end - start);
    non_blank += line.find_first_not_of(" \t") != std::string_view::npos;
    start = end + 1;
  }
  TempDir dir;
  auto path = dir.write("fuzz.jsonl", text);
  for (auto format : {TraceFormat::kSession, TraceFormat::kBailian}) {
    ReaderOptions options;
    options.format = format;
    options.on_error = OnError::kSkip;
    auto reader = openTrace(path, options);
    ASSERT_TRUE(reader.ok());
    Request r;
    int64_t parsed = 0;
    while (true) {
      auto more = (*reader)->next(&r);
      ASSERT_TRUE(more.ok()) << more.status();
      if (!*more) break;
      ++parsed;
      EXPECT_TRUE(blockCountConsistent(r));
    }
    EXPECT_GT((*reader)->skipped(), 1000);
    EXPECT_EQ(parsed + (*reader)->skipped(), non_blank);
  }
}

}  // namespace
}  // namespace kvf::trace
