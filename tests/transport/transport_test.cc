// In-process tests of transport/: two TransportContexts in one process talk over shared memory
// and over TCP on loopback, exactly as two engine processes would (same UCX paths).
#include <gtest/gtest.h>

#include <algorithm>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <numeric>
#include <random>
#include <thread>
#include <tuple>

#include "tests/testing/poll.h"
#include "transport/asio_completion.h"
#include "transport/base64.h"
#include "transport/core.h"
#include "transport/remote_key.h"
#include "transport/transport.h"

namespace kvf::transport {
namespace {

using namespace std::chrono_literals;

// How long a test waits for what must happen, and the deadline of a transfer that must succeed:
// a loaded machine (ctest -j2 beside the sanitizer lanes) always gets there by then. Tests of a
// deadline keep their short one.
constexpr auto kAmple = 20s;

TEST(Base64, RoundTripsEveryLength) {
  std::string bytes;
  for (int i = 0; i < 300; ++i) {
    auto encoded = base64Encode(bytes);
    EXPECT_EQ(encoded.size() % 4, 0u);
    auto decoded = base64Decode(encoded);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, bytes);
    bytes.push_back(static_cast<char>(i * 37));
  }
  EXPECT_EQ(base64Encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(base64Encode("fo"), "Zm8=");
}

TEST(Base64, RejectsBadInput) {
  EXPECT_FALSE(base64Decode("abc").ok());
  EXPECT_FALSE(base64Decode("ab=c").ok());
  EXPECT_FALSE(base64Decode("a===").ok());
  EXPECT_FALSE(base64Decode("ab!d").ok());
  EXPECT_FALSE(base64Decode("AAAAAAAA", 5).ok());
  EXPECT_TRUE(base64Decode("AAAAAAAA", 6).ok());
}

struct Pair {
  std::vector<char> src, dst;  // declared first: destroyed after the contexts
  std::unique_ptr<TransportContext> sender, receiver;
  std::shared_ptr<MemoryRegion> src_region, dst_region;
};

Pair makePair(const std::string& transports, size_t bytes) {
  TransportOptions options;
  options.transports = transports;
  if (transports == "tcp") options.net_devices = "lo";
  options.name = "sender";
  Pair p;
  auto s = TransportContext::create(options);
  EXPECT_TRUE(s.ok()) << s.status();
  options.name = "receiver";
  auto r = TransportContext::create(options);
  EXPECT_TRUE(r.ok()) << r.status();
  p.sender = std::move(*s);
  p.receiver = std::move(*r);
  p.src.resize(bytes);
  p.dst.assign(bytes, 0);
  std::mt19937_64 rng(42);
  for (auto& c : p.src) c = static_cast<char>(rng());
  p.src_region = *p.sender->registerMemory(p.src.data(), bytes);
  p.dst_region = *p.receiver->registerMemory(p.dst.data(), bytes);
  return p;
}

// Blocks of `block` bytes; block i of the source goes to slot perm[i] of the target.
std::vector<BlockCopy> scatter(const Pair& p, size_t count, size_t block, bool shuffle) {
  std::vector<size_t> perm(count);
  std::iota(perm.begin(), perm.end(), 0);
  if (shuffle) std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
  std::vector<BlockCopy> blocks;
  for (size_t i = 0; i < count; ++i) {
    blocks.push_back({i * block, p.dst_region->base() + perm[i] * block, block});
  }
  return blocks;
}

class TransportTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TransportTest, PushesThousandsOfBlocksWithVerifiedChecksums) {
  constexpr size_t kBlocks = 4096, kBlock = 4096;
  Pair p = makePair(GetParam(), kBlocks * kBlock);
  auto blocks = scatter(p, kBlocks, kBlock, true);
  LandingSpec spec{p.sender->workerAddress(), blocks, kAmple, true};
  std::promise<absl::Status> landed;
  auto landing =
      p.receiver->expectPut(p.dst_region, spec, [&](absl::Status s) { landed.set_value(s); });
  ASSERT_TRUE(landing.ok()) << landing.status();
  EXPECT_EQ(p.dst_region->activeUsers(), 1u);

  PutRequest req;
  req.source = p.src_region;
  req.peer_address = p.receiver->workerAddress();
  req.peer_rkey = p.dst_region->packedRkey();
  req.blocks = blocks;
  req.deadline = kAmple;
  req.checksums = ChecksumMode::kCompute;
  req.landing_id = (*landing)->id();
  std::promise<absl::StatusOr<PutResult>> sent;
  auto handle = p.sender->postPut(req, [&](absl::StatusOr<PutResult> r) { sent.set_value(r); });
  ASSERT_TRUE(handle.ok()) << handle.status();
  auto result = sent.get_future().get();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->blocks, kBlocks);
  EXPECT_EQ(result->bytes, kBlocks * kBlock);
  EXPECT_EQ(result->checksums.size(), kBlocks);
  EXPECT_TRUE(result->new_endpoint);
  EXPECT_TRUE((*handle)->done());
  EXPECT_TRUE((*handle)->check().ok());

  auto lf = landed.get_future();
  ASSERT_EQ(lf.wait_for(kAmple), std::future_status::ready);
  EXPECT_TRUE(lf.get().ok());
  EXPECT_TRUE((*landing)->resolved());
  EXPECT_EQ(p.dst_region->activeUsers(), 0u);
  for (size_t i = 0; i < kBlocks; ++i) {
    const char* got = p.dst.data() + (blocks[i].remote_addr - p.dst_region->base());
    ASSERT_EQ(std::memcmp(got, p.src.data() + i * kBlock, kBlock), 0) << "block " << i;
  }
  // The second put to the same peer reuses the cached endpoint and rkey.
  req.landing_id = 0;
  auto again = p.sender->postPut(req, nullptr);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*again)->waitFor(kAmple));
  ASSERT_TRUE((*again)->result().ok()) << (*again)->check();
  EXPECT_FALSE((*again)->result()->new_endpoint);
  EXPECT_EQ(p.sender->stats().endpoints_created, 1u);
}

