#include "engine/device_payload.h"

#include <algorithm>
#include <string>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "transport/cuda_status.h"
#include "worker/block_payload.h"

namespace kvf::engine {
namespace {

// Staging slots: enough that a step's writes never wait for an earlier step's copies, bounded in
// bytes for large blocks.
constexpr size_t kStagingSlots = 256;
constexpr size_t kStagingBytes = size_t{64} << 20;

absl::Status cudaCheck(cudaError_t error, std::string_view what) {
  return transport::cudaStatus(error, strCat("device payload: ", what));
}

}  // namespace

absl::StatusOr<std::shared_ptr<DevicePayload>> DevicePayload::create(size_t bytes,
                                                                     size_t block_bytes) {
  if (bytes == 0 || block_bytes == 0 || bytes % block_bytes != 0) {
    return absl::InvalidArgumentError(strCat("device payload: ", bytes,
                                             " bytes is not a whole number of ", block_bytes,
                                             "-byte blocks"));
  }
  int devices = 0;
  cudaError_t error = cudaGetDeviceCount(&devices);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        strCat("cache.payload_memory: device needs a CUDA device: ", cudaGetErrorString(error)));
  }
  if (devices == 0) {
    return absl::FailedPreconditionError("cache.payload_memory: device needs a CUDA device");
  }
  std::shared_ptr<DevicePayload> memory(new DevicePayload(bytes, block_bytes));
  KVF_RETURN_IF_ERROR(memory->init());
  return memory;
}

absl::Status DevicePayload::init() {
  KVF_RETURN_IF_ERROR(cudaCheck(cudaSetDevice(0), "cudaSetDevice"));
  KVF_RETURN_IF_ERROR(cudaCheck(cudaMalloc(reinterpret_cast<void**>(&base_), bytes_),
                                strCat("cudaMalloc ", bytes_)));
  KVF_RETURN_IF_ERROR(cudaCheck(cudaMemset(base_, 0, bytes_), "cudaMemset"));
  KVF_RETURN_IF_ERROR(
      cudaCheck(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
  const size_t slots = std::clamp<size_t>(kStagingBytes / block_bytes_, 2, kStagingSlots);
  KVF_RETURN_IF_ERROR(
      cudaCheck(cudaMallocHost(reinterpret_cast<void**>(&staging_), slots * block_bytes_),
                "cudaMallocHost staging"));
  KVF_RETURN_IF_ERROR(cudaCheck(cudaMallocHost(reinterpret_cast<void**>(&readback_), block_bytes_),
                                "cudaMallocHost readback"));
  done_.assign(slots, nullptr);
  queued_.assign(slots, false);
  for (cudaEvent_t& e : done_) {
    KVF_RETURN_IF_ERROR(
        cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"));
  }
  return absl::OkStatus();
}

DevicePayload::~DevicePayload() {
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  for (cudaEvent_t e : done_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (staging_ != nullptr) cudaFreeHost(staging_);
  if (readback_ != nullptr) cudaFreeHost(readback_);
  // cudaFree waits for the device: copies of other streams still reading the region end first.
  if (base_ != nullptr) cudaFree(base_);
}

void DevicePayload::write(std::span<std::byte> block, worker::BlockHash hash) {
  ++stats_.writes;
  const size_t slot = next_slot_;
  next_slot_ = (next_slot_ + 1) % done_.size();
  if (queued_[slot] && cudaEventQuery(done_[slot]) == cudaErrorNotReady) {
    // The ring went round faster than the copies drain: this write waits for its slot.
    ++stats_.staging_waits;
    cudaEventSynchronize(done_[slot]);
  }
  std::span<std::byte> staged(staging_ + slot * block_bytes_, block_bytes_);
  worker::fillBlockPayload(hash, staged);
  absl::Status s =
      cudaCheck(cudaMemcpyAsync(block.data(), staged.data(), std::min(block.size(), block_bytes_),
                                cudaMemcpyHostToDevice, stream_),
                "cudaMemcpyAsync");
  if (s.ok()) s = cudaCheck(cudaEventRecord(done_[slot], stream_), "cudaEventRecord");
  queued_[slot] = s.ok();
  if (!s.ok()) {
    ++stats_.write_errors;
    log::error("device payload write failed", "hash", hash.value(), "error",
               std::string(s.message()));
  }
}

bool DevicePayload::verify(std::span<const std::byte> block, worker::BlockHash hash) {
  ++stats_.verifies;
  if (block.size() > block_bytes_) return false;
  absl::Status s = cudaCheck(
      cudaMemcpyAsync(readback_, block.data(), block.size(), cudaMemcpyDeviceToHost, stream_),
      "cudaMemcpyAsync");
  if (s.ok()) s = cudaCheck(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  if (!s.ok()) {
    log::error("device payload read failed", "hash", hash.value(), "error",
               std::string(s.message()));
    return false;
  }
  return worker::verifyBlockPayload(hash, std::span<const std::byte>(readback_, block.size()));
}

}  // namespace kvf::engine
