// Multi-process transport tests on loopback, over shared memory and TCP: this process and a
// kvf-transport-peer child push thousands of blocks with checksums both ways, read them with
// one-sided gets, detect a corrupted block, and survive kill -9 of either side mid-batch with an
// error inside the deadline.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstring>
#include <future>
#include <sstream>

#include "common/process.h"
#include "common/strings.h"
#include "tests/testing/child_process.h"
#include "tests/transport/peer_layout.h"
#include "transport/base64.h"
#include "transport/transport.h"

namespace kvf::transport {
namespace {

using namespace std::chrono_literals;

// How long a test waits for what must happen (a child's line, its exit, a completion), and the
// deadline of a transfer that must succeed: a loaded machine always gets there by then.
constexpr auto kAmple = 20s;
// Past a short deadline under test, the time a loaded machine may take to report it.
constexpr auto kDeadlineSlack = 4s;

constexpr uint64_t kBlocks = 4096;
constexpr uint64_t kBlock = 16384;
constexpr uint64_t kSeed = 11;

std::string peerBinary() {
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string path(self, n > 0 ? static_cast<size_t>(n) : 0);
  return path.substr(0, path.rfind('/')) + "/kvf-transport-peer";
}

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

class MultiProcessTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    TransportOptions options;
    options.name = "test";
    options.transports = GetParam();
    if (GetParam() == "tcp") options.net_devices = "lo";
    auto ctx = TransportContext::create(options);
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    ctx_ = std::move(*ctx);
    // UCX-allocated (shared) memory: same-host peers write into it one-sided.
    auto region = ctx_->allocateMemory(kBlocks * kBlock);
    ASSERT_TRUE(region.ok()) << region.status();
    region_ = *region;
    memory_ = static_cast<char*>(region_->data());
    testing::fillPattern(memory_, kBlocks * kBlock, kSeed);
  }

  std::unique_ptr<Process> spawn(const std::string& role, std::vector<std::string> extra) {
    std::vector<std::string> argv = {peerBinary(),
                                     "--role=" + role,
                                     "--transports=" + GetParam(),
                                     "--blocks=" + std::to_string(kBlocks),
                                     "--block_size=" + std::to_string(kBlock),
                                     "--seed=" + std::to_string(kSeed)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return kvf::testing::startPiped(argv);
  }

  // The line telling a sender child where to write: our worker, region key and base, landing.
  std::string targetLine(uint64_t landing_id) {
    return kvf::strCat("TARGET ", base64Encode(ctx_->workerAddress()), " ",
                       base64Encode(region_->packedRkey()), " ", region_->base(), " ", landing_id);
  }

  // Starts a receiver child and returns the put request that targets its landing.
  PutRequest connectToReceiver(Process& child) {
    PutRequest req;
    auto addr_line = child.readUntil("ADDR", kAmple);
    EXPECT_TRUE(addr_line.has_value());
    if (!addr_line) return req;
    auto w = words(*addr_line);
    EXPECT_EQ(w.size(), 4u);
    EXPECT_TRUE(child.writeLine("SENDER " + base64Encode(ctx_->workerAddress())).ok());
    auto landing_line = child.readUntil("LANDING", kAmple);
    EXPECT_TRUE(landing_line.has_value());
    if (!landing_line || w.size() != 4) return req;
    req.source = region_;
    req.peer_address = *base64Decode(w[1]);
    req.peer_rkey = *base64Decode(w[2]);
    req.blocks = testing::layoutBlocks(kBlocks, kBlock, kSeed, std::stoull(w[3]));
    req.landing_id = std::stoull(words(*landing_line)[1]);
    req.checksums = ChecksumMode::kCompute;
    req.deadline = 1000ms;
    return req;
  }

  std::unique_ptr<TransportContext> ctx_;
  char* memory_ = nullptr;
  std::shared_ptr<MemoryRegion> region_;
};

TEST_P(MultiProcessTest, PushesThousandsOfBlocksIntoAnotherProcess) {
  auto child = spawn("receiver", {"--deadline_ms=20000"});
  PutRequest req = connectToReceiver(*child);
  ASSERT_FALSE(req.blocks.empty());
  req.deadline = kAmple;  // this put must succeed, however busy the machine
  auto handle = ctx_->postPut(req, nullptr);
  ASSERT_TRUE(handle.ok()) << handle.status();
  ASSERT_TRUE((*handle)->waitFor(kAmple));
  auto result = (*handle)->result();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->blocks, kBlocks);
  EXPECT_EQ(result->checksums.size(), kBlocks);
  auto verdict = child->readUntil("RESULT", kAmple);
  ASSERT_TRUE(verdict.has_value());
  EXPECT_EQ(*verdict, "RESULT OK ");
  EXPECT_EQ(child->wait(kAmple), ExitStatus::exited(0));
}

