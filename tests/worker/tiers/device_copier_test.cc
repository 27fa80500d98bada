// GPU tests of the DeviceCopier (label `gpu`): G1 <-> G2 copies on the copier's own streams,
// checked byte for byte, with per-chunk ready events, stream ordering against a compute stream,
// the in-flight bound and bad pointers. Ordering is made deterministic without kernels: a host
// function gates a stream until the test opens it. Skips (except the no-device case) without a
// CUDA device.
#include "worker/tiers/device_copier.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/cuda_device.h"
#include "tests/worker/tiers/tier_test_util.h"
#include "worker/tiers/tiered_store.h"

namespace kvf::worker {
namespace {

using namespace std::chrono_literals;

using testing::holdsPayloadOf;
using testing::payloadOf;

constexpr uint64_t kBlock = 256 << 10;

#define ASSERT_CUDA(expr)                                                   \
  do {                                                                      \
    cudaError_t cuda_error_ = (expr);                                       \
    ASSERT_EQ(cuda_error_, cudaSuccess) << cudaGetErrorString(cuda_error_); \
  } while (false)

// Holds a stream at a host function until open() (or a 20 s deadline, so a failing test ends).
class StreamGate {
 public:
  explicit StreamGate(cudaStream_t stream) : stream_(stream) {
    EXPECT_EQ(cudaLaunchHostFunc(stream, &StreamGate::hold, this), cudaSuccess);
  }
  ~StreamGate() {
    open();
    cudaStreamSynchronize(stream_);  // hold() reads this object: let it return first
  }
  void open() { open_.store(true, std::memory_order_release); }

