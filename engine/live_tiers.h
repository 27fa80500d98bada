// The live engine's KV tiers: worker::TieredStore (host memory, local disk) under the
// LowerTiers interface, holding the pool's real payload bytes, plus the tiers' KV events as
// vLLM's OffloadingConnector writes them (BlockStored / BlockRemoved with medium "CPU" or
// "DISK", no token ids; AllBlocksCleared when the disk tier cleared itself at start). The core
// thread calls the LowerTiers methods; the store's threads call the TierListener side, so the
// event queue is locked; takeEvents() is for the core thread.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/lower_tiers.h"
#include "worker/kv_events.h"
#include "worker/tiers/tiered_store.h"

namespace kvf::engine {

struct LiveTiersOptions {
  worker::TieredStoreOptions store;
  int block_size = 16;  // tokens per block, for the events' block_size
  // How long an eviction waits for room in host memory (every host block waiting for the disk)
  // before the block is counted as lost to backpressure; the wait is the backpressure.
  Nanos offload_wait = 10 * kNanosPerSecond;
};

class LiveTiers final : public LowerTiers, private worker::TierListener {
 public:
  static absl::StatusOr<std::unique_ptr<LiveTiers>> create(LiveTiersOptions options);
  ~LiveTiers() override;

  void offload(std::span<const worker::BlockHash> hashes,
               std::span<const std::span<const std::byte>> payloads) override;
  TierRun lookup(std::span<const worker::BlockHash> hashes) override;
  std::unique_ptr<TierOnboard> onboard(std::span<const worker::BlockHash> hashes,
                                       std::span<const std::span<std::byte>> destinations) override;
  PromoteOutcome promote(worker::BlockHash hash) override;
  size_t promotionsInFlight() const override {
    return promotions_in_flight_->load(std::memory_order_acquire);
  }
  HostRoom hostRoom() const override;
  void touch(std::span<const worker::BlockHash> hashes) override;

  // The tiers' events since the last call, in order.
  std::vector<worker::KvEvent> takeEvents() override;
  worker::TieredStore& store() { return *store_; }
  // Evicted blocks the tiers could not take within offload_wait (0 unless the disk stalls).
  uint64_t offloadTimeouts() const { return offload_timeouts_.load(std::memory_order_relaxed); }
  uint64_t offloadWaits() const { return offload_waits_.load(std::memory_order_relaxed); }

 private:
  explicit LiveTiers(LiveTiersOptions options) : options_(std::move(options)) {}
  void onStored(worker::TierId tier, std::span<const worker::BlockKey> keys) override;
  void onRemoved(worker::TierId tier, std::span<const worker::BlockKey> keys) override;
  void onCleared(worker::TierId tier) override;

  LiveTiersOptions options_;
  std::mutex events_mu_;
  std::vector<worker::KvEvent> events_;
  std::atomic<uint64_t> offload_timeouts_{0};
  std::atomic<uint64_t> offload_waits_{0};
  // Shared with the reads' callbacks, which may outlive nothing here but run on the disk's thread.
  std::shared_ptr<std::atomic<size_t>> promotions_in_flight_ =
      std::make_shared<std::atomic<size_t>>(0);
  std::unique_ptr<worker::TieredStore> store_;  // last: its threads call the listener
};

}  // namespace kvf::engine
