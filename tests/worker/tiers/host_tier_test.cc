#include "worker/tiers/host_tier.h"

#include <gtest/gtest.h>

#include <cstring>

#include "tests/worker/tiers/tier_test_util.h"

namespace kvf::worker {
namespace {

using namespace std::chrono_literals;

using testing::payloadOf;
using testing::RecordingListener;
using Outcome = HostTier::WriteOutcome;

constexpr uint64_t kBlock = 8192;

class HostTierTest : public ::testing::Test {
 protected:
  std::unique_ptr<HostTier> make(HostTierOptions o) {
    o.block_bytes = kBlock;
    if (o.capacity_bytes == 0) o.capacity_bytes = 4 * kBlock;
    auto tier = HostTier::create(o, &counters_, &listener_, &clock_);
    EXPECT_TRUE(tier.ok()) << tier.status();
    return std::move(*tier);
  }
  // Stores `key` with its payload; the status of the reservation.
  absl::Status store(HostTier& t, BlockKey key, bool durable_below = false) {
    auto r = t.reserve(key);
    if (!r.ok()) return r.status();
    auto bytes = payloadOf(key, kBlock);
    std::memcpy(r->bytes.data(), bytes.data(), kBlock);
    t.commit(*r, blockChecksum(bytes), durable_below);
    return absl::OkStatus();
  }

  TierCounters counters_;
  RecordingListener listener_;
  ManualClock clock_;
};

TEST_F(HostTierTest, EvictsLeastRecentlyUsedWithoutLowerTier) {
  auto t = make({});
  for (BlockKey k = 1; k <= 4; ++k) ASSERT_TRUE(store(*t, k).ok());
  auto pin = t->pin(1);  // 1 becomes the most recent
  ASSERT_TRUE(pin.has_value());
  EXPECT_TRUE(testing::holdsPayloadOf(1, pin->bytes));
  EXPECT_EQ(pin->checksum, std::optional(blockChecksum(payloadOf(1, kBlock))));
  t->unpin(*pin);
  ASSERT_TRUE(store(*t, 5).ok());
  EXPECT_FALSE(t->contains(2));  // the least recent went
  EXPECT_TRUE(t->contains(1));
  EXPECT_EQ(counters_.droppedBy(DropReason::kCapacity), 1u);
  EXPECT_EQ(listener_.removed(TierId::kHost), std::vector<BlockKey>{2});
  EXPECT_EQ(listener_.stored(TierId::kHost).size(), 5u);
  EXPECT_TRUE(absl::IsAlreadyExists(t->reserve(5).status()));
}

TEST_F(HostTierTest, DirtyBlocksStayUntilWrittenThenBackpressure) {
  auto t = make({.has_lower_tier = true});
  for (BlockKey k = 1; k <= 4; ++k) ASSERT_TRUE(store(*t, k).ok());
  EXPECT_EQ(t->usage().dirty, 4u);
  // Nothing may leave before its write: the fifth store is refused, nothing lost.
  EXPECT_TRUE(absl::IsUnavailable(store(*t, 5)));
  EXPECT_EQ(counters_.host_backpressure.load(), 1u);
  EXPECT_FALSE(t->waitForSpace(1ms));
  auto jobs = t->takeDirty(2);
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[0].key, 1u);  // oldest first
  EXPECT_EQ(jobs[0].bytes.size() % 4096, 0u);
  EXPECT_TRUE(testing::holdsPayloadOf(1, jobs[0].bytes.first(kBlock)));
  // In a write: still not evictable.
  EXPECT_TRUE(absl::IsUnavailable(store(*t, 5)));
  t->finishWrite(jobs[1], Outcome::kDurable);
  EXPECT_TRUE(t->waitForSpace(1ms));
  ASSERT_TRUE(store(*t, 5).ok());
  EXPECT_FALSE(t->contains(2));  // the clean one left, as moved down, not dropped
  EXPECT_EQ(counters_.host_moved_down.load(), 1u);
  uint64_t drops = 0;
  for (size_t r = 0; r < kDropReasonCount; ++r) drops += counters_.dropped[r].load();
  EXPECT_EQ(drops, 0u);
  t->finishWrite(jobs[0], Outcome::kDurable);
}

TEST_F(HostTierTest, DecoupledEvictionLosesUnwrittenBlocks) {
  auto t = make({.has_lower_tier = true, .decouple_eviction = true});
  for (BlockKey k = 1; k <= 4; ++k) ASSERT_TRUE(store(*t, k).ok());
  auto jobs = t->takeDirty(1);  // block 1 is being written: even decoupled, its memory is busy
  ASSERT_TRUE(store(*t, 5).ok());
  ASSERT_TRUE(store(*t, 6).ok());
  EXPECT_TRUE(t->contains(1));
  EXPECT_FALSE(t->contains(2));
  EXPECT_FALSE(t->contains(3));
  EXPECT_EQ(counters_.droppedBy(DropReason::kLostBeforeWrite), 2u);
  t->finishWrite(jobs[0], Outcome::kDurable);
}

TEST_F(HostTierTest, FrequencyFilterWritesOnlyBlocksSeenTwice) {
  auto t = make({.has_lower_tier = true, .offload_min_hits = 2});
  ASSERT_TRUE(store(*t, 1).ok());
  ASSERT_TRUE(store(*t, 2).ok());
  EXPECT_TRUE(t->takeDirty(10).empty());
  BlockKey seen[] = {2};
  t->touch(seen);
  auto jobs = t->takeDirty(10);
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].key, 2u);
  t->finishWrite(jobs[0], Outcome::kDurable);
  for (BlockKey k = 3; k <= 5; ++k) ASSERT_TRUE(store(*t, k).ok());
  EXPECT_FALSE(t->contains(1));
  EXPECT_EQ(counters_.droppedBy(DropReason::kFrequencyFilter), 1u);
}

