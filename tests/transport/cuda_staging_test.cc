// GPU tests of transport/cuda_staging.h (label `gpu`): a device pool pushed through the pinned
// staging ring into another context's host landing region, verified by checksums, then uploaded
// into a second device buffer and compared. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <future>
#include <random>

#include "transport/cuda_staging.h"

namespace kvf::transport {
namespace {

using namespace std::chrono_literals;

TEST(CudaStaging, PushesADevicePoolThroughTheRingAndUploadsOnTheReceiver) {
  if (!cudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  constexpr uint64_t kBlock = 256 << 10, kBlocks = 64;  // 16 MiB through a 4 x 1 MiB ring
  TransportOptions options;
  auto sender = TransportContext::create(options);
  auto receiver = TransportContext::create(options);
  ASSERT_TRUE(sender.ok() && receiver.ok());
  std::vector<char> pattern(kBlock * kBlocks);
  std::mt19937_64 rng(5);
  for (auto& c : pattern) c = static_cast<char>(rng());
  void* device_src = nullptr;
  void* device_dst = nullptr;
  ASSERT_EQ(cudaMalloc(&device_src, pattern.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&device_dst, pattern.size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(device_src, pattern.data(), pattern.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  auto landing_region = (*receiver)->allocateMemory(pattern.size());
  ASSERT_TRUE(landing_region.ok());

  std::vector<BlockCopy> blocks;
  for (uint64_t i = 0; i < kBlocks; ++i) {
    // Reverse order on the receiver so that nothing coalesces by accident.
    blocks.push_back({i * kBlock, (*landing_region)->base() + (kBlocks - 1 - i) * kBlock, kBlock});
  }
  auto landing = (*receiver)->expectPut(*landing_region,
                                        {(*sender)->workerAddress(), blocks, 10s, true}, nullptr);
  ASSERT_TRUE(landing.ok());
  auto pusher = DeviceStagingPusher::create(**sender, {1 << 20, 4, 0});
  ASSERT_TRUE(pusher.ok()) << pusher.status();
  PutRequest request;
  request.peer_address = (*receiver)->workerAddress();
  request.peer_rkey = (*landing_region)->packedRkey();
  request.blocks = blocks;
  request.deadline = 10s;
  request.checksums = ChecksumMode::kCompute;
  request.landing_id = (*landing)->id();
  std::promise<absl::StatusOr<PutResult>> pushed;
  ASSERT_TRUE(
      (*pusher)->push(device_src, request, [&](auto r) { pushed.set_value(std::move(r)); }).ok());
  auto result = pushed.get_future().get();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->blocks, kBlocks);
  ASSERT_TRUE((*landing)->waitFor(10s));
  ASSERT_TRUE((*landing)->check().ok()) << (*landing)->check();

  auto uploader = DeviceUploader::create(0);
  ASSERT_TRUE(uploader.ok());
  std::vector<DeviceUploader::Copy> copies;
  for (const auto& b : blocks) {
    copies.push_back({reinterpret_cast<const void*>(b.remote_addr),
                      static_cast<char*>(device_dst) + b.local_offset, b.length});
  }
  std::promise<absl::Status> uploaded;
  ASSERT_TRUE((*uploader)->upload(copies, [&](absl::Status s) { uploaded.set_value(s); }).ok());
  ASSERT_TRUE(uploaded.get_future().get().ok());
  std::vector<char> back(pattern.size());
  ASSERT_EQ(cudaMemcpy(back.data(), device_dst, back.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, pattern);
  cudaFree(device_src);
  cudaFree(device_dst);
}

TEST(CudaStaging, RejectsBlocksLargerThanAChunk) {
  if (!cudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  auto ctx = TransportContext::create({});
  ASSERT_TRUE(ctx.ok());
  auto pusher = DeviceStagingPusher::create(**ctx, {1 << 20, 2, 0});
  ASSERT_TRUE(pusher.ok());
  PutRequest request;
  request.blocks = {{0, 0, 2 << 20}};
  EXPECT_EQ((*pusher)->push(nullptr, request, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvf::transport
