// G1 <-> G2 copies for a GPU engine: blocks move between device memory (the engine's KV pool) and
// the host tier's CUDA-pinned slots on the copier's own non-blocking streams, one for onboard
// (G2 -> G1, the device's highest stream priority) and one for offload (G1 -> G2, lowest), so
// neither waits behind the engine's compute and swap-out overlaps it. Onboard gives one ready
// event per chunk of blocks: a scheduler runs the first chunk while later ones still copy.
// Offload waits on an event of the compute stream (no host sync) and a block becomes durable in
// the host tier only once its copy has completed (poll()), the lossless rule of docs/tiers.md.
//
// Compiled only with CUDA (KVF_WITH_CUDA). A copier, and the handles it returns, belong to one
// thread (the engine's scheduler): no method is thread-safe. The TieredStore must outlive it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/tiers/host_tier.h"
#include "worker/tiers/tier_types.h"

namespace kvf::worker {

class TieredStore;

struct DeviceCopierOptions {
  int device = 0;
  // Batches each direction may have on its stream; past it onboard()/offload() answer
  // Unavailable until poll() retires one (backpressure, never a growing queue).
  uint32_t max_batches_in_flight = 4;
  // Onboard: one ready event per this many blocks (the scheduler's chunk).
  uint32_t blocks_per_event = 1;
  // Gather a chunk's block copies into one cudaMemcpyBatchAsync (CUDA 12.8+ runtime and driver);
  // false, or where the driver refuses it, one cudaMemcpyAsync per block.
  bool batched_copies = true;
};

enum class CopyPath : uint8_t { kBatched, kPerBlock };
std::string_view copyPathName(CopyPath path);

// One onboard batch (G2 -> G1). It copies the leading run of the requested keys that the host
// tier held when it was submitted (size() of requested()); the rest are not copied.
class DeviceOnboard {
 public:
  ~DeviceOnboard();
  DeviceOnboard(const DeviceOnboard&) = delete;
  DeviceOnboard& operator=(const DeviceOnboard&) = delete;

  size_t requested() const { return requested_; }
  size_t size() const { return pins_.size(); }
  // How many leading blocks are in device memory (cudaEventQuery, never blocks); monotone.
  size_t readyPrefix();
  // Makes `stream` wait (on the device, no host sync) for the first `blocks` blocks only.
  // OutOfRange when blocks > size().
  absl::Status waitOnStream(cudaStream_t stream, size_t blocks) const;
  // Blocks the calling thread until every block is in (tests, shutdown).
  absl::Status synchronize();
  bool done() const { return retired_; }
  CopyPath path() const { return path_; }

 private:
  friend class DeviceCopier;
  DeviceOnboard(size_t requested, uint32_t blocks_per_event)
      : requested_(requested), blocks_per_event_(blocks_per_event) {}

  size_t requested_;
  uint32_t blocks_per_event_;
  std::vector<HostTier::Pin> pins_;
  std::vector<cudaEvent_t> events_;  // one per chunk; the last marks the batch complete
  size_t ready_chunks_ = 0;
  CopyPath path_ = CopyPath::kBatched;
  bool retired_ = false;  // poll() saw the batch complete and released its host slots
};

// One offload batch (G1 -> G2): the leading accepted() keys were taken (copied, or already in
// host memory); the rest met backpressure and the caller still holds the only copy. A G1 block
// may be reused once durable() is true, not before.
class DeviceOffload {
 public:
  ~DeviceOffload();
  DeviceOffload(const DeviceOffload&) = delete;
  DeviceOffload& operator=(const DeviceOffload&) = delete;

  size_t requested() const { return requested_; }
  size_t accepted() const { return accepted_; }
  size_t copied() const { return reservations_.size(); }
  // True once poll() saw the copies complete and committed them to the host tier.
  bool durable() const { return durable_; }
  // The copy's error (the blocks were abandoned, none stored); OK otherwise.
  const absl::Status& status() const { return status_; }
  CopyPath path() const { return path_; }

 private:
  friend class DeviceCopier;
  explicit DeviceOffload(size_t requested) : requested_(requested) {}

