#include "router/core/decision_log.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "common/json.h"

namespace kvf::router {
namespace {

TEST(DecisionLogTest, WritesOneParseableLinePerRecordAndKeepsRecent) {
  std::string path = ::testing::TempDir() + "/decision_log_test.jsonl";
  std::remove(path.c_str());
  auto log = DecisionLog::open(path, 2);
  ASSERT_TRUE(log.ok()) << log.status();
  DecisionRecord r;
  r.request_id = "kvf-1";
  r.session = "s \"quoted\"";
  r.instance = "e1";
  r.predicted_cached_tokens = 32;
  r.scores = {{"e0", 1.5}, {"e1", std::nan("")}};
  (*log)->write(r);
  r.request_id = "kvf-2";
  r.actual_cached_tokens = 16;
  (*log)->write(r);
  r.request_id = "kvf-3";
  (*log)->write(r);
  auto recent = (*log)->recent();  // serialised on demand, oldest first
  ASSERT_EQ(recent.size(), 2u);
  EXPECT_NE(recent[0].find("\"kvf-2\""), std::string::npos);
  EXPECT_NE(recent[1].find("\"kvf-3\""), std::string::npos);
  EXPECT_NE(recent[1].find("\"actual_cached_tokens\":16"), std::string::npos);
  std::ifstream in(path);
  std::string line;
  std::vector<boost::json::object> lines;
  while (std::getline(in, line)) {
    auto obj = json::parseObject(line);
    ASSERT_TRUE(obj.ok()) << line;
    lines.push_back(*obj);
  }
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["session"].as_string(), "s \"quoted\"");
  EXPECT_TRUE(lines[0]["actual_cached_tokens"].is_null());
  EXPECT_EQ(lines[1]["actual_cached_tokens"].as_int64(), 16);
  EXPECT_TRUE(lines[0]["scores"].as_object()["e1"].is_null());
  EXPECT_DOUBLE_EQ(lines[0]["scores"].as_object()["e0"].as_double(), 1.5);
}

TEST(DecisionLogTest, UnwritablePathIsAnError) {
  auto log = DecisionLog::open("/nonexistent-dir/x.jsonl");
  ASSERT_FALSE(log.ok());
  EXPECT_NE(std::string(log.status().message()).find("decision_log"), std::string::npos);
}

}  // namespace
}  // namespace kvf::router