TEST_P(MultiProcessTest, ReceivesThousandsOfBlocksFromAnotherProcess) {
  auto child = spawn("sender", {"--deadline_ms=20000"});
  auto addr_line = child->readUntil("ADDR", kAmple);
  ASSERT_TRUE(addr_line.has_value());
  LandingSpec spec;
  spec.sender_address = *base64Decode(words(*addr_line)[1]);
  std::memset(memory_, 0, kBlocks * kBlock);
  spec.blocks = testing::layoutBlocks(kBlocks, kBlock, kSeed, region_->base());
  spec.deadline = kAmple;
  spec.verify_checksums = true;
  auto landing = ctx_->expectPut(region_, spec, nullptr);
  ASSERT_TRUE(landing.ok()) << landing.status();
  ASSERT_TRUE(child->writeLine(targetLine((*landing)->id())).ok());
  ASSERT_TRUE((*landing)->waitFor(kAmple));
  EXPECT_TRUE((*landing)->check().ok()) << (*landing)->check();
  EXPECT_TRUE((*landing)->resolved());
  std::vector<char> expected(kBlocks * kBlock);
  testing::fillPattern(expected.data(), expected.size(), kSeed);
  for (const auto& b : spec.blocks) {
    ASSERT_EQ(std::memcmp(memory_ + (b.remote_addr - region_->base()),
                          expected.data() + b.local_offset, kBlock),
              0);
  }
  EXPECT_EQ(child->readUntil("RESULT", kAmple), "RESULT OK ");
  EXPECT_EQ(child->wait(kAmple), ExitStatus::exited(0));
}

TEST_P(MultiProcessTest, CorruptedBlockIsAChecksumMismatch) {
  auto child = spawn("sender", {"--corrupt_block=1234", "--deadline_ms=20000"});
  auto addr_line = child->readUntil("ADDR", kAmple);
  ASSERT_TRUE(addr_line.has_value());
  LandingSpec spec{*base64Decode(words(*addr_line)[1]),
                   testing::layoutBlocks(kBlocks, kBlock, kSeed, region_->base()), kAmple, true};
  auto landing = ctx_->expectPut(region_, spec, nullptr);
  ASSERT_TRUE(landing.ok());
  ASSERT_TRUE(child->writeLine(targetLine((*landing)->id())).ok());
  ASSERT_TRUE((*landing)->waitFor(kAmple));
  EXPECT_EQ((*landing)->check().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string((*landing)->check().message()).find("block 1234"), std::string::npos)
      << (*landing)->check();
  EXPECT_EQ(ctx_->stats().checksum_mismatches, 1u);
  EXPECT_EQ(child->wait(kAmple),
            ExitStatus::exited(0));  // the sender did its part; the receiver judged the data
}

TEST_P(MultiProcessTest, ReceiverKilledMidBatchFailsTheSenderWithinItsDeadline) {
  auto child = spawn("receiver", {"--deadline_ms=60000"});
  PutRequest req = connectToReceiver(*child);
  ASSERT_FALSE(req.blocks.empty());
  req.landing_id = 0;
  // Keep batches in flight, kill the receiver under them, and keep posting after.
  std::vector<std::shared_ptr<PutHandle>> handles;
  auto killed_at = std::chrono::steady_clock::time_point::max();
  for (int n = 0; n < 400; ++n) {
    auto handle = ctx_->postPut(req, nullptr);
    ASSERT_TRUE(handle.ok()) << handle.status();
    handles.push_back(*handle);
    if (n == 3) {
      killed_at = std::chrono::steady_clock::now();
      child->kill();
    }
    if (n > 3 && (*handle)->waitFor(3s) && !(*handle)->check().ok()) break;
  }
  ASSERT_TRUE(child->wait(kAmple).has_value());
  size_t failed = 0;
  for (auto& h : handles) {
    ASSERT_TRUE(h->waitFor(kAmple)) << "a put is stuck after the receiver died";
    if (!h->check().ok()) ++failed;
  }
  auto detect = std::chrono::steady_clock::now() - killed_at;
  EXPECT_GT(failed, 0u);
  EXPECT_LT(detect, 1000ms + kDeadlineSlack);  // the puts' deadline (1 s) + a loaded machine
  EXPECT_FALSE(handles.back()->check().ok()) << "puts to a dead peer must fail";
  EXPECT_GE(ctx_->stats().peer_failures + ctx_->stats().puts_failed, 1u);
  // The source region is released once nothing reads from it any more.
  std::promise<void> released;
  region_->release([&] { released.set_value(); });
  EXPECT_EQ(released.get_future().wait_for(kAmple), std::future_status::ready);
}

TEST_P(MultiProcessTest, SenderKilledMidBatchFailsTheLandingAndFreesTheRegion) {
  auto child = spawn("sender", {"--repeat=100000", "--deadline_ms=1000"});
  auto addr_line = child->readUntil("ADDR", kAmple);
  ASSERT_TRUE(addr_line.has_value());
  LandingSpec spec{*base64Decode(words(*addr_line)[1]),
                   testing::layoutBlocks(kBlocks, kBlock, kSeed, region_->base()), kAmple, true};
  auto landing = ctx_->expectPut(region_, spec, nullptr);
  ASSERT_TRUE(landing.ok());
  ASSERT_TRUE(child->writeLine(targetLine((*landing)->id())).ok());
  ASSERT_TRUE(child->readUntil("BATCH 2", kAmple).has_value());  // writes are flowing
  auto killed_at = std::chrono::steady_clock::now();
  child->kill();
  ASSERT_TRUE((*landing)->waitFor(kAmple)) << "landing stuck after the sender died";
  EXPECT_EQ((*landing)->check().code(), absl::StatusCode::kUnavailable) << (*landing)->check();
  // The sender's death, not the landing's deadline, resolved it.
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, kAmple / 2);
  EXPECT_TRUE((*landing)->resolved());  // the sender is gone: nothing can land any more
  std::promise<void> released;
  region_->release([&] { released.set_value(); });
  EXPECT_EQ(released.get_future().wait_for(kAmple), std::future_status::ready);
  EXPECT_TRUE(child->wait(kAmple).has_value());
}

