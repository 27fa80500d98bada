// The live engine's KV tiers for a device pool (cache.payload_memory: device): the same
// worker::TieredStore, budgets, drop rules and KV events as LiveTiers (it wraps one), with the
// G1 <-> G2 copies on a worker::DeviceCopier's own streams instead of host memcpy.
//
// Offload: the evicted blocks are copied device -> host slots on the copier's offload stream
// after an event of the compute stream (the step that wrote them), and the compute stream then
// waits, on the device, for an event recorded after that copy. So the pool reuses an evicted
// block at once and no later write can reach it before the copy has read it: the engine thread
// never waits during the step. The host copy becomes visible (lookup, BlockStored CPU) when
// poll() sees the copy complete; until then a lookup misses it (a recompute, never a wrong
// byte). takeEvents(), once per step when the events are published, waits for the step's copies
// so its CPU stores precede its GPU removals. Blocks the host
// tier cannot take now (every slot waits for the disk) are read back to the host and handed to
// LiveTiers::offload, which waits for room (bounded, counted): backpressure, never loss.
//
// Onboard: the leading run held in host memory is one DeviceCopier::onboard (per-chunk ready
// events); the rest (disk blocks, or host blocks past a disk one) is read by the store into
// CUDA-pinned bounce slots and copied host -> device on the copier's onboard stream as each
// block becomes ready. Without free bounce slots the tail is not onboarded (recomputed, counted).
//
// Compiled only with CUDA (KVF_WITH_CUDA). Owned by the EngineCore, engine thread only; its
// onboards must end before it is destroyed (the core's order guarantees it).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/device_payload.h"
#include "engine/live_tiers.h"
#include "engine/lower_tiers.h"
#include "worker/tiers/device_copier.h"

namespace kvf::engine {

struct DeviceTiersOptions {
  LiveTiersOptions live;
  // Onboard ready events every 8 blocks: one gathered copy per chunk, not per block.
  worker::DeviceCopierOptions copier = {.blocks_per_event = 8};
  // CUDA-pinned host blocks that onboards from disk land in before their device copy.
  uint32_t bounce_blocks = 256;
};

struct DeviceTiersStats {
  uint64_t offload_stalls = 0;       // offloads that waited for the copier's in-flight bound
  uint64_t offload_copy_errors = 0;  // offloads the copier refused (read back instead)
  uint64_t offload_via_host = 0;     // blocks read back and offloaded through LiveTiers
  uint64_t offload_lost = 0;  // blocks whose read-back failed (a device error): nowhere to keep
  uint64_t onboard_copier_blocks = 0;  // host -> device by DeviceCopier::onboard
  uint64_t onboard_bounce_blocks = 0;  // store -> bounce slot -> device
  uint64_t onboard_no_bounce = 0;      // blocks not onboarded for want of a bounce slot
  uint64_t event_waits = 0;  // takeEvents() waited for queued offload copies (event order)
};

class DeviceTiers final : public LowerTiers {
 public:
  // `memory` is the pool's (the copies' endpoints and the compute stream). FailedPrecondition
  // without a usable device.
  static absl::StatusOr<std::unique_ptr<DeviceTiers>> create(DeviceTiersOptions options,
                                                             std::shared_ptr<DevicePayload> memory);
  // Drains the copier (completed offloads are committed), then frees the bounce slots.
  ~DeviceTiers() override;

  void offload(std::span<const worker::BlockHash> hashes,
               std::span<const std::span<const std::byte>> payloads) override;
  TierRun lookup(std::span<const worker::BlockHash> hashes) override;
  std::unique_ptr<TierOnboard> onboard(std::span<const worker::BlockHash> hashes,
                                       std::span<const std::span<std::byte>> destinations) override;
  // Promotions are disk -> host and never touch the device: the wrapped store's.
  PromoteOutcome promote(worker::BlockHash hash) override { return live_->promote(hash); }
  size_t promotionsInFlight() const override { return live_->promotionsInFlight(); }
  HostRoom hostRoom() const override { return live_->hostRoom(); }
  void touch(std::span<const worker::BlockHash> hashes) override { live_->touch(hashes); }
  void poll() override { copier_->poll(); }
  // Waits for the offload copies queued so far, then poll(): a step's CPU stores come before
  // its GPU removals, as with LiveTiers.
  std::vector<worker::KvEvent> takeEvents() override;

  LiveTiers& live() { return *live_; }
  worker::DeviceCopier& copier() { return *copier_; }
  const DeviceTiersStats& stats() const { return stats_; }

 private:
  friend class DeviceTierOnboard;
  DeviceTiers(DeviceTiersOptions options, std::shared_ptr<DevicePayload> memory)
      : options_(std::move(options)), memory_(std::move(memory)) {}
  absl::Status init();
  // Reads the blocks back on the compute stream (after the step's writes) and hands them to
  // LiveTiers::offload, which waits for room in host memory.
  void offloadThroughHost(std::span<const worker::BlockHash> hashes,
                          std::span<const std::span<const std::byte>> payloads);
  // Up to `n` free bounce slots (block bytes each); giveBounce returns them.
  std::vector<std::span<std::byte>> takeBounce(size_t n);
  void giveBounce(std::span<const std::span<std::byte>> slots);

  DeviceTiersOptions options_;
  std::shared_ptr<DevicePayload> memory_;
  std::unique_ptr<LiveTiers> live_;
  std::unique_ptr<worker::DeviceCopier> copier_;  // after live_: drained before the store goes
  std::byte* bounce_ = nullptr;                   // CUDA-pinned, bounce_blocks blocks
  std::vector<uint32_t> free_bounce_;
  cudaEvent_t offloaded_ = nullptr;  // recorded after each offload copy; the compute stream waits
  cudaEvent_t compute_mark_ = nullptr;  // onboards' copies wait for the compute stream's work
  std::vector<std::byte> readback_;     // offloadThroughHost's landing
  DeviceTiersStats stats_;
};

}  // namespace kvf::engine
