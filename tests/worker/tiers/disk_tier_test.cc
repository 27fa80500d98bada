#include "worker/tiers/disk_tier.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <future>

#include "tests/worker/tiers/tier_test_util.h"
#include "worker/tiers/disk_format.h"
#include "worker/tiers/pinned_arena.h"

namespace kvf::worker {
namespace {

using namespace std::chrono_literals;

using testing::holdsPayloadOf;
using testing::payloadOf;
using testing::RecordingListener;
using testing::ScratchMount;

// A block whose size is not a sector multiple, so padding and bounce buffers are exercised.
constexpr uint64_t kBlock = 10000;

// Sector-aligned memory for `blocks` padded blocks.
struct AlignedBlocks {
  explicit AlignedBlocks(size_t blocks)
      : stride(roundUpToSector(kBlock)),
        memory(static_cast<std::byte*>(std::aligned_alloc(4096, blocks * stride))) {
    std::memset(memory.get(), 0, blocks * stride);
  }
  std::span<std::byte> block(size_t i) { return {memory.get() + i * stride, stride}; }
  uint64_t stride;
  std::unique_ptr<std::byte, decltype([](std::byte* p) { std::free(p); })> memory;
};

// The result of one Done callback.
struct DoneFuture {
  std::shared_ptr<std::promise<absl::Status>> promise =
      std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> future = promise->get_future();
  DiskTier::Done done() {
    return [p = promise](absl::Status s) { p->set_value(std::move(s)); };
  }
  absl::Status get() {
    if (future.wait_for(20s) != std::future_status::ready) return absl::DeadlineExceededError("");
    return future.get();
  }
};

class DiskTierTest : public ::testing::Test {
 protected:
  DiskTierOptions options(const std::string& dir, uint64_t blocks = 16) {
    DiskTierOptions o;
    o.dir = dir;
    o.block_bytes = kBlock;
    o.capacity_bytes = blocks * diskSlotBytes(kBlock);
    o.file_bytes = 4 * diskSlotBytes(kBlock);
    o.batch_window = 2 * kNanosPerMilli;
    return o;
  }
  std::unique_ptr<DiskTier> open(const DiskTierOptions& o) {
    auto tier = DiskTier::create(o, &counters_, &listener_);
    EXPECT_TRUE(tier.ok()) << tier.status();
    return tier.ok() ? std::move(*tier) : nullptr;
  }
  // Writes `key`'s payload from `buffer` and waits until it is durable.
  absl::Status writeBlock(DiskTier& t, BlockKey key, std::span<std::byte> buffer) {
    auto bytes = payloadOf(key, kBlock);
    std::memcpy(buffer.data(), bytes.data(), kBlock);
    DoneFuture f;
    absl::Status accepted = t.write(key, buffer, blockChecksum(bytes), f.done());
    if (!accepted.ok()) return accepted;
    return f.get();
  }
  absl::Status readBlock(DiskTier& t, BlockKey key, std::span<std::byte> out) {
    DoneFuture f;
    t.read(key, out, f.done());
    return f.get();
  }

