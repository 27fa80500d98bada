#include "worker/lease_table.h"

#include <gtest/gtest.h>

namespace kvf::worker {
namespace {

std::vector<BlockHash> hs(std::initializer_list<uint64_t> v) {
  return std::vector<BlockHash>(v.begin(), v.end());
}

TEST(LeaseTableTest, TakeReplaceReleaseExpireAndDetach) {
  LeaseTable t;
  EXPECT_TRUE(t.take("a", Lease{hs({1, 2}), 100}).empty());
  EXPECT_TRUE(t.take("b", Lease{hs({3}), 50}).empty());
  EXPECT_EQ(t.nextExpiry(), 50);
  // A reused id replaces its lease; the old pins come back.
  EXPECT_EQ(t.take("a", Lease{hs({4}), 200}), hs({1, 2}));
  EXPECT_EQ(t.size(), 2u);
  EXPECT_TRUE(t.expire(49).empty());
  auto due = t.expire(50);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].hashes, hs({3}));
  EXPECT_EQ(t.release("b"), std::nullopt);  // already expired
  auto whole = t.detach("a");
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(whole->hashes, hs({4}));
  EXPECT_EQ(whole->expires_at, 200);
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(t.nextExpiry(), std::nullopt);
  t.take("c", Lease{hs({5}), 10});
  EXPECT_EQ(t.release("c"), hs({5}));
}

}  // namespace
}  // namespace kvf::worker