TEST_F(HostTierTest, FailedWritesAreRetriedThenDroppedAsWriteFailed) {
  auto t = make({.has_lower_tier = true, .max_write_attempts = 2});
  ASSERT_TRUE(store(*t, 1).ok());
  auto jobs = t->takeDirty(1);
  t->finishWrite(jobs[0], Outcome::kNotTried);  // queue full: no attempt counted
  jobs = t->takeDirty(1);
  t->finishWrite(jobs[0], Outcome::kFailed);
  jobs = t->takeDirty(1);
  ASSERT_EQ(jobs.size(), 1u);
  t->finishWrite(jobs[0], Outcome::kFailed);
  EXPECT_TRUE(t->takeDirty(1).empty());
  EXPECT_TRUE(t->waitWritten(1ms));
  for (BlockKey k = 2; k <= 5; ++k) ASSERT_TRUE(store(*t, k).ok());
  EXPECT_EQ(counters_.droppedBy(DropReason::kWriteFailed), 1u);
}

TEST_F(HostTierTest, WriteBackWaitsForTheLagOrTheDirtyBound) {
  auto t = make({.has_lower_tier = true,
                 .write_policy = WritePolicy::kWriteBack,
                 .writeback_max_lag = 100 * kNanosPerMilli,
                 .writeback_max_dirty = 2});
  ASSERT_TRUE(store(*t, 1).ok());
  clock_.advance(10 * kNanosPerMilli);
  ASSERT_TRUE(store(*t, 2).ok());
  EXPECT_TRUE(t->takeDirty(10).empty());
  EXPECT_EQ(t->nextWriteDue(), std::optional<Nanos>(100 * kNanosPerMilli));
  ASSERT_TRUE(store(*t, 3).ok());  // three dirty > bound of two: the oldest is due
  auto jobs = t->takeDirty(10);
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].key, 1u);
  clock_.advance(100 * kNanosPerMilli);  // block 2 waited its lag
  auto more = t->takeDirty(10);
  ASSERT_EQ(more.size(), 2u);
  for (auto& j : jobs) t->finishWrite(j, Outcome::kDurable);
  for (auto& j : more) t->finishWrite(j, Outcome::kDurable);
  EXPECT_TRUE(t->waitWritten(1ms));
}

TEST_F(HostTierTest, FlushingMakesWriteBackBlocksDue) {
  auto t = make({.has_lower_tier = true, .write_policy = WritePolicy::kWriteBack});
  ASSERT_TRUE(store(*t, 1).ok());
  EXPECT_TRUE(t->takeDirty(10).empty());
  t->setFlushing(true);
  EXPECT_EQ(t->takeDirty(10).size(), 1u);
}

TEST_F(HostTierTest, DropWhilePinnedFreesAtUnpin) {
  auto t = make({});
  ASSERT_TRUE(store(*t, 1).ok());
  auto pin = t->pin(1);
  ASSERT_TRUE(pin.has_value());
  EXPECT_TRUE(t->drop(1, DropReason::kCorrupt));
  EXPECT_FALSE(t->contains(1));
  EXPECT_EQ(t->usage().resident, 0u);
  // The pinned bytes are still the block's: nobody reused the slot.
  for (BlockKey k = 2; k <= 4; ++k) ASSERT_TRUE(store(*t, k).ok());
  ASSERT_TRUE(store(*t, 5).ok());  // evicts block 2: the dropped block's slot is not free yet
  EXPECT_FALSE(t->contains(2));
  EXPECT_TRUE(testing::holdsPayloadOf(1, pin->bytes));
  t->unpin(*pin);
  ASSERT_TRUE(store(*t, 6).ok());
  EXPECT_EQ(counters_.droppedBy(DropReason::kCorrupt), 1u);
}

TEST_F(HostTierTest, RejectsBadOptions) {
  TierCounters c;
  EXPECT_FALSE(
      HostTier::create({.block_bytes = 0, .capacity_bytes = 1 << 20}, &c, nullptr, &clock_).ok());
  EXPECT_FALSE(
      HostTier::create({.block_bytes = 8192, .capacity_bytes = 4096}, &c, nullptr, &clock_).ok());
}

TEST_F(HostTierTest, MemoryIsPageLockedWhenAskedAndAllowed) {
  auto t = make({.pin = PinMode::kOff});
  EXPECT_EQ(t->pinKind(), PinKind::kNone);
  auto locked = HostTier::create({.block_bytes = kBlock, .capacity_bytes = 4 * kBlock}, &counters_,
                                 nullptr, &clock_);
  ASSERT_TRUE(locked.ok());
  // mlock of 32 KiB fits any default RLIMIT_MEMLOCK (8 MiB on Debian); CUDA pins when it can.
  EXPECT_NE((*locked)->pinKind(), PinKind::kNone);
}

}  // namespace
}  // namespace kvf::worker