 private:
  static void hold(void* self) {
    auto* gate = static_cast<StreamGate*>(self);
    auto deadline = std::chrono::steady_clock::now() + 20s;
    while (!gate->open_.load(std::memory_order_acquire) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
  }
  cudaStream_t stream_;
  std::atomic<bool> open_{false};
};

// A store, device memory for `blocks` blocks, and a compute stream.
class DeviceCopierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KVF_SKIP_WITHOUT_CUDA_DEVICE();
    TieredStoreOptions o;
    o.host.block_bytes = kBlock;
    o.host.capacity_bytes = 64 * kBlock;
    o.host.pin = PinMode::kRequired;
    auto store = TieredStore::create(o);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    ASSERT_EQ(store_->hostPinKind(), PinKind::kCudaHost);
    ASSERT_CUDA(cudaMalloc(&device_, 64 * kBlock));
    ASSERT_CUDA(cudaMemset(device_, 0xEE, 64 * kBlock));
    ASSERT_CUDA(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    ASSERT_CUDA(cudaHostAlloc(&staging_, 64 * kBlock, cudaHostAllocDefault));
  }
  void TearDown() override {
    copier_.reset();
    if (compute_ != nullptr) cudaStreamDestroy(compute_);
    if (device_ != nullptr) cudaFree(device_);
    if (staging_ != nullptr) cudaFreeHost(staging_);
  }
  void makeCopier(DeviceCopierOptions options = {}) {
    auto copier = DeviceCopier::create(*store_, options);
    ASSERT_TRUE(copier.ok()) << copier.status();
    copier_ = std::move(*copier);
  }
  std::byte* block(size_t i) { return static_cast<std::byte*>(device_) + i * kBlock; }
  std::byte* staged(size_t i) { return static_cast<std::byte*>(staging_) + i * kBlock; }
  // Puts keys [first, first + n) into host memory.
  void storeKeys(BlockKey first, size_t n) {
    for (BlockKey k = first; k < first + n; ++k) {
      ASSERT_TRUE(store_->offload(k, payloadOf(k, kBlock)).ok());
    }
  }
  // Stores keys 0..n-1 and onboards key i into device block i.
  absl::StatusOr<std::shared_ptr<DeviceOnboard>> onboardKeys(size_t n) {
    storeKeys(0, n);
    std::vector<BlockKey> keys;
    std::vector<void*> destinations;
    for (size_t i = 0; i < n; ++i) {
      keys.push_back(i);
      destinations.push_back(block(i));
    }
    return copier_->onboard(keys, destinations);
  }
  // Reads device block i back (synchronously).
  std::vector<std::byte> readBack(size_t i) {
    std::vector<std::byte> out(kBlock);
    EXPECT_EQ(cudaMemcpy(out.data(), block(i), kBlock, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
  // What host memory holds for `key`, read through the store's own onboard.
  bool hostHoldsPayload(BlockKey key) {
    std::vector<std::byte> out(kBlock);
    std::span<std::byte> dst(out);
    auto ticket = store_->onboard(std::span(&key, 1), std::span(&dst, 1));
    return ticket->waitAll(10s) && ticket->state(0) == OnboardState::kReady &&
           holdsPayloadOf(key, out);
  }

  std::unique_ptr<TieredStore> store_;
  std::unique_ptr<DeviceCopier> copier_;
  void* device_ = nullptr;
  void* staging_ = nullptr;
  cudaStream_t compute_ = nullptr;
};

TEST(DeviceCopierNoDevice, CreateIsFailedPreconditionWithoutDevice) {
  if (kvf::testing::whyNoCudaDevice().empty()) GTEST_SKIP() << "a device is present";
  TieredStoreOptions o;
  o.host.block_bytes = kBlock;
  o.host.capacity_bytes = 4 * kBlock;
  auto store = TieredStore::create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  auto copier = DeviceCopier::create(**store, {});
  ASSERT_FALSE(copier.ok());
  EXPECT_EQ(copier.status().code(), absl::StatusCode::kFailedPrecondition) << copier.status();
}

class DeviceCopierPathTest : public DeviceCopierTest, public ::testing::WithParamInterface<bool> {};

// G1 -> G2 -> G1, both paths: every block arrives as itself, in the slot of its own key.
TEST_P(DeviceCopierPathTest, BlocksRoundTripByteForByte) {
  DeviceCopierOptions options;
  options.batched_copies = GetParam();
  options.blocks_per_event = 4;
  makeCopier(options);
  constexpr size_t kN = 16;
  for (size_t i = 0; i < kN; ++i) {
    auto p = payloadOf(100 + i, kBlock);
    ASSERT_CUDA(cudaMemcpy(block(i), p.data(), kBlock, cudaMemcpyHostToDevice));
  }
  std::vector<BlockKey> keys;
  std::vector<const void*> sources;
  for (size_t i = 0; i < kN; ++i) {
    keys.push_back(100 + i);
    sources.push_back(block(i));
  }
  auto off = copier_->offloadAfter(keys, sources, compute_);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ((*off)->accepted(), kN);
  ASSERT_TRUE(copier_->drain().ok());
  ASSERT_TRUE((*off)->durable());
  if (!GetParam()) {
    EXPECT_EQ((*off)->path(), CopyPath::kPerBlock);
  }
  for (size_t i = 0; i < kN; ++i) EXPECT_TRUE(hostHoldsPayload(100 + i)) << "key " << 100 + i;

  // Back into other device blocks, reversed, so a block landing in the wrong place shows.
  std::vector<void*> destinations;
  for (size_t i = 0; i < kN; ++i) destinations.push_back(block(32 + (kN - 1 - i)));
  const uint64_t onboarded_before = store_->stats().host_onboarded;  // the store's own reads
  auto on = copier_->onboard(keys, destinations);
  ASSERT_TRUE(on.ok()) << on.status();
  ASSERT_EQ((*on)->size(), kN);
  ASSERT_TRUE((*on)->synchronize().ok());
  EXPECT_EQ((*on)->readyPrefix(), kN);
  for (size_t i = 0; i < kN; ++i) {
    EXPECT_TRUE(holdsPayloadOf(100 + i, readBack(32 + (kN - 1 - i)))) << "block " << i;
  }
  copier_->poll();
  EXPECT_TRUE((*on)->done());
  EXPECT_EQ(copier_->onboardsInFlight(), 0u);
  EXPECT_EQ(store_->host().usage().evictable, store_->host().usage().resident);  // unpinned
  // The host tier's counter sees the DMA too.
  EXPECT_EQ(store_->stats().host_onboarded - onboarded_before, kN);
}

INSTANTIATE_TEST_SUITE_P(BatchedAndPerBlock, DeviceCopierPathTest, ::testing::Bool());

TEST_F(DeviceCopierTest, OnboardCopiesTheLeadingRunOnly) {
  makeCopier();
  storeKeys(0, 2);
  storeKeys(3, 1);  // key 2 is missing
  std::vector<BlockKey> keys{0, 1, 2, 3};
  std::vector<void*> destinations{block(0), block(1), block(2), block(3)};
  auto on = copier_->onboard(keys, destinations);
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ((*on)->requested(), 4u);
  EXPECT_EQ((*on)->size(), 2u);
  ASSERT_TRUE((*on)->synchronize().ok());
  EXPECT_TRUE(holdsPayloadOf(0, readBack(0)));
  EXPECT_TRUE(holdsPayloadOf(1, readBack(1)));
  EXPECT_EQ(readBack(3)[0], std::byte{0xEE});  // key 3 was not copied past the gap
}

// readyPrefix never goes back, moves in whole chunks, and reaches the batch's size.
TEST_F(DeviceCopierTest, ReadyPrefixIsMonotoneAndReachesN) {
  DeviceCopierOptions options;
  options.blocks_per_event = 4;
  makeCopier(options);
  constexpr size_t kN = 48;
  StreamGate gate(copier_->onboardStream());
  auto on = onboardKeys(kN);
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ((*on)->readyPrefix(), 0u);  // held at the gate
  gate.open();
  size_t last = 0;
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (last < kN && std::chrono::steady_clock::now() < deadline) {
    size_t now = (*on)->readyPrefix();
    ASSERT_GE(now, last);
    ASSERT_TRUE(now % 4 == 0 || now == kN) << now;
    last = now;
  }
  EXPECT_EQ(last, kN);
  for (size_t i = 0; i < kN; ++i) EXPECT_TRUE(holdsPayloadOf(i, readBack(i))) << "block " << i;
}

// A copy queued on the compute stream after waitOnStream reads the onboarded bytes, never the
// device memory's old contents, even while the onboard is held back.
TEST_F(DeviceCopierTest, WaitOnStreamOrdersComputeAfterTheFirstBlocks) {
  DeviceCopierOptions options;
  options.blocks_per_event = 2;
  makeCopier(options);
  constexpr size_t kN = 8, kFirst = 4;
  StreamGate gate(copier_->onboardStream());
  auto on = onboardKeys(kN);
  ASSERT_TRUE(on.ok()) << on.status();
  ASSERT_TRUE((*on)->waitOnStream(compute_, kFirst).ok());
  EXPECT_EQ((*on)->waitOnStream(compute_, kN + 1).code(), absl::StatusCode::kOutOfRange);
  ASSERT_CUDA(
      cudaMemcpyAsync(staging_, block(0), kFirst * kBlock, cudaMemcpyDeviceToHost, compute_));
  std::this_thread::sleep_for(50ms);  // give a wrongly ordered copy time to run
  EXPECT_EQ(cudaStreamQuery(compute_), cudaErrorNotReady);  // the compute stream waits
  gate.open();
  ASSERT_CUDA(cudaStreamSynchronize(compute_));
  for (size_t i = 0; i < kFirst; ++i) {
    EXPECT_TRUE(holdsPayloadOf(i, {staged(i), kBlock})) << "block " << i;
  }
}

// Offload waits on the compute stream's event: the bytes stored are those the step wrote, not
// what the device memory held when offload() was called.
TEST_F(DeviceCopierTest, OffloadWaitsForTheComputeEvent) {
  makeCopier();
  constexpr size_t kN = 4;
  for (size_t i = 0; i < kN; ++i) {
    auto p = payloadOf(200 + i, kBlock);
    std::memcpy(staged(i), p.data(), kBlock);
  }
  StreamGate gate(compute_);
  // The "step": writes the blocks on the compute stream, behind the gate.
  ASSERT_CUDA(cudaMemcpyAsync(block(0), staging_, kN * kBlock, cudaMemcpyHostToDevice, compute_));
  std::vector<BlockKey> keys{200, 201, 202, 203};
  std::vector<const void*> sources{block(0), block(1), block(2), block(3)};
  auto off = copier_->offloadAfter(keys, sources, compute_);
  ASSERT_TRUE(off.ok()) << off.status();
  std::this_thread::sleep_for(50ms);
  copier_->poll();
  EXPECT_FALSE((*off)->durable());  // the copy waits for the step
  EXPECT_FALSE(store_->host().contains(200));
  gate.open();
  ASSERT_TRUE(copier_->drain().ok());
  ASSERT_TRUE((*off)->durable());
  for (BlockKey k : keys) EXPECT_TRUE(hostHoldsPayload(k)) << "key " << k;
}

TEST_F(DeviceCopierTest, SubmissionsPastTheInFlightBoundAreRefused) {
  DeviceCopierOptions options;
  options.max_batches_in_flight = 2;
  makeCopier(options);
  StreamGate gate(compute_);
  auto batch = [&](BlockKey k) {
    std::vector<BlockKey> keys{k};
    std::vector<const void*> sources{block(k)};
    return copier_->offloadAfter(keys, sources, compute_);
  };
  ASSERT_TRUE(batch(0).ok());
  ASSERT_TRUE(batch(1).ok());
  auto third = batch(2);
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(copier_->stats().backpressure, 1u);
  EXPECT_FALSE(store_->host().contains(2));  // nothing reserved for the refused batch
  gate.open();
  ASSERT_TRUE(copier_->drain().ok());
  EXPECT_EQ(copier_->offloadsInFlight(), 0u);
  EXPECT_TRUE(batch(2).ok());
  ASSERT_TRUE(copier_->drain().ok());
  EXPECT_TRUE(store_->host().contains(2));
}

TEST_F(DeviceCopierTest, BadPointersAreAnsweredWithAnError) {
  makeCopier();
  storeKeys(0, 2);
  std::vector<std::byte> pageable(2 * kBlock);
  std::vector<BlockKey> keys{0, 1};
  std::vector<void*> bad_destinations{block(0), pageable.data()};
  auto on = copier_->onboard(keys, bad_destinations);
  ASSERT_FALSE(on.ok());
  EXPECT_EQ(on.status().code(), absl::StatusCode::kInvalidArgument) << on.status();
  EXPECT_NE(on.status().message().find("block 1"), std::string::npos) << on.status();
  std::vector<void*> null_destinations{nullptr, block(1)};
  EXPECT_EQ(copier_->onboard(keys, null_destinations).status().code(),
            absl::StatusCode::kInvalidArgument);

  std::vector<BlockKey> new_keys{300};
  std::vector<const void*> bad_sources{pageable.data()};
  auto off = copier_->offloadAfter(new_keys, bad_sources, compute_);
  ASSERT_FALSE(off.ok());
  EXPECT_EQ(off.status().code(), absl::StatusCode::kInvalidArgument) << off.status();
  EXPECT_FALSE(store_->host().contains(300));
  // Nothing stays pinned or reserved, and the copier still works.
  EXPECT_EQ(store_->host().usage().evictable, store_->host().usage().resident);
  std::vector<void*> good{block(0), block(1)};
  auto again = copier_->onboard(keys, good);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE((*again)->synchronize().ok());
  EXPECT_TRUE(holdsPayloadOf(1, readBack(1)));
}

}  // namespace
}  // namespace kvf::worker
