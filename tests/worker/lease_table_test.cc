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

// vLLM NixlConnector lease semantics: a heartbeat extends to max(old, now + duration * 2 / 3)
// and never revives a lease that is due.
TEST(LeaseTableTest, HeartbeatExtendsAsVllmsLease) {
  LeaseTable t;
  t.take("r", Lease{hs({1}), 300, 300});
  const Lease* l = t.heartbeat("r", 0);  // now + 200 < 300: unchanged
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->expires_at, 300);
  l = t.heartbeat("r", 250);  // now + 200 = 450
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->expires_at, 450);
  EXPECT_EQ(t.heartbeat("r", 450), nullptr);  // due: no resurrection
  EXPECT_EQ(t.heartbeat("unknown", 0), nullptr);
  EXPECT_EQ(t.expire(450).size(), 1u);
}

// The holder's cap: however often a reader heartbeats, the lease ends by not_after.
TEST(LeaseTableTest, HeartbeatsStopAtNotAfter) {
  LeaseTable t;
  t.take("r", Lease{hs({1}), 300, 300, 500});
  for (Nanos now = 0; now < 500; now += 100) {
    const Lease* l = t.heartbeat("r", now);
    ASSERT_NE(l, nullptr) << now;
    EXPECT_LE(l->expires_at, 500) << now;
  }
  EXPECT_EQ(t.heartbeat("r", 400)->expires_at, 500);
  EXPECT_EQ(t.heartbeat("r", 500), nullptr);
  EXPECT_EQ(t.expire(500).size(), 1u);
}

}  // namespace
}  // namespace kvf::worker
