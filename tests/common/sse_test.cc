#include "common/sse.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvf::sse {
namespace {

std::vector<Event> parseAll(std::string_view text, size_t split) {
  Parser parser;
  std::vector<Event> events;
  for (size_t i = 0; i < text.size(); i += split) {
    auto s = parser.feed(text.substr(i, split), [&](Event&& e) { events.push_back(e); });
    EXPECT_TRUE(s.ok());
  }
  return events;
}

TEST(Sse, FormatsMultiLineData) {
  EXPECT_EQ(formatData("a\nb"), "data: a\ndata: b\n\n");
  EXPECT_EQ(formatData("{\"x\":1}"), "data: {\"x\":1}\n\n");
  EXPECT_EQ(formatEvent("error", "oops"), "event: error\ndata: oops\n\n");
}

TEST(Sse, ParsesAnySplitAndLineEnding) {
  std::string text =
      ": comment\r\ndata: one\r\n\r\nevent: error\rdata: two\rdata:three\r\rid: 7\ndata: "
      "[DONE]\n\n";
  for (size_t split : {1u, 2u, 3u, 7u, 1000u}) {
    auto events = parseAll(text, split);
    ASSERT_EQ(events.size(), 3u) << "split " << split;
    EXPECT_EQ(events[0].data, "one");
    EXPECT_EQ(events[1].event, "error");
    EXPECT_EQ(events[1].data, "two\nthree");
    EXPECT_EQ(events[2].id, "7");
    EXPECT_EQ(events[2].data, "[DONE]");
  }
}

TEST(Sse, RoundTripsFormattedEvents) {
  std::string text;
  for (int i = 0; i < 100; ++i) text += formatData("payload " + std::to_string(i) + "\nline2");
  auto events = parseAll(text, 5);
  ASSERT_EQ(events.size(), 100u);
  EXPECT_EQ(events[42].data, "payload 42\nline2");
}

TEST(Sse, IgnoresEventsWithoutData) {
  auto events = parseAll("event: ping\n\n: keepalive\n\ndata: x\n\n", 4);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].data, "x");
}

TEST(Sse, BoundsEventSize) {
  Parser parser(16);
  auto s = parser.feed("data: 0123456789abcdefghij", [](Event&&) {});
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace kvf::sse
