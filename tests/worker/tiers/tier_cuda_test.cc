// GPU test of the host tier (label `gpu`): with a CUDA device the host tier's slots are
// CUDA-pinned, and a block goes host tier -> device -> back into a new host slot by DMA, then
// onboards byte for byte. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "tests/testing/cuda_device.h"
#include "tests/worker/tiers/tier_test_util.h"
#include "transport/cuda_status.h"
#include "worker/tiers/tiered_store.h"

namespace kvf::worker {
namespace {

using namespace std::chrono_literals;

using testing::holdsPayloadOf;
using testing::payloadOf;

TEST(TierCuda, BlocksRoundTripHostTierToDeviceAndBackByDma) {
  KVF_SKIP_WITHOUT_CUDA_DEVICE();
  constexpr uint64_t kBlock = 256 << 10, kBlocks = 8;
  TieredStoreOptions o;
  o.host.block_bytes = kBlock;
  o.host.capacity_bytes = 2 * kBlocks * kBlock;
  o.host.pin = PinMode::kRequired;
  auto store = TieredStore::create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  TieredStore& s = **store;
  ASSERT_EQ(s.hostPinKind(), PinKind::kCudaHost);

  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, kBlocks * kBlock), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  auto* device_bytes = static_cast<std::byte*>(device);

  // G2 -> G1: each block's pinned slot straight into device memory.
  for (BlockKey k = 0; k < kBlocks; ++k) ASSERT_TRUE(s.offload(k, payloadOf(k, kBlock)).ok());
  for (BlockKey k = 0; k < kBlocks; ++k) {
    auto pin = s.host().pin(k);
    ASSERT_TRUE(pin.has_value());
    cudaPointerAttributes attributes{};
    ASSERT_EQ(cudaPointerGetAttributes(&attributes, pin->bytes.data()), cudaSuccess);
    EXPECT_EQ(attributes.type, cudaMemoryTypeHost);  // page-locked, registered with CUDA
    ASSERT_EQ(cudaMemcpyAsync(device_bytes + k * kBlock, pin->bytes.data(), kBlock,
                              cudaMemcpyHostToDevice, stream),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);  // the slot is read: release it
    s.host().unpin(*pin);
  }

  // G1 -> G2: device memory into new host slots (other keys), as an engine's eviction would.
  constexpr BlockKey kBack = 1000;
  for (BlockKey k = 0; k < kBlocks; ++k) {
    absl::Status st = s.offloadInto(kBack + k, [&](std::span<std::byte> slot) {
      absl::Status copied =
          transport::cudaStatus(cudaMemcpyAsync(slot.data(), device_bytes + k * kBlock, kBlock,
                                                cudaMemcpyDeviceToHost, stream),
                                "cudaMemcpyAsync");
      if (!copied.ok()) return copied;
      return transport::cudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    });
    ASSERT_TRUE(st.ok()) << st;
  }

  std::vector<BlockKey> keys;
  std::vector<std::byte> out(kBlocks * kBlock);
  std::vector<std::span<std::byte>> dst;
  for (BlockKey k = 0; k < kBlocks; ++k) {
    keys.push_back(kBack + k);
    dst.push_back(std::span(out).subspan(k * kBlock, kBlock));
  }
  auto ticket = s.onboard(keys, dst);
  ASSERT_TRUE(ticket->waitAll(20s));
  for (BlockKey k = 0; k < kBlocks; ++k) {
    ASSERT_EQ(ticket->state(k), OnboardState::kReady);
    EXPECT_TRUE(holdsPayloadOf(k, dst[k])) << "block " << k << " changed on its way";
  }
  cudaStreamDestroy(stream);
  cudaFree(device);
}

}  // namespace
}  // namespace kvf::worker