TEST_P(TransportTest, CoalescesAdjacentBlocks) {
  Pair p = makePair(GetParam(), 1 << 20);
  auto blocks = scatter(p, 64, 16384, false);
  PutRequest req{p.src_region, p.receiver->workerAddress(), p.dst_region->packedRkey(), blocks};
  auto handle = p.sender->postPut(req, nullptr);
  ASSERT_TRUE(handle.ok());
  ASSERT_TRUE((*handle)->waitFor(kAmple));
  auto result = (*handle)->result();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->operations, 1u);
  EXPECT_EQ(std::memcmp(p.src.data(), p.dst.data(), 1 << 20), 0);

  std::swap(blocks[3].remote_addr, blocks[9].remote_addr);  // breaks one run into five
  req.blocks = blocks;
  handle = p.sender->postPut(req, nullptr);
  ASSERT_TRUE(handle.ok());
  ASSERT_TRUE((*handle)->waitFor(kAmple));
  ASSERT_TRUE((*handle)->result().ok());
  EXPECT_EQ((*handle)->result()->operations, 5u);
}

TEST_P(TransportTest, DetectsACorruptedBlock) {
  Pair p = makePair(GetParam(), 64 * 16384);
  auto blocks = scatter(p, 64, 16384, true);
  std::vector<uint64_t> sums;
  for (size_t i = 0; i < blocks.size(); ++i) {
    sums.push_back(blockChecksum(p.src.data() + blocks[i].local_offset, blocks[i].length));
  }
  sums[17] ^= 1;  // what the receiver would see if block 17 were damaged on the way
  auto landing = p.receiver->expectPut(p.dst_region,
                                       {p.sender->workerAddress(), blocks, kAmple, true}, nullptr);
  ASSERT_TRUE(landing.ok());
  PutRequest req{p.src_region, p.receiver->workerAddress(), p.dst_region->packedRkey(), blocks};
  req.checksums = ChecksumMode::kProvided;
  req.provided_checksums = sums;
  req.landing_id = (*landing)->id();
  auto handle = p.sender->postPut(req, nullptr);
  ASSERT_TRUE(handle.ok());
  ASSERT_TRUE((*landing)->waitFor(kAmple));
  absl::Status status = (*landing)->check();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(std::string(status.message()).find("block 17"), std::string::npos) << status;
  EXPECT_EQ(p.receiver->stats().checksum_mismatches, 1u);
  EXPECT_TRUE((*landing)->resolved());  // the sender finished: memory is reusable
}

