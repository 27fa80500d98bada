#include "worker/tiers/tiered_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "tests/worker/tiers/tier_test_util.h"
#include "worker/tiers/disk_format.h"

namespace kvf::worker {
namespace {

using namespace std::chrono_literals;

using testing::eventually;
using testing::holdsPayloadOf;
using testing::payloadOf;
using testing::RecordingListener;

constexpr uint64_t kBlock = 16384;

class TieredStoreTest : public ::testing::Test {
 protected:
  TieredStoreOptions options(size_t host_blocks, size_t disk_blocks) {
    TieredStoreOptions o;
    o.host.block_bytes = kBlock;
    o.host.capacity_bytes = host_blocks * kBlock;
    o.host.pin = PinMode::kPreferred;
    if (disk_blocks > 0) {
      DiskTierOptions d;
      d.dir = dir_.string();
      d.capacity_bytes = disk_blocks * diskSlotBytes(kBlock);
      d.file_bytes = 16 * diskSlotBytes(kBlock);
      d.batch_window = kNanosPerMilli;
      o.disk = d;
    }
    return o;
  }
  std::unique_ptr<TieredStore> make(TieredStoreOptions o) {
    auto s = TieredStore::create(std::move(o), &listener_);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }
  // Offloads `key`, waiting for room as an engine's eviction would.
  void offload(TieredStore& s, BlockKey key) {
    auto bytes = payloadOf(key, kBlock);
    absl::Status st = s.offloadWait(key, bytes, 20s);
    ASSERT_TRUE(st.ok()) << st;
  }
  // Onboards `keys` into fresh memory; checks every ready block byte for byte.
  std::shared_ptr<OnboardTicket> onboard(TieredStore& s, const std::vector<BlockKey>& keys) {
    memory_.emplace_back(keys.size() * kBlock);
    std::vector<std::span<std::byte>> dst;
    for (size_t i = 0; i < keys.size(); ++i) {
      dst.push_back(std::span(memory_.back()).subspan(i * kBlock, kBlock));
    }
    auto ticket = s.onboard(keys, dst);
    EXPECT_TRUE(ticket->waitAll(20s));
    for (size_t i = 0; i < keys.size(); ++i) {
      if (ticket->state(i) == OnboardState::kReady) {
        EXPECT_TRUE(holdsPayloadOf(keys[i], dst[i])) << "block " << keys[i];
      }
    }
    return ticket;
  }
  uint64_t drops(const TierStats& s) {
    uint64_t n = 0;
    for (uint64_t d : s.dropped) n += d;
    return n;
  }

