// KV push served from the holder's tiers below its pool: the pool's leading run, then the blocks
// its host memory (sent from the pinned slots) and its disk (read into the agent's bounce region,
// checksum checked) hold after it, in one landing with one notice, byte for byte at the
// receiver. A corrupt disk block ends the run (never sent), the bounce region bounds what a push
// reads from disk, every pin is undone on every path, and a pinned host slot survives the
// evictions racing the push.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <thread>

#include "tests/testing/poll.h"
#include "tests/testing/temp_dir.h"
#include "tests/worker/agent_fixture.h"
#include "worker/block_payload.h"
#include "worker/tier_push.h"
#include "worker/tiers/disk_format.h"

namespace kvf::worker {
namespace {

using namespace agent_testing;  // NOLINT: the fixture's vocabulary

constexpr uint64_t kSlotsPerFile = 16;

std::vector<std::byte> payloadOf(BlockKey key) {
  std::vector<std::byte> out(kBlockBytes);
  fillBlockPayload(BlockHash{key}, out);
  return out;
}

// Lower tiers for C: host memory of `host_slots` blocks, and a disk tier in `dir` when given.
std::unique_ptr<TieredStore> tierStore(size_t host_slots, const std::filesystem::path& dir = {}) {
  TieredStoreOptions o;
  o.host.block_bytes = kBlockBytes;
  o.host.capacity_bytes = host_slots * roundUpToSector(kBlockBytes);
  o.host.pin = PinMode::kOff;
  if (!dir.empty()) {
    DiskTierOptions d;
    d.dir = dir.string();
    d.capacity_bytes = 64 * diskSlotBytes(kBlockBytes);
    d.file_bytes = kSlotsPerFile * diskSlotBytes(kBlockBytes);
    d.batch_window = kNanosPerMilli;
    o.disk = d;
  }
  auto s = TieredStore::create(std::move(o));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

// Offloads H(i) for each i (as the engine's eviction would) and waits until the disk has them.
void offload(TieredStore& s, std::initializer_list<uint64_t> ids) {
  for (uint64_t i : ids) {
    absl::Status st =
        s.offloadWait(H(i).value(), payloadOf(H(i).value()), std::chrono::seconds(20));
    ASSERT_TRUE(st.ok()) << st;
  }
  ASSERT_TRUE(s.flush(std::chrono::seconds(20)));
}

std::vector<TierId> tiersOf(TieredStore& s, uint64_t first, uint64_t last) {
  std::vector<BlockKey> keys;
  for (uint64_t i = first; i <= last; ++i) keys.push_back(H(i).value());
  return s.lookup(keys);
}

// Flips a payload byte of `key`'s copy in the disk tier's slab files; false when none holds it.
bool corruptOnDisk(const std::filesystem::path& dir, BlockKey key) {
  for (uint32_t f = 0; std::filesystem::exists(dir / slabFileName(f)); ++f) {
    int fd = ::open((dir / slabFileName(f)).c_str(), O_RDWR);
    if (fd < 0) return false;
    for (uint64_t slot = 0; slot < kSlotsPerFile; ++slot) {
      std::vector<std::byte> sector(kDiskSector);
      if (::pread(fd, sector.data(), sector.size(), static_cast<off_t>(headerOffset(slot))) !=
          static_cast<ssize_t>(sector.size())) {
        break;
      }
      auto header = decodeSlotHeader(sector);
      if (!header || header->key != key) continue;
      std::byte flip{0x5a};
      off_t at = static_cast<off_t>(
          payloadOffset(slot, kSlotsPerFile, roundUpToSector(kBlockBytes)) + 100);
      bool ok = ::pwrite(fd, &flip, 1, at) == 1;
      ::close(fd);
      return ok;
    }
    ::close(fd);
  }
  return false;
}

class TierPushTest : public AgentTest {
 protected:
  // C: the pool holds H0..H(pool-1); its tiers are `tiers`.
  Node& holder(size_t pool, std::unique_ptr<TieredStore> tiers, uint64_t bounce = 1 << 20) {
    Node& c = node("C", "s3cret", milliseconds(20), std::move(tiers), bounce);
    holdOn(c, pool);
    return c;
  }
  void expectAllLanded(Node& c, Node& d, const FakeEngineAdapter::FetchRecord& r, size_t n) {
    ASSERT_TRUE(r.completed.has_value());
    EXPECT_FALSE(r.failed) << r.completed->reason;
    EXPECT_EQ(r.completed->landed, n) << r.completed->reason;
    EXPECT_EQ(r.completed->bytes, n * kBlockBytes);
    EXPECT_TRUE(r.released);
    EXPECT_TRUE(d.engine->markersIntact());  // every taken block holds its hash's bytes
    EXPECT_TRUE(waitPinsZero(c, kAmple));
    expectNoViolations(d, r);
  }
  std::filesystem::path dir_ = kvf::testing::freshTempDir("tier_push");
};

TEST_F(TierPushTest, PoolThenHostMemoryServeTheWholeRun) {
  auto tiers = tierStore(8);
  offload(*tiers, {4, 5, 6, 7});
  Node& c = holder(4, std::move(tiers));
  Node& d = node("D");
  auto r = fetch(d, c.agent->url(), "f1", 8, kAmple, kAmple);
  expectAllLanded(c, d, r, 8);
  EXPECT_EQ(fabric_->bytesWritten(), 8 * kBlockBytes);
}

TEST_F(TierPushTest, HostMemoryAloneServesARunThePoolDoesNotHold) {
  auto tiers = tierStore(8);
  offload(*tiers, {0, 1, 2});
  Node& c = holder(0, std::move(tiers));
  Node& d = node("D");
  auto r = fetch(d, c.agent->url(), "f1", 5, kAmple, kAmple);
  ASSERT_TRUE(r.completed.has_value());
  EXPECT_EQ(r.completed->landed, 3u);
  EXPECT_EQ(r.completed->reason, "source held 3 of 5 blocks");
  EXPECT_TRUE(d.engine->markersIntact());
  EXPECT_TRUE(waitPinsZero(c, kAmple));
}

TEST_F(TierPushTest, PoolThenDiskServeTheWholeRun) {
  auto tiers = tierStore(2, dir_);
  offload(*tiers, {4, 5, 6, 7, 100, 101});  // 100, 101 push H4..H7 out of host memory
  ASSERT_EQ(tiersOf(*tiers, 4, 7), std::vector<TierId>(4, TierId::kDisk));
  TieredStore* store = tiers.get();
  Node& c = holder(4, std::move(tiers));
  Node& d = node("D");
  auto r = fetch(d, c.agent->url(), "f1", 8, kAmple, kAmple);
  expectAllLanded(c, d, r, 8);
  EXPECT_EQ(store->stats().disk_onboarded, 4u);
}

TEST_F(TierPushTest, PoolHostAndDiskServeOneLandingInThreePuts) {
  auto tiers = tierStore(3, dir_);
  offload(*tiers, {6, 7});
  offload(*tiers, {3, 4, 5});  // H6, H7 leave host memory for the disk
  ASSERT_EQ(tiersOf(*tiers, 3, 7), (std::vector<TierId>{TierId::kHost, TierId::kHost, TierId::kHost,
                                                        TierId::kDisk, TierId::kDisk}));
  Node& c = holder(3, std::move(tiers));
  Node& d = node("D");
  fabric_->resetOperations();
  auto r = fetch(d, c.agent->url(), "f1", 8, kAmple, kAmple);
  expectAllLanded(c, d, r, 8);
  // One put per source region, one notice for the landing.
  int posts = 0, notices = 0;
  for (const std::string& op : fabric_->operationLog()) {
    posts += op.starts_with("post") ? 1 : 0;
    notices += op.starts_with("notice") ? 1 : 0;
  }
  EXPECT_EQ(posts, 3);
  EXPECT_EQ(notices, 1);
}

TEST_F(TierPushTest, ACorruptDiskBlockEndsTheRunAndIsNeverSent) {
  auto tiers = tierStore(2, dir_);
  offload(*tiers, {4, 5, 6, 7, 100, 101});
  ASSERT_TRUE(corruptOnDisk(dir_, H(6).value()));
  TieredStore* store = tiers.get();
  Node& c = holder(4, std::move(tiers));
  Node& d = node("D");
  auto r = fetch(d, c.agent->url(), "f1", 8, kAmple, kAmple);
  ASSERT_TRUE(r.completed.has_value());
  EXPECT_EQ(r.completed->landed, 6u);  // the pool's 4, H4 and H5 from disk
  EXPECT_EQ(r.completed->reason, "source held 6 of 8 blocks");
  EXPECT_TRUE(d.engine->markersIntact());  // nothing corrupt landed in a taken block
  EXPECT_EQ(fabric_->bytesWritten(), 6 * kBlockBytes);
  EXPECT_EQ(store->stats().droppedBy(DropReason::kCorrupt), 1u);
  EXPECT_TRUE(waitPinsZero(c, kAmple));
}

TEST_F(TierPushTest, DiskBlocksBeyondTheBounceRegionAreLeftMissing) {
  auto tiers = tierStore(2, dir_);
  offload(*tiers, {4, 5, 6, 7, 100, 101});
  Node& c = holder(4, std::move(tiers), 2 * roundUpToSector(kBlockBytes));
  Node& d = node("D");
  auto r = fetch(d, c.agent->url(), "f1", 8, kAmple, kAmple);
  ASSERT_TRUE(r.completed.has_value());
  EXPECT_EQ(r.completed->landed, 6u);
  EXPECT_TRUE(d.engine->markersIntact());
  EXPECT_TRUE(waitPinsZero(c, kAmple));
  // The bounce blocks came back: the next push reads its disk blocks again.
  auto again = fetch(d, c.agent->url(), "f2", 6, kAmple, kAmple);
  expectAllLanded(c, d, again, 6);
}

TEST_F(TierPushTest, EveryTransportOperationFailingUnpinsEveryTier) {
  everyOperationFaulted(
      [&]() -> Node& {
        auto tiers = tierStore(3, kvf::testing::freshTempDir("tier_push_faults"));
        offload(*tiers, {6, 7});
        offload(*tiers, {3, 4, 5});
        return holder(3, std::move(tiers));
      },
      8, 8);  // expect, 3 x (post, write), notice
}

// Teardown in the order every owner uses (stop the agent, stop the agent thread, stop the
// engine thread, destroy the agent, then the io_context and the memory) with a push in flight
// whose pin of the disk blocks the engine thread never ran, a lease open and the receiver's
// fetch waiting. The agent's destruction waits for disk reads still writing into its bounce
// region; a pin dropped unrun starts none, so it must not wait (it gives up only after 5 s).
// Run under the asan/tsan lanes, the same rounds check that nothing outlives what it uses.
TEST_F(TierPushTest, AnAgentWhoseEngineStoppedMidPushGoesAtOnce) {
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(::testing::Message() << "round " << round);
    teardown();
    fabric_ = std::make_unique<FakeFabric>();
    io_ = std::make_unique<testing::IoThread>();
    auto tiers = tierStore(2, kvf::testing::freshTempDir("tier_push_teardown"));
    offload(*tiers, {4, 5, 6, 7, 100, 101});
    // Lease expiry checks would post to the engine thread too: hourly, so that what is posted
    // below is the push's pin.
    Node& c = node("C", "s3cret", std::chrono::hours(1), std::move(tiers));
    holdOn(c, 4);
    Node& d = node("D");
    const std::vector<BlockHash> leased = hashes(4);
    EXPECT_EQ(
        c.engine->onEngine([&] { return c.agent->holdLease("l1", leased, kNanosPerSecond * 600); })
            .size(),
        4u);
    std::promise<void> resume;
    c.engine->haltWhen(resume.get_future().share());
    const size_t posted = c.engine->postedTasks();
    RemoteKvFetch f;
    f.id = "f1";
    f.source = c.agent->url();
    f.hashes = hashes(8);
    for (BlockIndex b = 40; b < 48; ++b) f.blocks.push_back(b);
    f.deadline = kAmple;
    d.engine->expectFetch(f.id, f.hashes, f.blocks);
    d.agent->fetch(std::move(f));
    // C's pin of the run is queued behind the halt.
    ASSERT_TRUE(kvf::testing::eventually([&] { return c.engine->postedTasks() > posted; }, kAmple));
    resume.set_value();
    for (auto& n : nodes_) runOnIo([&] { n->agent->stop(); });
    io_->stop();
    for (auto& n : nodes_) n->engine.reset();
    const auto start = Clock::now();
    c.agent.reset();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    // Without the fix each destruction waits out the agent's 5 s; at once it takes milliseconds,
    // and 4 s leaves a loaded machine room without ever passing the wait.
    EXPECT_LT(seconds, 4.0) << "the agent waited for disk reads that never started";
    nodes_.clear();
  }
}

TEST(TierPushSourceTest, EvictionsRacingAPushNeverFreeAPinnedSlot) {
  auto store = tierStore(4);
  offload(*store, {1, 2, 3, 4});
  TierPushSource source(*store);
  const std::vector<BlockHash> wanted = {H(1), H(2)};
  size_t read = 99;
  TierPushRun run = source.pin(wanted, {}, [&](size_t n) { read = n; });
  EXPECT_EQ(read, 0u);  // no disk block: answered at once
  ASSERT_EQ(run.blocks.size(), 2u);
  ASSERT_NE(run.id, 0u);
  const std::byte* arena = static_cast<const std::byte*>(source.region().data);
  // The engine keeps evicting into host memory while the push sends from the pinned slots.
  std::atomic<bool> evicting{true};
  std::thread evictor([&] {
    for (uint64_t k = 100; k < 2100; ++k) {
      (void)store->offload(H(k).value(), payloadOf(H(k).value()));
    }
    evicting = false;
  });
  auto pinnedIntact = [&] {
    for (size_t i = 0; i < 2; ++i) {
      std::span<const std::byte> bytes(arena + run.blocks[i].offset, kBlockBytes);
      if (!verifyBlockPayload(wanted[i], bytes)) return false;
    }
    return true;
  };
  int passes = 0;
  while (evicting) {
    ASSERT_TRUE(pinnedIntact()) << "pass " << passes;
    ++passes;
  }
  ASSERT_TRUE(pinnedIntact());
  evictor.join();
  EXPECT_TRUE(store->host().contains(H(1).value()));
  EXPECT_TRUE(store->host().contains(H(2).value()));
  EXPECT_FALSE(store->host().contains(H(3).value()));  // the unpinned ones were evicted
  EXPECT_GE(store->stats().droppedBy(DropReason::kCapacity), 2000u);
  source.unpin(run.id);
  EXPECT_EQ(source.pinnedRuns(), 0u);
  for (uint64_t k = 500; k < 504; ++k)
    ASSERT_TRUE(store->offload(H(k).value(), payloadOf(H(k).value())).ok());
  EXPECT_FALSE(store->host().contains(H(1).value()));  // unpinned: evictable again
}

}  // namespace
}  // namespace kvf::worker