TEST_P(TransportTest, LandingTimesOutAndStaysQuarantinedUntilSenderCompletes) {
  Pair p = makePair(GetParam(), 16 * 16384);
  auto blocks = scatter(p, 16, 16384, false);
  auto landing =
      p.receiver->expectPut(p.dst_region, {p.sender->workerAddress(), blocks, 100ms}, nullptr);
  ASSERT_TRUE(landing.ok());
  ASSERT_TRUE((*landing)->waitFor(kAmple));
  EXPECT_EQ((*landing)->check().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE((*landing)->resolved());
  std::promise<void> released;
  p.dst_region->release([&] { released.set_value(); });
  auto rf = released.get_future();
  EXPECT_EQ(rf.wait_for(200ms), std::future_status::timeout);  // a sender may still write

  PutRequest req{p.src_region, p.receiver->workerAddress(), p.dst_region->packedRkey(), blocks};
  req.landing_id = (*landing)->id();
  auto handle = p.sender->postPut(req, nullptr);
  ASSERT_TRUE(handle.ok());
  EXPECT_EQ(rf.wait_for(kAmple), std::future_status::ready);  // the late notice resolves it
  EXPECT_TRUE((*landing)->resolved());
  EXPECT_EQ((*landing)->check().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_P(TransportTest, RejectsBadRequests) {
  Pair p = makePair(GetParam(), 1 << 16);
  PutRequest req{p.src_region,
                 p.receiver->workerAddress(),
                 p.dst_region->packedRkey(),
                 {{60000, p.dst_region->base(), 8192}}};
  EXPECT_EQ(p.sender->postPut(req, nullptr).status().code(), absl::StatusCode::kOutOfRange);
  req.blocks = {{0, p.dst_region->base(), 0}};
  EXPECT_EQ(p.sender->postPut(req, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  req.blocks = {{0, p.dst_region->base(), 4096}};
  req.checksums = ChecksumMode::kProvided;
  EXPECT_EQ(p.sender->postPut(req, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  req.checksums = ChecksumMode::kNone;
  req.peer_address = "not an address";
  auto handle = p.sender->postPut(req, nullptr);
  ASSERT_TRUE(handle.ok());
  ASSERT_TRUE((*handle)->waitFor(kAmple));
  EXPECT_EQ((*handle)->check().code(), absl::StatusCode::kInvalidArgument);
  auto landing = p.receiver->expectPut(
      p.dst_region, {p.sender->workerAddress(), {{0, p.dst_region->base() + 65536, 1}}}, nullptr);
  EXPECT_EQ(landing.status().code(), absl::StatusCode::kOutOfRange);
  TransportOptions bad;
  bad.transports = "tcp;rm -rf";
  EXPECT_EQ(TransportContext::create(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(TransportTest, CancelFailsThePutAndDeliversOnTheExecutor) {
  Pair p = makePair(GetParam(), 8 << 20);
  PutRequest req{p.src_region, p.receiver->workerAddress(), p.dst_region->packedRkey(),
                 scatter(p, 512, 16384, true)};
  boost::asio::io_context io;
  auto work = boost::asio::make_work_guard(io);
  absl::Status seen = absl::UnknownError("not called");
  auto handle = p.sender->postPut(
      req, onExecutor(io.get_executor(), [&](absl::StatusOr<PutResult> r) { seen = r.status(); }));
  ASSERT_TRUE(handle.ok());
  (*handle)->cancel();
  ASSERT_TRUE((*handle)->waitFor(kAmple));
  // Either the cancel won or the put finished first; both are exactly one completion.
  absl::StatusCode code = (*handle)->check().code();
  EXPECT_TRUE(code == absl::StatusCode::kCancelled || code == absl::StatusCode::kOk) << code;
  EXPECT_EQ(seen.code(), absl::StatusCode::kUnknown);  // not yet run: it waits for the executor
  EXPECT_EQ(io.run_one_for(kAmple), 1u);
  EXPECT_EQ(seen.code(), code);
  // The endpoint stays usable for the next put.
  auto next = p.sender->postPut(req, nullptr);
  ASSERT_TRUE(next.ok());
  ASSERT_TRUE((*next)->waitFor(kAmple));
  EXPECT_TRUE((*next)->check().ok()) << (*next)->check();
}

// The receiver reads the sender's region (a get) instead of the sender writing (a put).
GetRequest readAll(const Pair& p, const std::vector<BlockCopy>& pushes) {
  GetRequest req;
  req.destination = p.dst_region;
  req.peer_address = p.sender->workerAddress();
  req.peer_rkey = p.src_region->packedRkey();
  for (const auto& b : pushes) {
    req.blocks.push_back(
        {b.remote_addr - p.dst_region->base(), p.src_region->base() + b.local_offset, b.length});
  }
  req.deadline = kAmple;
  return req;
}

TEST_P(TransportTest, ReadsThousandsOfBlocksWithTheHoldersChecksums) {
  constexpr size_t kBlocks = 4096, kBlock = 4096;
  Pair p = makePair(GetParam(), kBlocks * kBlock);
  auto pushes = scatter(p, kBlocks, kBlock, true);
  GetRequest req = readAll(p, pushes);
  for (const auto& b : pushes) {
    req.expected_checksums.push_back(blockChecksum(p.src.data() + b.local_offset, b.length));
  }
  std::promise<absl::StatusOr<PutResult>> got;
  auto handle = p.receiver->postGet(req, [&](absl::StatusOr<PutResult> r) { got.set_value(r); });
  ASSERT_TRUE(handle.ok()) << handle.status();
  auto result = got.get_future().get();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->blocks, kBlocks);
  EXPECT_EQ(result->bytes, kBlocks * kBlock);
  EXPECT_EQ(result->checksums, req.expected_checksums);
  EXPECT_TRUE((*handle)->drained());
  for (const auto& b : pushes) {
    const char* landed = p.dst.data() + (b.remote_addr - p.dst_region->base());
    ASSERT_EQ(std::memcmp(landed, p.src.data() + b.local_offset, kBlock), 0);
  }
  EXPECT_EQ(p.receiver->stats().gets_ok, 1u);
  EXPECT_EQ(p.receiver->stats().bytes_got, kBlocks * kBlock);
  EXPECT_EQ(p.dst_region->activeUsers(), 0u);
  EXPECT_EQ(p.sender->stats().puts_ok, 0u);  // one-sided: the holder issued nothing
}

TEST_P(TransportTest, ReadCoalescesAdjacentBlocks) {
  Pair p = makePair(GetParam(), 1 << 20);
  GetRequest req = readAll(p, scatter(p, 64, 16384, false));
  auto handle = p.receiver->postGet(req, nullptr);
  ASSERT_TRUE(handle.ok());
  ASSERT_TRUE((*handle)->waitFor(kAmple));
  ASSERT_TRUE((*handle)->result().ok()) << (*handle)->check();
  EXPECT_EQ((*handle)->result()->operations, 1u);
  EXPECT_TRUE((*handle)->result()->checksums.empty());
  EXPECT_EQ(std::memcmp(p.src.data(), p.dst.data(), 1 << 20), 0);
}

TEST_P(TransportTest, ReadOfABlockThatChangedIsAChecksumMismatch) {
  Pair p = makePair(GetParam(), 64 * 16384);
  auto pushes = scatter(p, 64, 16384, true);
  GetRequest req = readAll(p, pushes);
  for (const auto& b : pushes) {
    req.expected_checksums.push_back(blockChecksum(p.src.data() + b.local_offset, b.length));
  }
  p.src[pushes[17].local_offset + 5] ^= 1;  // the holder reused block 17 after publishing it
  auto handle = p.receiver->postGet(req, nullptr);
  ASSERT_TRUE(handle.ok());
  ASSERT_TRUE((*handle)->waitFor(kAmple));
  absl::Status status = (*handle)->check();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(std::string(status.message()).find("block 17"), std::string::npos) << status;
  EXPECT_EQ(p.receiver->stats().checksum_mismatches, 1u);
  EXPECT_EQ(p.receiver->stats().gets_failed, 1u);
}

TEST_P(TransportTest, ReadRejectsRangesOutsideEitherRegion) {
  Pair p = makePair(GetParam(), 1 << 16);
  GetRequest good = readAll(p, {{0, p.dst_region->base(), 4096}});
  auto code = [&](const GetRequest& r) { return p.receiver->postGet(r, nullptr).status().code(); };
  GetRequest r = good;
  r.blocks[0].remote_addr = p.src_region->base() + (1 << 16) - 100;  // runs past the peer's end
  EXPECT_EQ(code(r), absl::StatusCode::kOutOfRange);
  r.blocks[0].remote_addr = p.src_region->base() - 1;  // before its start
  EXPECT_EQ(code(r), absl::StatusCode::kOutOfRange);
  r.blocks[0] = {0, UINT64_MAX - 10, 4096};  // a hostile address that wraps
  EXPECT_EQ(code(r), absl::StatusCode::kOutOfRange);
  r = good;
  auto key = parseRemoteKey(good.peer_rkey);
  ASSERT_TRUE(key.ok()) << key.status();
  r.peer_rkey = packRemoteKey(UINT64_MAX - 10, key->length, key->ucx);  // a region that wraps
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.blocks[0].local_offset = (1 << 16) - 100;  // past our own destination
  EXPECT_EQ(code(r), absl::StatusCode::kOutOfRange);
  r = good;
  r.blocks[0].length = 0;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.expected_checksums = {1, 2};
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.peer_rkey = packRemoteKey(key->base, 0, key->ucx);  // an empty region
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.peer_rkey = packRemoteKey(key->base, 8192, key->ucx);  // bounds narrower than the range
  r.blocks[0].remote_addr = key->base + 8192 - 100;
  EXPECT_EQ(code(r), absl::StatusCode::kOutOfRange);
  r = good;
  r.destination = p.src_region;  // a region of another context
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.blocks.clear();
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  auto handle = p.receiver->postGet(good, nullptr);  // nothing above reached UCX
  ASSERT_TRUE(handle.ok());
  ASSERT_TRUE((*handle)->waitFor(kAmple));
  EXPECT_TRUE((*handle)->check().ok()) << (*handle)->check();
  EXPECT_EQ(std::memcmp(p.src.data(), p.dst.data(), 4096), 0);
  EXPECT_EQ(p.receiver->stats().gets_refused, 6u);  // the remote ranges and keys above
}

TEST_P(TransportTest, MissedReadDeadlineHoldsTheDestinationUntilDrained) {
  Pair p = makePair(GetParam(), 16 << 20);
  GetRequest req = readAll(p, scatter(p, 1024, 16384, true));
  int expired = 0;
  for (int i = 0; i < 5; ++i) {
    req.deadline = std::chrono::milliseconds(1);
    auto handle = p.receiver->postGet(req, nullptr);
    ASSERT_TRUE(handle.ok());
    ASSERT_TRUE((*handle)->waitFor(kAmple)) << "get stuck past its deadline";
    absl::StatusCode code = (*handle)->check().code();
    EXPECT_TRUE(code == absl::StatusCode::kDeadlineExceeded || code == absl::StatusCode::kOk)
        << (*handle)->check();
    expired += code == absl::StatusCode::kDeadlineExceeded;
  }
  EXPECT_GT(expired, 0);
  req.deadline = kAmple;
  auto handle = p.receiver->postGet(req, nullptr);
  ASSERT_TRUE(handle.ok());
  ASSERT_TRUE((*handle)->waitFor(kAmple));
  EXPECT_TRUE((*handle)->check().ok()) << (*handle)->check();
  std::promise<void> released;  // only once every abandoned read drained
  p.dst_region->release([&] { released.set_value(); });
  EXPECT_EQ(released.get_future().wait_for(kAmple), std::future_status::ready);
  EXPECT_TRUE((*handle)->drained());
}

INSTANTIATE_TEST_SUITE_P(Loopback, TransportTest, ::testing::Values("shm", "tcp"));

}  // namespace
}  // namespace kvf::transport

namespace kvf::transport {
namespace {

TEST_P(TransportTest, MissedDeadlineFailsThePutAndTheContextRecovers) {
  Pair p = makePair(GetParam(), 16 << 20);
  PutRequest req{p.src_region, p.receiver->workerAddress(), p.dst_region->packedRkey(),
                 scatter(p, 1024, 16384, true)};
  int expired = 0;
  for (int i = 0; i < 5; ++i) {
    req.deadline = std::chrono::milliseconds(1);
    auto handle = p.sender->postPut(req, nullptr);
    ASSERT_TRUE(handle.ok());
    ASSERT_TRUE((*handle)->waitFor(kAmple)) << "put stuck past its deadline";
    absl::StatusCode code = (*handle)->check().code();
    EXPECT_TRUE(code == absl::StatusCode::kDeadlineExceeded || code == absl::StatusCode::kOk)
        << (*handle)->check();
    expired += code == absl::StatusCode::kDeadlineExceeded;
  }
  EXPECT_GT(expired, 0);
  req.deadline = kAmple;
  auto handle = p.sender->postPut(req, nullptr);
  ASSERT_TRUE(handle.ok());
  ASSERT_TRUE((*handle)->waitFor(kAmple));
  EXPECT_TRUE((*handle)->check().ok()) << (*handle)->check();
  std::promise<void> released;
  p.src_region->release([&] { released.set_value(); });
  EXPECT_EQ(released.get_future().wait_for(kAmple), std::future_status::ready);
}

}  // namespace
}  // namespace kvf::transport

#include "transport/transport_metrics.h"

namespace kvf::transport {
namespace {

// complete() skips the wakeup when nobody sleeps on the completion; a waiter that goes to
// sleep just as it completes must still be woken (not left to its timeout).
TEST(Completion, NeverLosesTheWakeupOfAWaiterRacingTheCompleter) {
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    Completion<absl::Status> completion;
    auto at = std::chrono::steady_clock::now() + std::chrono::nanoseconds(rng() % 30000);
    std::thread completer([&] {
      while (std::chrono::steady_clock::now() < at) {
      }
      EXPECT_TRUE(completion.complete(absl::DataLossError("x")));
    });
    auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(completion.waitFor(kAmple)) << "iteration " << i;
    // A lost wakeup waits out the timeout; a loaded machine may delay a woken waiter, by far less.
    EXPECT_LT(std::chrono::steady_clock::now() - start, kAmple / 2) << "iteration " << i;
    EXPECT_EQ(completion.value().code(), absl::StatusCode::kDataLoss);
    completer.join();
    EXPECT_FALSE(completion.complete(absl::OkStatus()));  // the first outcome stays
    EXPECT_EQ(completion.value().code(), absl::StatusCode::kDataLoss);
  }
  Completion<absl::Status> pending;
  EXPECT_FALSE(pending.done());
  EXPECT_EQ(pending.value().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(pending.waitFor(1ms));
}

TEST(TransportMetrics, ExportsCountersAtScrapeTime) {
  Pair p = makePair("shm", 1 << 16);
  metrics::Registry registry;
  exportMetrics(*p.sender, registry, {{"instance", "a"}});
  PutRequest req{p.src_region,
                 p.receiver->workerAddress(),
                 p.dst_region->packedRkey(),
                 {{0, p.dst_region->base(), 4096}}};
  auto handle = p.sender->postPut(req, nullptr);
  ASSERT_TRUE(handle.ok());
  ASSERT_TRUE((*handle)->waitFor(kAmple));
  std::string text = registry.exposition();
  EXPECT_NE(text.find("kvfabric_transport_puts_ok_total{instance=\"a\"} 1"), std::string::npos)
      << text;
  EXPECT_NE(text.find("kvfabric_transport_put_bytes_total{instance=\"a\"} 4096"), std::string::npos)
      << text;
}

}  // namespace
}  // namespace kvf::transport

#include <boost/asio/awaitable.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "tests/testing/io_thread.h"

namespace kvf::transport {
namespace {

TEST(AsyncPut, CompletesInACoroutineOnTheCallersExecutor) {
  // The io thread outlives the contexts: a progress thread can still be inside the post that
  // resumed the coroutine (signalling the io_context) when the test reaches its end, so the
  // contexts, whose destructors join their progress threads, go first.
  kvf::testing::IoThread io;
  Pair p = makePair("shm", 1 << 20);
  PutRequest req{p.src_region, p.receiver->workerAddress(), p.dst_region->packedRkey(),
                 scatter(p, 16, 65536, true)};
  std::thread::id before, after;
  auto result = io.run([&]() -> boost::asio::awaitable<absl::StatusOr<PutResult>> {
    before = std::this_thread::get_id();
    auto r = co_await asyncPut(*p.sender, req, boost::asio::use_awaitable);
    after = std::this_thread::get_id();
    co_return r;
  });
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->bytes, 16u * 65536);
  EXPECT_EQ(before, after);  // resumed on the io thread, not the transport's progress thread
  req.blocks[3].local_offset = 1 << 20;  // out of range: rejected, still one completion
  auto rejected = io.run([&]() -> boost::asio::awaitable<absl::StatusOr<PutResult>> {
    auto r = co_await asyncPut(*p.sender, req, boost::asio::use_awaitable);
    co_return r;
  });
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace kvf::transport

namespace kvf::transport {
namespace {

TEST(EndpointCache, EvictsTheLeastRecentlyUsedIdleEndpoint) {
  TransportOptions options;
  options.max_endpoints = 2;
  auto sender = TransportContext::create(options);
  ASSERT_TRUE(sender.ok());
  std::vector<std::unique_ptr<TransportContext>> peers;
  for (int i = 0; i < 3; ++i) peers.push_back(std::move(*TransportContext::create({})));
  std::vector<char> src(4096, 1), dst(4096 * 3, 0);
  auto source = (*sender)->registerMemory(src.data(), src.size());
  ASSERT_TRUE(source.ok());
  std::vector<std::shared_ptr<MemoryRegion>> targets;
  for (int i = 0; i < 3; ++i) {
    targets.push_back(*peers[i]->registerMemory(dst.data() + 4096 * i, 4096));
    PutRequest req{*source,
                   peers[i]->workerAddress(),
                   targets[i]->packedRkey(),
                   {{0, targets[i]->base(), 4096}}};
    auto handle = (*sender)->postPut(req, nullptr);
    ASSERT_TRUE(handle.ok());
    ASSERT_TRUE((*handle)->waitFor(kAmple));
    ASSERT_TRUE((*handle)->check().ok()) << (*handle)->check();
  }
  EXPECT_EQ((*sender)->stats().endpoints_cached, 2u);
  EXPECT_EQ((*sender)->stats().endpoints_created, 3u);
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 1), 3 * 4096);
}

}  // namespace
}  // namespace kvf::transport

#include "transport/peer_identity.h"

namespace kvf::transport {
namespace {

TEST(PeerIdentity, RoundTripsAndRejectsDamagedAddresses) {
  PeerIdentity id = localIdentity("ucx-address-bytes");
  std::string bytes = encodePeerAddress(id);
  auto back = decodePeerAddress(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->pid, id.pid);
  EXPECT_EQ(back->ucp_address, "ucx-address-bytes");
  EXPECT_TRUE(back->sameHostAs(id));
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_FALSE(decodePeerAddress(bytes.substr(0, cut)).ok()) << "truncated at " << cut;
  }
  EXPECT_FALSE(decodePeerAddress(bytes + "x").ok());
  std::string bad_magic = bytes;
  bad_magic[0] = 'X';
  EXPECT_FALSE(decodePeerAddress(bad_magic).ok());
}

TEST(Landing, CancelKeepsTheRegionQuarantinedUntilTheSenderCompletes) {
  Pair p = makePair("shm", 1 << 16);
  auto landing = p.receiver->expectPut(
      p.dst_region, {p.sender->workerAddress(), {{0, p.dst_region->base(), 4096}}, kAmple},
      nullptr);
  ASSERT_TRUE(landing.ok());
  (*landing)->cancel();
  ASSERT_TRUE((*landing)->waitFor(kAmple));
  EXPECT_EQ((*landing)->check().code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE((*landing)->resolved());
  std::promise<void> released;
  p.dst_region->release([&] { released.set_value(); });
  auto rf = released.get_future();
  EXPECT_EQ(rf.wait_for(100ms), std::future_status::timeout);
  // Closing our endpoint would not stop the sender's writes: refused.
  EXPECT_EQ(p.receiver->disconnect(p.sender->workerAddress()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(rf.wait_for(100ms), std::future_status::timeout);
  // The sender's late completion notice proves its writes are done: the region comes back.
  PutRequest req{p.src_region,
                 p.receiver->workerAddress(),
                 p.dst_region->packedRkey(),
                 {{0, p.dst_region->base(), 4096}}};
  req.landing_id = (*landing)->id();
  ASSERT_TRUE(p.sender->postPut(req, nullptr).ok());
  EXPECT_EQ(rf.wait_for(kAmple), std::future_status::ready);
  EXPECT_TRUE((*landing)->resolved());
  EXPECT_EQ((*landing)->check().code(), absl::StatusCode::kCancelled);  // first outcome stays
  EXPECT_TRUE(p.receiver->disconnect(p.sender->workerAddress()).ok());
}

TEST(Landing, AcceptsALeadingPrefixWhenAllowed) {
  Pair p = makePair("shm", 16 * 4096);
  auto blocks = scatter(p, 8, 4096, true);
  LandingSpec spec{p.sender->workerAddress(), blocks, kAmple, true};
  spec.allow_prefix = true;
  auto landing = p.receiver->expectPut(p.dst_region, spec, nullptr);
  ASSERT_TRUE(landing.ok());
  EXPECT_EQ((*landing)->landedBlocks(), 0u);
  PutRequest req{p.src_region, p.receiver->workerAddress(), p.dst_region->packedRkey(),
                 std::vector<BlockCopy>(blocks.begin(), blocks.begin() + 3)};
  req.checksums = ChecksumMode::kCompute;
  req.landing_id = (*landing)->id();
  ASSERT_TRUE(p.sender->postPut(req, nullptr).ok());
  ASSERT_TRUE((*landing)->waitFor(kAmple));
  EXPECT_TRUE((*landing)->check().ok()) << (*landing)->check();
  EXPECT_EQ((*landing)->landedBlocks(), 3u);
  EXPECT_TRUE((*landing)->resolved());
  // Without allow_prefix the same short batch is a mismatch; a non-prefix never matches.
  auto strict = p.receiver->expectPut(p.dst_region,
                                      {p.sender->workerAddress(), blocks, kAmple, true}, nullptr);
  ASSERT_TRUE(strict.ok());
  req.landing_id = (*strict)->id();
  ASSERT_TRUE(p.sender->postPut(req, nullptr).ok());
  ASSERT_TRUE((*strict)->waitFor(kAmple));
  EXPECT_EQ((*strict)->check().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ((*strict)->landedBlocks(), 0u);
  auto shifted = p.receiver->expectPut(p.dst_region, spec, nullptr);
  ASSERT_TRUE(shifted.ok());
  req.blocks = {blocks[1]};
  req.landing_id = (*shifted)->id();
  ASSERT_TRUE(p.sender->postPut(req, nullptr).ok());
  ASSERT_TRUE((*shifted)->waitFor(kAmple));
  EXPECT_EQ((*shifted)->check().code(), absl::StatusCode::kDataLoss);
}

// A sender that splits one landing over several puts (the CUDA staging ring) resolves it with
// one notice: the last put lists the earlier puts' blocks first (PutRequest::notice_prefix).
TEST(Landing, OneNoticeCoversBlocksOfEarlierPuts) {
  Pair p = makePair("shm", 16 * 4096);
  auto blocks = scatter(p, 8, 4096, true);
  auto landing = p.receiver->expectPut(p.dst_region,
                                       {p.sender->workerAddress(), blocks, kAmple, true}, nullptr);
  ASSERT_TRUE(landing.ok());
  PutRequest first{p.src_region, p.receiver->workerAddress(), p.dst_region->packedRkey(),
                   std::vector<BlockCopy>(blocks.begin(), blocks.begin() + 5)};
  first.checksums = ChecksumMode::kCompute;
  auto handle = p.sender->postPut(first, nullptr);
  ASSERT_TRUE(handle.ok());
  ASSERT_TRUE((*handle)->waitFor(kAmple));
  ASSERT_TRUE((*handle)->result().ok());
  EXPECT_FALSE((*landing)->resolved());  // no notice yet
  std::vector<NoticeBlock> prefix;
  for (size_t i = 0; i < 5; ++i) {
    prefix.push_back({blocks[i].remote_addr, blocks[i].length, (*handle)->result()->checksums[i]});
  }
  PutRequest rest{p.src_region, p.receiver->workerAddress(), p.dst_region->packedRkey(),
                  std::vector<BlockCopy>(blocks.begin() + 5, blocks.end())};
  rest.checksums = ChecksumMode::kCompute;
  rest.landing_id = (*landing)->id();
  rest.notice_prefix = prefix;
  ASSERT_TRUE(p.sender->postPut(rest, nullptr).ok());
  ASSERT_TRUE((*landing)->waitFor(kAmple));
  EXPECT_TRUE((*landing)->check().ok()) << (*landing)->check();
  EXPECT_EQ((*landing)->landedBlocks(), 8u);
  for (const auto& b : blocks) {
    EXPECT_EQ(std::memcmp(p.src.data() + b.local_offset,
                          reinterpret_cast<const void*>(b.remote_addr), b.length),
              0);
  }
  // A prefix whose checksum does not match what landed is caught like any other block.
  auto again = p.receiver->expectPut(p.dst_region,
                                     {p.sender->workerAddress(), blocks, kAmple, true}, nullptr);
  ASSERT_TRUE(again.ok());
  rest.landing_id = (*again)->id();
  rest.notice_prefix[2].checksum ^= 1;
  ASSERT_TRUE(p.sender->postPut(rest, nullptr).ok());
  ASSERT_TRUE((*again)->waitFor(kAmple));
  EXPECT_EQ((*again)->check().code(), absl::StatusCode::kDataLoss);
  // A prefix without a landing to notify is refused at once.
  PutRequest orphan = rest;
  orphan.landing_id = 0;
  EXPECT_EQ(p.sender->postPut(orphan, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Landing, DismissResolvesAtOnce) {
  Pair p = makePair("shm", 1 << 16);
  auto landing = p.receiver->expectPut(
      p.dst_region, {p.sender->workerAddress(), {{0, p.dst_region->base(), 4096}}, kAmple},
      nullptr);
  ASSERT_TRUE(landing.ok());
  (*landing)->dismiss();
  ASSERT_TRUE((*landing)->waitFor(kAmple));
  EXPECT_EQ((*landing)->check().code(), absl::StatusCode::kCancelled);
  // Resolved by the dismissal, well before the landing's deadline would resolve it.
  EXPECT_TRUE(kvf::testing::eventually([&] { return (*landing)->resolved(); }, kAmple / 2, 1ms));
  EXPECT_EQ(p.dst_region->activeUsers(), 0u);
  EXPECT_TRUE(p.receiver->disconnect(p.sender->workerAddress()).ok());
}

// A hostile put or get, run in a child process (a death test) so that a crash inside UCX fails
// the test instead of killing it. A put writes the receiver's region; a get (the NIXL read a
// decode instance issues with the holder's key) reads the sender's region into the receiver's.
// The child exits 0 when the transfer is refused before any UCX call with `code` (counted, the
// receiver's memory untouched), 1 when it was accepted, 2 on a refusal of the wrong kind; a crash
// ends it with a signal.
PutRequest hostileBase(const Pair& p, PutRequest*) {
  return {p.src_region,
          p.receiver->workerAddress(),
          p.dst_region->packedRkey(),
          {{0, p.dst_region->base(), 4096}}};
}
GetRequest hostileBase(const Pair& p, GetRequest*) {
  return readAll(p, {{0, p.dst_region->base(), 4096}});
}
absl::StatusOr<std::shared_ptr<PutHandle>> postHostile(const Pair& p, const PutRequest& r) {
  return p.sender->postPut(r, nullptr);
}
absl::StatusOr<std::shared_ptr<PutHandle>> postHostile(const Pair& p, const GetRequest& r) {
  return p.receiver->postGet(r, nullptr);
}
uint64_t refusals(const Pair& p, const PutRequest&) { return p.sender->stats().puts_refused; }
uint64_t refusals(const Pair& p, const GetRequest&) { return p.receiver->stats().gets_refused; }

template <class Request>
[[noreturn]] void refusedOrExit(const std::string& transports,
                                const std::function<void(const Pair&, Request&)>& craft,
                                absl::StatusCode code) {
  Pair p = makePair(transports, 1 << 16);
  Request req = hostileBase(p, static_cast<Request*>(nullptr));
  craft(p, req);
  auto handle = postHostile(p, req);
  if (handle.ok()) {
    (*handle)->waitFor(kAmple);
    std::fprintf(stderr, "accepted: %s\n", (*handle)->check().ToString().c_str());
    std::_Exit(1);
  }
  const bool untouched = std::all_of(p.dst.begin(), p.dst.end(), [](char c) { return c == 0; });
  std::fprintf(stderr, "refused: %s\n", handle.status().ToString().c_str());
  std::_Exit(handle.status().code() == code && untouched && refusals(p, req) == 1 ? 0 : 2);
}

// Parameters: the transports, and whether the hostile side is a put's receiver (its key and
// addresses steer a write) or a NIXL read's holder (they steer a read).
class HostilePeerDeathTest : public ::testing::TestWithParam<std::tuple<std::string, bool>> {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
  const std::string& transports() const { return std::get<0>(GetParam()); }
  bool read() const { return std::get<1>(GetParam()); }
  // Runs refusedOrExit for a put or a get, with `craft` applied to its key and blocks.
  void expectRefused(const std::function<void(const Pair&, std::string& rkey,
                                              std::vector<BlockCopy>& blocks)>& craft,
                     absl::StatusCode code, const char* why) {
    if (read()) {
      std::function<void(const Pair&, GetRequest&)> f = [craft](const Pair& p, GetRequest& r) {
        craft(p, r.peer_rkey, r.blocks);
      };
      EXPECT_EXIT(refusedOrExit(transports(), f, code), ::testing::ExitedWithCode(0), why);
    } else {
      std::function<void(const Pair&, PutRequest&)> f = [craft](const Pair& p, PutRequest& r) {
        craft(p, r.peer_rkey, r.blocks);
      };
      EXPECT_EXIT(refusedOrExit(transports(), f, code), ::testing::ExitedWithCode(0), why);
    }
  }
};

TEST_P(HostilePeerDeathTest, RemoteRangeOutsideThePeersRegionIsRefused) {
  // The peer's real key with an address that is not in its region: UCX would write or read
  // there.
  auto at = [this](uint64_t (*addr)(const MemoryRegion&)) {
    expectRefused(
        [addr, read = read()](const Pair& p, std::string&, std::vector<BlockCopy>& blocks) {
          const MemoryRegion& region = read ? *p.src_region : *p.dst_region;
          blocks = {{0, addr(region), 4096}};
        },
        absl::StatusCode::kOutOfRange, "outside the peer's region");
  };
  at([](const MemoryRegion&) -> uint64_t { return 4096; });
  at([](const MemoryRegion& r) { return r.base() + 65536 - 100; });
  at([](const MemoryRegion& r) { return r.base() - 4096; });
}

TEST_P(HostilePeerDeathTest, CraftedRemoteKeyNeverReachesUcx) {
  auto refused = [this](std::function<std::string(const RemoteKey&)> make, const char* why) {
    expectRefused([make](const Pair&, std::string& rkey,
                         std::vector<BlockCopy>&) { rkey = make(*parseRemoteKey(rkey)); },
                  absl::StatusCode::kInvalidArgument, why);
  };
  // UCX's own bytes, as a peer unaware of the envelope (or an attacker) would send them.
  refused([](const RemoteKey& k) { return k.ucx; }, "rkey: ");
  refused([](const RemoteKey& k) { return k.ucx + std::string(64, 'x'); },
          "not a kvfabric remote key");
  refused(
      [](const RemoteKey&) {
        std::string junk(200, '\0');
        std::mt19937_64 rng(3);
        for (auto& c : junk) c = static_cast<char>(rng());
        return junk;
      },
      "rkey: ");
  // Well-wrapped, but the UCX key inside names every memory domain.
  refused(
      [](const RemoteKey& k) {
        std::string ucx = k.ucx;
        std::memset(ucx.data(), 0xff, 8);
        return packRemoteKey(k.base, k.length, ucx);
      },
      "rkey: ");
  // A domain key longer than the bytes that follow it.
  refused(
      [](const RemoteKey& k) {
        std::string ucx = k.ucx;
        ucx[9] = static_cast<char>(0xff);
        return packRemoteKey(k.base, k.length, ucx);
      },
      "does not fit");
  // An unknown memory type, and a truncated key.
  refused(
      [](const RemoteKey& k) {
        std::string ucx = k.ucx;
        ucx[8] = static_cast<char>(0x7f);
        return packRemoteKey(k.base, k.length, ucx);
      },
      "unknown memory type");
  refused([](const RemoteKey& k) { return packRemoteKey(k.base, k.length, k.ucx.substr(0, 5)); },
          "truncated");
  // A region that wraps around the address space.
  refused([](const RemoteKey& k) { return packRemoteKey(~uint64_t{0} - 10, k.length, k.ucx); },
          "overflows");
}

INSTANTIATE_TEST_SUITE_P(Loopback, HostilePeerDeathTest,
                         ::testing::Combine(::testing::Values("shm", "tcp"), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, bool>>& p) {
                           return std::get<0>(p.param) + (std::get<1>(p.param) ? "_Get" : "_Put");
                         });

TEST(RemoteKey, RoundTripsAndBoundsTheRegion) {
  Pair p = makePair("shm", 1 << 16);
  auto key = parseRemoteKey(p.dst_region->packedRkey());
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(key->base, p.dst_region->base());
  EXPECT_EQ(key->length, p.dst_region->length());
  EXPECT_NE(key->md_map, 0u);
  EXPECT_TRUE(key->contains(p.dst_region->base(), 1 << 16));
  EXPECT_FALSE(key->contains(p.dst_region->base(), (1 << 16) + 1));
  EXPECT_FALSE(key->contains(p.dst_region->base() + 1, 1 << 16));
  EXPECT_FALSE(key->contains(p.dst_region->base() + 10, 0));
  EXPECT_FALSE(key->contains(~uint64_t{0} - 1, 4));
  std::string wrapped = p.dst_region->packedRkey();
  for (size_t cut = 0; cut < wrapped.size(); ++cut) {
    EXPECT_FALSE(parseRemoteKey(wrapped.substr(0, cut)).ok()) << cut;
  }
}

TEST(MemoryRegion, ReleaseWaitsForPutsReadingIt) {
  Pair p = makePair("tcp", 32 << 20);
  PutRequest req{p.src_region, p.receiver->workerAddress(), p.dst_region->packedRkey(),
                 scatter(p, 2048, 16384, true)};
  auto handle = p.sender->postPut(req, nullptr);
  ASSERT_TRUE(handle.ok());
  std::atomic<bool> released{false};
  p.src_region->release([&] { released = true; });
  ASSERT_TRUE((*handle)->waitFor(kAmple));
  EXPECT_TRUE((*handle)->check().ok()) << (*handle)->check();
  EXPECT_TRUE(kvf::testing::eventually([&] { return released.load(); }, kAmple, 10ms));
  auto late = p.sender->postPut(req, nullptr);  // a released region takes no new puts
  ASSERT_TRUE(late.ok());
  ASSERT_TRUE((*late)->waitFor(kAmple));
  EXPECT_EQ((*late)->check().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvf::transport