  std::filesystem::path dir_ = kvf::testing::freshTempDir("tiered_store");
  RecordingListener listener_;
  std::list<std::vector<std::byte>> memory_;
};

TEST_F(TieredStoreTest, ASlowDiskBackpressuresInsteadOfLosingBlocks) {
  auto o = options(8, 256);
  o.disk->fault_io_delay = 5 * kNanosPerMilli;
  o.disk->queue_depth = 2;
  o.disk->max_queued_writes = 2;
  auto s = make(o);
  for (BlockKey k = 0; k < 40; ++k) offload(*s, k);  // 5x the host tier
  ASSERT_TRUE(s->flush(20s));
  TierStats st = s->stats();
  EXPECT_GT(st.host_backpressure, 0u);  // the disk set the pace
  EXPECT_EQ(drops(st), 0u);
  EXPECT_EQ(st.disk_blocks, 40u);
  std::vector<BlockKey> all;
  for (BlockKey k = 0; k < 40; ++k) all.push_back(k);
  auto ticket = onboard(*s, all);
  EXPECT_EQ(ticket->readyPrefix(), 40u);
  EXPECT_EQ(ticket->source(0), TierId::kDisk);
  EXPECT_EQ(ticket->source(39), TierId::kHost);
}

TEST_F(TieredStoreTest, DecouplingEvictionFromTheWriteLosesBlocks) {
  auto o = options(8, 256);
  o.host.decouple_eviction = true;
  o.disk->fault_io_delay = 5 * kNanosPerMilli;
  o.disk->queue_depth = 2;
  o.disk->max_queued_writes = 2;
  auto s = make(o);
  for (BlockKey k = 0; k < 40; ++k) offload(*s, k);
  ASSERT_TRUE(s->flush(20s));
  TierStats st = s->stats();
  uint64_t lost = st.droppedBy(DropReason::kLostBeforeWrite);
  EXPECT_GT(lost, 0u);
  std::vector<BlockKey> all;
  for (BlockKey k = 0; k < 40; ++k) all.push_back(k);
  auto ticket = onboard(*s, all);
  size_t missing = 0;
  for (size_t i = 0; i < all.size(); ++i) missing += ticket->state(i) == OnboardState::kMissing;
  EXPECT_EQ(missing, lost);
}

TEST_F(TieredStoreTest, WriteThroughAndWriteBackBothReachTheDisk) {
  for (WritePolicy policy : {WritePolicy::kWriteThrough, WritePolicy::kWriteBack}) {
    SCOPED_TRACE(policy == WritePolicy::kWriteBack ? "write-back" : "write-through");
    dir_ = kvf::testing::freshTempDir(policy == WritePolicy::kWriteBack ? "wb" : "wt");
    auto o = options(8, 64);
    o.host.write_policy = policy;
    o.host.writeback_max_lag = 50 * kNanosPerMilli;
    auto s = make(o);
    for (BlockKey k = 0; k < 4; ++k) offload(*s, k);
    if (policy == WritePolicy::kWriteBack) {
      // Below the dirty bound the blocks wait out their lag; then they are written unasked.
      EXPECT_EQ(s->stats().disk_written, 0u);
    }
    EXPECT_TRUE(eventually([&] { return s->stats().disk_written == 4; }));
    for (BlockKey k = 4; k < 20; ++k) offload(*s, k);  // turns the host tier over twice
    ASSERT_TRUE(s->flush(20s));
    TierStats st = s->stats();
    EXPECT_EQ(drops(st), 0u);
    EXPECT_EQ(st.disk_blocks, 20u);
    EXPECT_EQ(st.host_moved_down, 12u);
  }
}

TEST_F(TieredStoreTest, OnboardReportsEachBlockAndWaitsOnlyForItsOwn) {
  auto o = options(4, 64);
  o.disk->fault_io_delay = 100 * kNanosPerMilli;  // disk reads are slow, host copies are not
  auto s = make(o);
  for (BlockKey k = 0; k < 8; ++k) offload(*s, k);  // 0-3 on disk only, 4-7 in host memory
  ASSERT_TRUE(s->flush(20s));
  auto tiers = s->lookup(std::vector<BlockKey>{4, 5, 0, 99, 6});
  ASSERT_EQ(tiers.size(), 3u);
  EXPECT_EQ(tiers[0], TierId::kHost);
  EXPECT_EQ(tiers[2], TierId::kDisk);
  std::vector<BlockKey> keys = {4, 5, 0, 99};
  std::vector<std::vector<std::byte>> dst(4, std::vector<std::byte>(kBlock));
  std::vector<std::span<std::byte>> spans(dst.begin(), dst.end());
  std::atomic<int> callbacks{0};
  auto ticket = s->onboard(keys, spans, [&](size_t, OnboardState) { ++callbacks; });
  EXPECT_EQ(ticket->state(3), OnboardState::kMissing);  // known at once
  ASSERT_TRUE(ticket->wait(0, 5s));
  ASSERT_TRUE(ticket->wait(1, 5s));
  EXPECT_EQ(ticket->state(0), OnboardState::kReady);
  EXPECT_EQ(ticket->readyPrefix(), 2u);
  EXPECT_EQ(ticket->state(2), OnboardState::kPending);  // still on its way from disk
  ASSERT_TRUE(ticket->waitAll(5s));
  EXPECT_EQ(ticket->state(2), OnboardState::kReady);
  EXPECT_EQ(ticket->source(2), TierId::kDisk);
  EXPECT_TRUE(holdsPayloadOf(0, dst[2]));
  EXPECT_TRUE(holdsPayloadOf(4, dst[0]));
  EXPECT_EQ(callbacks.load(), 4);
}

TEST_F(TieredStoreTest, ConcurrentOnboardAndEvictOfTheSameBlocksServeOnlyTrueBytes) {
  auto o = options(4, 512);
  auto s = make(o);
  std::atomic<bool> stop{false};
  std::atomic<BlockKey> produced{0};
  std::thread producer([&] {
    // Each new block evicts an older one from host memory, over and over.
    for (BlockKey k = 0; k < 300 && !stop; ++k) {
      auto bytes = payloadOf(k, kBlock);
      if (!s->offloadWait(k, bytes, 20s).ok()) break;
      produced = k + 1;
    }
  });
  size_t ready = 0;
  std::vector<std::byte> dst(kBlock);
  while (produced < 300) {
    BlockKey n = produced.load();
    if (n < 6) continue;
    std::vector<BlockKey> keys = {n - 1, n - 3, n - 5, n - 6};  // at the host tier's edge
    std::vector<std::vector<std::byte>> out(keys.size(), std::vector<std::byte>(kBlock));
    std::vector<std::span<std::byte>> spans(out.begin(), out.end());
    auto ticket = s->onboard(keys, spans);
    ASSERT_TRUE(ticket->waitAll(20s));
    for (size_t i = 0; i < keys.size(); ++i) {
      OnboardState st = ticket->state(i);
      ASSERT_NE(st, OnboardState::kCorrupt);
      ASSERT_NE(st, OnboardState::kFailed);
      if (st == OnboardState::kReady) {
        ASSERT_TRUE(holdsPayloadOf(keys[i], out[i])) << keys[i];
        ++ready;
      }
    }
  }
  stop = true;
  producer.join();
  EXPECT_GT(ready, 0u);
  ASSERT_TRUE(s->flush(20s));
  EXPECT_EQ(drops(s->stats()), 0u);
}

TEST_F(TieredStoreTest, FrequencyFilterDropsAreCountedAndOptional) {
  auto o = options(4, 64);
  o.host.offload_min_hits = 2;
  auto s = make(o);
  for (BlockKey k = 0; k < 4; ++k) offload(*s, k);
  BlockKey hot[] = {1};
  s->touch(hot);
  // Seen twice, block 1 is due: written without anything else happening.
  EXPECT_TRUE(eventually([&] { return s->stats().disk_written == 1; }));
  for (BlockKey k = 4; k < 8; ++k) offload(*s, k);
  ASSERT_TRUE(s->flush(5s));
  TierStats st = s->stats();
  EXPECT_EQ(st.droppedBy(DropReason::kFrequencyFilter), 3u);
  EXPECT_TRUE(s->lookup(std::vector<BlockKey>{1}).size() == 1);
  EXPECT_TRUE(s->lookup(std::vector<BlockKey>{0}).empty());
}

TEST_F(TieredStoreTest, RemoveDropsFromEveryTierOnce) {
  auto s = make(options(4, 64));
  offload(*s, 1);
  ASSERT_TRUE(s->flush(5s));
  EXPECT_TRUE(s->remove(1));
  EXPECT_FALSE(s->remove(1));
  EXPECT_TRUE(s->lookup(std::vector<BlockKey>{1}).empty());
  EXPECT_EQ(s->stats().droppedBy(DropReason::kRemoved), 1u);
  EXPECT_EQ(listener_.removed(TierId::kHost), std::vector<BlockKey>{1});
  EXPECT_EQ(listener_.removed(TierId::kDisk), std::vector<BlockKey>{1});
}

TEST_F(TieredStoreTest, HostOnlyChainDropsByCapacity) {
  auto s = make(options(4, 0));
  for (BlockKey k = 0; k < 6; ++k) offload(*s, k);
  EXPECT_EQ(s->stats().droppedBy(DropReason::kCapacity), 2u);
  auto ticket = onboard(*s, {0, 5});
  EXPECT_EQ(ticket->state(0), OnboardState::kMissing);
  EXPECT_EQ(ticket->state(1), OnboardState::kReady);
}

TEST_F(TieredStoreTest, ABlockAlreadyOnDiskIsCleanInHostMemory) {
  auto s = make(options(4, 64));
  offload(*s, 1);
  ASSERT_TRUE(s->flush(5s));
  for (BlockKey k = 2; k < 6; ++k) offload(*s, k);  // pushes 1 out of host memory
  ASSERT_TRUE(s->flush(5s));
  auto ticket = onboard(*s, {1});
  ASSERT_EQ(ticket->state(0), OnboardState::kReady);
  uint64_t written = s->stats().disk_written;
  offload(*s, 1);  // back from the engine: no second write
  ASSERT_TRUE(s->flush(5s));
  EXPECT_EQ(s->stats().disk_written, written);
}

TEST_F(TieredStoreTest, MetricsExposeCountersAndOccupancy) {
  auto s = make(options(4, 64));
  offload(*s, 1);
  ASSERT_TRUE(s->flush(5s));
  metrics::Registry registry;
  exportMetrics(*s, registry, {{"instance", "e0"}});
  std::string text = registry.exposition();
  EXPECT_NE(text.find("kvfabric_tier_blocks{instance=\"e0\",tier=\"host\"} 1"), std::string::npos)
      << text;
  EXPECT_NE(text.find("kvfabric_tier_disk_written_blocks_total{instance=\"e0\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("kvfabric_tier_blocks_dropped_total{instance=\"e0\",reason=\"capacity\"} 0"),
            std::string::npos);
}

TEST_F(TieredStoreTest, ACorruptedHostBlockIsServedFromDiskOrNotAtAll) {
  auto o = options(4, 64);
  o.verify_host_reads = true;
  auto s = make(o);
  offload(*s, 1);
  offload(*s, 2);
  ASSERT_TRUE(s->flush(5s));  // both on disk, checksums computed by the offloader
  ASSERT_TRUE(s->disk()->remove(2));
  for (BlockKey k : {1, 2}) {
    auto pin = s->host().pin(k);
    ASSERT_TRUE(pin && pin->checksum.has_value());
    const_cast<std::byte&>(pin->bytes[100]) ^= std::byte{0xff};  // a bit flip in host memory
    s->host().unpin(*pin);
  }
  auto ticket = onboard(*s, {1, 2});
  EXPECT_EQ(ticket->state(0), OnboardState::kReady);  // the disk's good copy
  EXPECT_EQ(ticket->source(0), TierId::kDisk);
  EXPECT_EQ(ticket->state(1), OnboardState::kMissing);  // no good copy anywhere: not served
  EXPECT_EQ(s->stats().droppedBy(DropReason::kCorrupt), 2u);
  EXPECT_FALSE(s->host().contains(1));
}

TEST_F(TieredStoreTest, OffloadIntoFillsTheSlotOrAbandonsItOnError) {
  auto s = make(options(2, 64));
  auto bytes = payloadOf(7, kBlock);
  absl::Status filled = s->offloadInto(7, [&](std::span<std::byte> slot) {
    EXPECT_EQ(slot.size(), kBlock);
    std::memcpy(slot.data(), bytes.data(), bytes.size());
    return absl::OkStatus();
  });
  ASSERT_TRUE(filled.ok()) << filled;
  // A copy that fails (a device error) stores nothing and leaves the slot free.
  absl::Status failed =
      s->offloadInto(8, [](std::span<std::byte>) { return absl::InternalError("copy failed"); });
  EXPECT_TRUE(absl::IsInternal(failed)) << failed;
  EXPECT_FALSE(s->host().contains(8));
  EXPECT_EQ(s->stats().host.resident, 1u);
  EXPECT_EQ(s->stats().host_stored, 1u);
  // A key already held is not filled again.
  bool called = false;
  EXPECT_TRUE(s->offloadInto(7, [&](std::span<std::byte>) {
                 called = true;
                 return absl::OkStatus();
               }).ok());
  EXPECT_FALSE(called);
  ASSERT_TRUE(s->flush(5s));
  auto ticket = onboard(*s, {7});
  EXPECT_EQ(ticket->state(0), OnboardState::kReady);
  EXPECT_EQ(listener_.stored(TierId::kDisk), std::vector<BlockKey>{7});
}

TEST_F(TieredStoreTest, RejectsMismatchedGeometry) {
  auto o = options(4, 64);
  o.disk->block_bytes = 2 * kBlock;
  EXPECT_FALSE(TieredStore::create(o).ok());
  auto ok = make(options(4, 0));
  std::vector<std::byte> wrong(kBlock - 1);
  EXPECT_TRUE(absl::IsInvalidArgument(ok->offload(1, wrong)));
}

}  // namespace
}  // namespace kvf::worker