  size_t requested_;
  size_t accepted_ = 0;
  std::vector<HostTier::Reservation> reservations_;
  cudaEvent_t done_ = nullptr;
  CopyPath path_ = CopyPath::kBatched;
  bool durable_ = false;
  absl::Status status_;
};

struct DeviceCopierStats {
  uint64_t onboard_batches = 0;
  uint64_t onboard_blocks = 0;
  uint64_t offload_batches = 0;
  uint64_t offload_blocks = 0;  // copied into host slots (already-held blocks not counted)
  uint64_t backpressure = 0;    // submissions refused at the in-flight bound
  uint64_t batched_calls = 0;   // cudaMemcpyBatchAsync calls
  uint64_t per_block_copies = 0;
  uint64_t batch_fallbacks = 0;  // the runtime refused a batch: per-block copies from then on
};

class DeviceCopier {
 public:
  // FailedPrecondition without a usable device (none, or a driver older than the runtime);
  // InvalidArgument for zero bounds. Makes options.device current on the calling thread.
  static absl::StatusOr<std::unique_ptr<DeviceCopier>> create(TieredStore& store,
                                                              DeviceCopierOptions options);
  // Waits for both streams, retires every batch (committing completed offloads), then frees them.
  ~DeviceCopier();
  DeviceCopier(const DeviceCopier&) = delete;
  DeviceCopier& operator=(const DeviceCopier&) = delete;

  // G2 -> G1: `destinations[i]` (device memory, block_bytes) receives keys[i]. The host slots of
  // the copied run stay pinned until poll() sees the batch complete. Unavailable at the bound;
  // InvalidArgument when a destination is not device memory or the sizes differ.
  absl::StatusOr<std::shared_ptr<DeviceOnboard>> onboard(std::span<const BlockKey> keys,
                                                         std::span<void* const> destinations);
  // G1 -> G2: copies `sources[i]` (device memory, block_bytes) into keys[i]'s host slot after
  // `ready` (an event recorded on the compute stream after the step that wrote the blocks) on
  // the device; the calling thread does not wait. Unavailable at the bound.
  absl::StatusOr<std::shared_ptr<DeviceOffload>> offload(std::span<const BlockKey> keys,
                                                         std::span<const void* const> sources,
                                                         cudaEvent_t ready);
  // offload() after the work already queued on `compute` (records the event itself).
  absl::StatusOr<std::shared_ptr<DeviceOffload>> offloadAfter(std::span<const BlockKey> keys,
                                                              std::span<const void* const> sources,
                                                              cudaStream_t compute);

  // Retires completed batches in order: offloads are committed to the host tier (durable),
  // onboards release their host slots. Never blocks. Returns the batches still in flight.
  size_t poll();
  // Waits for both streams, then poll(): everything submitted is retired.
  absl::Status drain();

  size_t onboardsInFlight() const { return onboards_.size(); }
  size_t offloadsInFlight() const { return offloads_.size(); }
  // The path new copies take (kPerBlock once the runtime refused a batch).
  CopyPath path() const { return batched_ ? CopyPath::kBatched : CopyPath::kPerBlock; }
  const DeviceCopierStats& stats() const { return stats_; }
  cudaStream_t onboardStream() const { return onboard_stream_; }
  cudaStream_t offloadStream() const { return offload_stream_; }

 private:
  DeviceCopier(TieredStore& store, DeviceCopierOptions options, bool batched);
  // Copies src[i] to dst[i] (block_bytes each) on `stream`, gathered or one by one.
  absl::Status copyRun(std::span<void* const> dst, std::span<const void* const> src,
                       cudaStream_t stream, cudaMemcpyKind kind, CopyPath* path);
  void retireOffload(DeviceOffload& batch, absl::Status status);
  absl::StatusOr<cudaEvent_t> newEvent();

  TieredStore& store_;
  const DeviceCopierOptions options_;
  const uint64_t block_bytes_;
  bool batched_;
  cudaStream_t onboard_stream_ = nullptr;
  cudaStream_t offload_stream_ = nullptr;
  std::deque<std::shared_ptr<DeviceOnboard>> onboards_;
  std::deque<std::shared_ptr<DeviceOffload>> offloads_;
  DeviceCopierStats stats_;
};

}  // namespace kvf::worker