  std::filesystem::path dir_ = kvf::testing::freshTempDir("disk_tier");
  TierCounters counters_;
  RecordingListener listener_;
};

// What the file system under `dir` does with O_DIRECT, asked independently of the tier.
bool acceptsDirectIo(const std::string& dir) {
  std::string path = dir + "/probe";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
  if (fd >= 0) ::close(fd);
  ::unlink(path.c_str());
  return fd >= 0;
}

TEST_F(DiskTierTest, RoundTripIsByteForByteFromAlignedAndUnalignedMemory) {
  auto t = open(options(dir_.string()));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->directIo(), acceptsDirectIo(dir_.string()));
  EXPECT_EQ(t->startReport().action, DiskStart::kClear);
  AlignedBlocks aligned(2);
  std::vector<std::byte> unaligned(kBlock + 1);
  ASSERT_TRUE(writeBlock(*t, 1, aligned.block(0)).ok());
  ASSERT_TRUE(writeBlock(*t, 2, std::span(unaligned).subspan(1)).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(t->write(1, aligned.block(0), 0, [](absl::Status) {})));
  std::memset(aligned.block(1).data(), 0, kBlock);
  ASSERT_TRUE(readBlock(*t, 1, aligned.block(1)).ok());
  EXPECT_TRUE(holdsPayloadOf(1, aligned.block(1).first(kBlock)));
  std::vector<std::byte> out(kBlock + 3);
  ASSERT_TRUE(readBlock(*t, 2, std::span(out).subspan(3)).ok());
  EXPECT_TRUE(holdsPayloadOf(2, std::span(out).subspan(3)));
  EXPECT_TRUE(absl::IsNotFound(readBlock(*t, 3, aligned.block(1))));
  EXPECT_EQ(counters_.disk_written.load(), 2u);
  EXPECT_EQ(counters_.disk_onboarded.load(), 2u);
  EXPECT_EQ(listener_.stored(TierId::kDisk), (std::vector<BlockKey>{1, 2}));
}

TEST_F(DiskTierTest, BufferedIoWhenDirectIoIsOff) {
  auto o = options(dir_.string());
  o.direct_io = DirectIo::kOff;
  auto t = open(o);
  ASSERT_NE(t, nullptr);
  EXPECT_FALSE(t->directIo());
  std::vector<std::byte> in(kBlock), out(kBlock);
  ASSERT_TRUE(writeBlock(*t, 7, in).ok());
  ASSERT_TRUE(readBlock(*t, 7, out).ok());
  EXPECT_TRUE(holdsPayloadOf(7, out));
}

TEST_F(DiskTierTest, FallsBackToBufferedIoWhereTheFileSystemRefusesDirectIo) {
  ScratchMount ramfs("disk_tier_ramfs", "ramfs", "");
  if (!ramfs.mounted()) GTEST_SKIP() << "cannot mount ramfs here (needs CAP_SYS_ADMIN)";
  ASSERT_FALSE(acceptsDirectIo(ramfs.dir()));
  auto on = options(ramfs.dir());
  on.direct_io = DirectIo::kOn;
  auto refused = DiskTier::create(on, &counters_, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  auto t = open(options(ramfs.dir()));  // auto
  ASSERT_NE(t, nullptr);
  EXPECT_FALSE(t->directIo());
  EXPECT_FALSE(t->startReport().direct_io);
  std::vector<std::byte> in(kBlock), out(kBlock);
  ASSERT_TRUE(writeBlock(*t, 9, in).ok());
  ASSERT_TRUE(readBlock(*t, 9, out).ok());
  EXPECT_TRUE(holdsPayloadOf(9, out));
}

TEST_F(DiskTierTest, RestartRebuildsTheIndexFromTheFilesOrClearsThem) {
  AlignedBlocks buf(1);
  {
    auto t = open(options(dir_.string()));
    for (BlockKey k = 10; k < 15; ++k) ASSERT_TRUE(writeBlock(*t, k, buf.block(0)).ok());
    EXPECT_TRUE(t->remove(12));
  }
  RecordingListener after;
  auto rebuilt = DiskTier::create(options(dir_.string()), &counters_, &after);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  const DiskStartReport& report = (*rebuilt)->startReport();
  EXPECT_EQ(report.action, DiskStart::kRebuild);
  // Removal does not erase the slot on disk: the still-valid block comes back.
  EXPECT_EQ(report.recovered_blocks, 5u);
  EXPECT_EQ(report.invalid_slots, 0u);
  EXPECT_EQ(after.stored(TierId::kDisk).size(), 5u);
  EXPECT_EQ(after.stored(TierId::kDisk).back(), 14u);  // oldest first, newest last
  for (BlockKey k = 10; k < 15; ++k) {
    ASSERT_TRUE(readBlock(**rebuilt, k, buf.block(0)).ok());
    EXPECT_TRUE(holdsPayloadOf(k, buf.block(0).first(kBlock)));
  }
  ASSERT_TRUE(writeBlock(**rebuilt, 15, buf.block(0)).ok());  // sequence continues
  rebuilt->reset();

  auto o = options(dir_.string());
  o.on_start = DiskStart::kClear;
  RecordingListener cleared;
  auto fresh = DiskTier::create(o, &counters_, &cleared);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ((*fresh)->startReport().action, DiskStart::kClear);
  EXPECT_EQ((*fresh)->blocks(), 0u);
  EXPECT_EQ(cleared.cleared(TierId::kDisk), 1);
}

TEST_F(DiskTierTest, AChangedGeometryClearsInsteadOfMisreading) {
  AlignedBlocks buf(1);
  {
    auto t = open(options(dir_.string()));
    ASSERT_TRUE(writeBlock(*t, 1, buf.block(0)).ok());
  }
  auto o = options(dir_.string());
  o.block_bytes = 2 * kBlock;
  o.capacity_bytes = 4 * diskSlotBytes(o.block_bytes);
  auto t = open(o);
  EXPECT_EQ(t->startReport().action, DiskStart::kClear);
  EXPECT_NE(t->startReport().reason.find("geometry changed"), std::string::npos)
      << t->startReport().reason;
  EXPECT_FALSE(t->contains(1));
}

TEST_F(DiskTierTest, ACorruptedBlockIsDetectedDroppedAndNeverServed) {
  AlignedBlocks buf(2);
  auto t = open(options(dir_.string()));
  ASSERT_TRUE(writeBlock(*t, 1, buf.block(0)).ok());  // slot 0
  ASSERT_TRUE(writeBlock(*t, 2, buf.block(0)).ok());  // slot 1
  std::string slab = dir_.string() + "/" + slabFileName(0);
  int fd = ::open(slab.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  std::byte flip{0x5a};
  // Slab files of 4 slots (options()): block 1's payload, then block 2's header.
  ASSERT_EQ(::pwrite(fd, &flip, 1, payloadOffset(0, 4, roundUpToSector(kBlock)) + 1234), 1);
  ASSERT_EQ(::pwrite(fd, &flip, 1, headerOffset(1) + 20), 1);
  ::close(fd);
  std::memset(buf.block(1).data(), 0, kBlock);
  absl::Status s = readBlock(*t, 1, buf.block(1));
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_FALSE(t->contains(1));
  EXPECT_TRUE(absl::IsNotFound(readBlock(*t, 1, buf.block(1))));
  // A damaged header leaves the payload good: still served, checked against its checksum.
  ASSERT_TRUE(readBlock(*t, 2, buf.block(1)).ok());
  EXPECT_TRUE(holdsPayloadOf(2, buf.block(1).first(kBlock)));
  EXPECT_EQ(counters_.droppedBy(DropReason::kCorrupt), 1u);
  EXPECT_EQ(listener_.removed(TierId::kDisk), (std::vector<BlockKey>{1}));
  t.reset();
  // At a rebuild the damaged header is recognised: its block is not recovered, its slot reused.
  auto again = open(options(dir_.string()));
  EXPECT_EQ(again->startReport().invalid_slots, 1u);
  EXPECT_FALSE(again->contains(2));
}

TEST_F(DiskTierTest, AFullDiskCapsTheTierAndEvictsWithinWhatItHas) {
  // 256 KiB of tmpfs; slab files of 4 slots (~57 KiB): four fit, the budget asks for 16.
  ScratchMount tmpfs("disk_tier_full", "tmpfs", "size=256k");
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount tmpfs here (needs CAP_SYS_ADMIN)";
  auto o = options(tmpfs.dir(), 64);
  auto t = open(o);
  ASSERT_NE(t, nullptr);
  AlignedBlocks buf(1);
  for (BlockKey k = 1; k <= 40; ++k) ASSERT_TRUE(writeBlock(*t, k, buf.block(0)).ok()) << k;
  EXPECT_GE(counters_.disk_grow_failures.load(), 1u);
  size_t held = t->allocatedBlocks();
  EXPECT_GT(held, 0u);
  EXPECT_LT(held, t->capacityBlocks());
  EXPECT_EQ(t->blocks(), held);
  EXPECT_EQ(counters_.droppedBy(DropReason::kCapacity), 40 - held);  // every drop counted
  ASSERT_TRUE(readBlock(*t, 40, buf.block(0)).ok());                 // the newest stayed
  EXPECT_TRUE(holdsPayloadOf(40, buf.block(0).first(kBlock)));
  t.reset();

  auto eager = options(tmpfs.dir(), 64);
  eager.preallocate = Preallocate::kEager;
  auto refused = DiskTier::create(eager, &counters_, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("slab-"), absl::string_view::npos);
}

// A disk that refuses every allocation (the file-size limit stands in for ENOSPC where the test
// may not mount): writes wait, nothing is lost, and the refusal is counted.
TEST_F(DiskTierTest, AFileSizeLimitRefusesGrowthAndWritesWait) {
  struct Limit {
    Limit() {
      ::getrlimit(RLIMIT_FSIZE, &saved);
      rlimit tight = saved;
      tight.rlim_cur = 16 * 1024;
      ::setrlimit(RLIMIT_FSIZE, &tight);
      old_handler = std::signal(SIGXFSZ, SIG_IGN);
    }
    ~Limit() {
      ::setrlimit(RLIMIT_FSIZE, &saved);
      std::signal(SIGXFSZ, old_handler);
    }
    rlimit saved{};
    void (*old_handler)(int) = nullptr;
  } limit;
  auto t = open(options(dir_.string()));
  ASSERT_NE(t, nullptr);
  AlignedBlocks buf(1);
  DoneFuture f;
  ASSERT_TRUE(t->write(1, buf.block(0), 0, f.done()).ok());
  EXPECT_FALSE(t->drain(50ms));
  EXPECT_GE(counters_.disk_grow_failures.load(), 1u);
  EXPECT_EQ(t->allocatedBlocks(), 0u);
  EXPECT_EQ(f.future.wait_for(0s), std::future_status::timeout);  // still owned by the caller
  t.reset();
  EXPECT_TRUE(absl::IsCancelled(f.get()));
}

TEST_F(DiskTierTest, ASlowDiskBoundsTheQueueAndFinishesEverything) {
  auto o = options(dir_.string());
  o.fault_io_delay = 20 * kNanosPerMilli;
  o.queue_depth = 2;
  o.max_queued_writes = 4;
  auto t = open(o);
  AlignedBlocks buf(5);
  std::vector<DoneFuture> futures(4);
  for (BlockKey k = 0; k < 4; ++k) {
    auto bytes = payloadOf(k, kBlock);
    std::memcpy(buf.block(k).data(), bytes.data(), kBlock);
    ASSERT_TRUE(t->write(k, buf.block(k), blockChecksum(bytes), futures[k].done()).ok());
  }
  EXPECT_TRUE(absl::IsUnavailable(t->write(4, buf.block(4), 0, [](absl::Status) {})));
  EXPECT_EQ(t->queuedWrites(), 4u);
  for (auto& f : futures) EXPECT_TRUE(f.get().ok());
  EXPECT_TRUE(t->drain(1s));
  EXPECT_EQ(t->blocks(), 4u);
}

TEST_F(DiskTierTest, ABlockBeingReadIsNotEvictedUnderTheRead) {
  auto o = options(dir_.string(), 4);
  o.fault_io_delay = 30 * kNanosPerMilli;  // keeps the read in flight while the write evicts
  auto t = open(o);
  AlignedBlocks buf(3);
  for (BlockKey k = 1; k <= 4; ++k) ASSERT_TRUE(writeBlock(*t, k, buf.block(0)).ok());
  // Block 1 is the least recent: the next victim, but pinned by its read from here on.
  DoneFuture read, write;
  t->read(1, buf.block(1), read.done());
  auto bytes = payloadOf(5, kBlock);
  std::memcpy(buf.block(2).data(), bytes.data(), kBlock);
  ASSERT_TRUE(t->write(5, buf.block(2), blockChecksum(bytes), write.done()).ok());
  ASSERT_TRUE(read.get().ok());
  ASSERT_TRUE(write.get().ok());
  EXPECT_TRUE(holdsPayloadOf(1, buf.block(1).first(kBlock)));
  EXPECT_TRUE(t->contains(1));
  EXPECT_FALSE(t->contains(2));  // the eviction skipped to the next block
  EXPECT_EQ(counters_.droppedBy(DropReason::kCapacity), 1u);
  // The read made block 1 recent: the next write evicts 3, not 1.
  ASSERT_TRUE(writeBlock(*t, 6, buf.block(0)).ok());
  EXPECT_TRUE(t->contains(1));
  EXPECT_FALSE(t->contains(3));
}

TEST_F(DiskTierTest, WritesWaitForTheBatchWindowOrAFullBatch) {
  auto o = options(dir_.string());
  o.batch_window = 60 * kNanosPerSecond;
  o.batch_bytes = 2 * kBlock;
  auto t = open(o);
  AlignedBlocks buf(2);
  DoneFuture first, second;
  ASSERT_TRUE(t->write(1, buf.block(0), 0, first.done()).ok());
  EXPECT_EQ(first.future.wait_for(20ms), std::future_status::timeout);  // alone, it waits
  ASSERT_TRUE(t->write(2, buf.block(1), 0, second.done()).ok());        // the batch is full
  EXPECT_TRUE(first.get().ok());
  EXPECT_TRUE(second.get().ok());
  t.reset();
  // A full queue cannot grow into a batch: its writes go at once.
  dir_ = kvf::testing::freshTempDir("disk_tier_queue_full");
  o.dir = dir_.string();
  o.max_queued_writes = 1;
  auto single = open(o);
  DoneFuture third;
  ASSERT_TRUE(single->write(3, buf.block(0), 0, third.done()).ok());
  EXPECT_TRUE(third.get().ok());
}

TEST_F(DiskTierTest, RemovingABlockCancelsItsPendingWrite) {
  auto o = options(dir_.string());
  o.batch_window = 60 * kNanosPerSecond;
  auto t = open(o);
  AlignedBlocks buf(1);
  DoneFuture f;
  ASSERT_TRUE(t->write(3, buf.block(0), 0, f.done()).ok());
  EXPECT_TRUE(t->remove(3));
  EXPECT_TRUE(t->drain(5s));
  EXPECT_TRUE(absl::IsCancelled(f.get()));
  EXPECT_FALSE(t->contains(3));
}

TEST_F(DiskTierTest, ASecondUserOfTheDirectoryIsRefused) {
  auto t = open(options(dir_.string()));
  auto second = DiskTier::create(options(dir_.string()), &counters_, nullptr);
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(second.status())) << second.status();
}

TEST_F(DiskTierTest, TheRateLimitPacesWrites) {
  auto o = options(dir_.string());
  o.write_bytes_per_second = 100 * diskSlotBytes(kBlock);  // 100 blocks/s
  auto t = open(o);
  AlignedBlocks buf(1);
  for (BlockKey k = 0; k < 3; ++k) ASSERT_TRUE(writeBlock(*t, k, buf.block(0)).ok());
  EXPECT_EQ(t->blocks(), 3u);
}

TEST(DiskFormatTest, HeadersAndMetaRoundTripAndRejectDamage) {
  std::vector<std::byte> sector(kDiskSector);
  encodeSlotHeader({42, 100, 7, 9}, sector);
  auto h = decodeSlotHeader(sector);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->key, 42u);
  EXPECT_EQ(h->payload_bytes, 100u);
  EXPECT_EQ(h->checksum, 7u);
  EXPECT_EQ(h->sequence, 9u);
  sector[17] ^= std::byte{1};
  EXPECT_FALSE(decodeSlotHeader(sector).has_value());
  DiskGeometry g{10000, 16384, 4};
  auto back = decodeMeta(encodeMeta(g));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, g);
  EXPECT_FALSE(decodeMeta("kvfabric-disk-tier 1\nblock_bytes x\n").ok());
  EXPECT_FALSE(decodeMeta("something else\n").ok());
}

}  // namespace
}  // namespace kvf::worker
