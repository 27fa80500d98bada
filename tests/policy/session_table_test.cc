#include "policy/session_table.h"

#include <gtest/gtest.h>

namespace kvf::policy {
namespace {

TEST(SessionTableTest, RemembersRefreshesAndExpires) {
  SessionTable t(100, 10);
  t.put("a", 3, 0);
  EXPECT_EQ(t.get("a", 50), 3);
  t.put("a", 4, 90);  // refresh moves the expiry
  EXPECT_EQ(t.get("a", 150), 4);
  EXPECT_EQ(t.get("a", 191), std::nullopt);
  EXPECT_EQ(t.get("", 0), std::nullopt);
  t.put("", 1, 0);  // no session: nothing stored
  EXPECT_EQ(t.size(), 1u);
}

TEST(SessionTableTest, BoundedByEvictingExpiredThenOldest) {
  SessionTable t(1000, 10);
  for (int i = 0; i < 10; ++i) t.put("s" + std::to_string(i), i, i);
  t.put("new", 0, 20);  // full: the least recently used (s0) goes
  EXPECT_LE(t.size(), 10u);
  EXPECT_EQ(t.get("s0", 20), std::nullopt);
  EXPECT_EQ(t.get("s9", 20), 9);
  EXPECT_EQ(t.get("new", 20), 0);
  t.forgetInstance(9);
  EXPECT_EQ(t.get("s9", 20), std::nullopt);
}

}  // namespace
}  // namespace kvf::policy
