// The device pool's payload memory (cache.payload_memory: device): the KV pool's blocks in one
// cudaMalloc region on CUDA device 0, written on the engine's compute stream. A block's payload
// (a function of its hash, worker::fillBlockPayload) is generated into a CUDA-pinned staging
// slot and copied with cudaMemcpyAsync on the compute stream: the engine thread never waits for
// a write (only for a staging slot whose copy is still queued, counted). verify() reads a block
// back through the same stream, so it sees every earlier write and onboard it was ordered after.
//
// Compiled only with CUDA (KVF_WITH_CUDA). Owned (shared) by the pool and the device tiers;
// every method runs on the engine thread.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/payload_memory.h"

namespace kvf::engine {

struct DevicePayloadStats {
  uint64_t writes = 0;
  uint64_t staging_waits = 0;  // a write found its staging slot's last copy still queued
  uint64_t write_errors = 0;   // a write CUDA refused (the block then fails verify())
  uint64_t verifies = 0;
};

class DevicePayload final : public PayloadMemory {
 public:
  // `bytes` of device memory for blocks of `block_bytes` (zeroed). FailedPrecondition without a
  // usable CUDA device; ResourceExhausted when the device memory does not fit.
  static absl::StatusOr<std::shared_ptr<DevicePayload>> create(size_t bytes, size_t block_bytes);
  // Waits for the compute stream, then frees everything.
  ~DevicePayload() override;
  DevicePayload(const DevicePayload&) = delete;
  DevicePayload& operator=(const DevicePayload&) = delete;

  std::span<std::byte> region() override { return {base_, bytes_}; }
  void write(std::span<std::byte> block, worker::BlockHash hash) override;
  bool verify(std::span<const std::byte> block, worker::BlockHash hash) override;

  // The engine's compute stream: every write and read of the region is queued on it; copies on
  // other streams order themselves against it with events.
  cudaStream_t computeStream() const { return stream_; }
  size_t blockBytes() const { return block_bytes_; }
  const DevicePayloadStats& stats() const { return stats_; }

 private:
  DevicePayload(size_t bytes, size_t block_bytes) : bytes_(bytes), block_bytes_(block_bytes) {}
  absl::Status init();

  const size_t bytes_;
  const size_t block_bytes_;
  std::byte* base_ = nullptr;  // device memory
  cudaStream_t stream_ = nullptr;
  // Staging ring: slot i's bytes at staging_ + i * block_bytes_, free again once done_[i] fired.
  std::byte* staging_ = nullptr;  // CUDA-pinned
  std::vector<cudaEvent_t> done_;
  std::vector<bool> queued_;  // done_[i] was recorded after slot i's copy
  size_t next_slot_ = 0;
  std::byte* readback_ = nullptr;  // CUDA-pinned, one block: verify()'s landing
  DevicePayloadStats stats_;
};

}  // namespace kvf::engine