// Reads (one-sided gets) from a holder child: every block of its pattern lands here scattered,
// checked against the checksums of the pattern and byte for byte.
TEST_P(MultiProcessTest, ReadsThousandsOfBlocksFromAnotherProcess) {
  auto child = spawn("holder", {});
  auto addr_line = child->readUntil("ADDR", kAmple);
  ASSERT_TRUE(addr_line.has_value());
  auto w = words(*addr_line);
  ASSERT_EQ(w.size(), 5u);
  GetRequest req;
  req.destination = region_;
  req.peer_address = *base64Decode(w[1]);
  req.peer_rkey = *base64Decode(w[2]);
  const uint64_t peer_base = std::stoull(w[3]);  // the key carries it too; postGet checks it
  // Block i of the holder (its pattern at i*kBlock) lands in our slot perm[i].
  for (const auto& b : testing::layoutBlocks(kBlocks, kBlock, kSeed, 0)) {
    req.blocks.push_back({b.remote_addr, peer_base + b.local_offset, kBlock});
  }
  std::vector<char> expected(kBlocks * kBlock);
  testing::fillPattern(expected.data(), expected.size(), kSeed);
  for (const auto& b : req.blocks) {
    req.expected_checksums.push_back(
        blockChecksum(expected.data() + (b.remote_addr - peer_base), kBlock));
  }
  std::memset(memory_, 0, kBlocks * kBlock);
  req.deadline = kAmple;
  auto handle = ctx_->postGet(req, nullptr);
  ASSERT_TRUE(handle.ok()) << handle.status();
  ASSERT_TRUE((*handle)->waitFor(kAmple));
  auto result = (*handle)->result();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->bytes, kBlocks * kBlock);
  EXPECT_TRUE((*handle)->drained());
  for (const auto& b : req.blocks) {
    ASSERT_EQ(std::memcmp(memory_ + b.local_offset, expected.data() + (b.remote_addr - peer_base),
                          kBlock),
              0);
  }
  EXPECT_EQ(ctx_->stats().gets_ok, 1u);
  child->closeStdin();
  EXPECT_EQ(child->wait(kAmple), ExitStatus::exited(0));
}

TEST_P(MultiProcessTest, HolderKilledMidReadFailsTheGetWithinItsDeadline) {
  auto child = spawn("holder", {});
  auto addr_line = child->readUntil("ADDR", kAmple);
  ASSERT_TRUE(addr_line.has_value());
  auto w = words(*addr_line);
  ASSERT_EQ(w.size(), 5u);
  GetRequest req;
  req.destination = region_;
  req.peer_address = *base64Decode(w[1]);
  req.peer_rkey = *base64Decode(w[2]);
  const uint64_t peer_base = std::stoull(w[3]);  // the key carries it too; postGet checks it
  for (const auto& b : testing::layoutBlocks(kBlocks, kBlock, kSeed, 0)) {
    req.blocks.push_back({b.remote_addr, peer_base + b.local_offset, kBlock});
  }
  req.deadline = 1000ms;
  std::vector<std::shared_ptr<PutHandle>> handles;
  auto killed_at = std::chrono::steady_clock::time_point::max();
  for (int n = 0; n < 400; ++n) {
    auto handle = ctx_->postGet(req, nullptr);
    ASSERT_TRUE(handle.ok()) << handle.status();
    handles.push_back(*handle);
    if (n == 3) {
      killed_at = std::chrono::steady_clock::now();
      child->kill();
    }
    if (n > 3 && (*handle)->waitFor(3s) && !(*handle)->check().ok()) break;
  }
  ASSERT_TRUE(child->wait(kAmple).has_value());
  for (auto& h : handles) ASSERT_TRUE(h->waitFor(kAmple)) << "a get is stuck after the holder died";
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, 1000ms + kDeadlineSlack);  // deadline
  EXPECT_FALSE(handles.back()->check().ok()) << "reads from a dead peer must fail";
  EXPECT_GE(ctx_->stats().gets_failed, 1u);
  // The destination is released once no read can write into it any more.
  std::promise<void> released;
  region_->release([&] { released.set_value(); });
  EXPECT_EQ(released.get_future().wait_for(kAmple), std::future_status::ready);
}

INSTANTIATE_TEST_SUITE_P(Loopback, MultiProcessTest, ::testing::Values("shm", "tcp"));

}  // namespace
}  // namespace kvf::transport
