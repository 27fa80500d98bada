#include "engine/live_tiers.h"

#include <algorithm>
#include <string>
#include <utility>

#include "common/log.h"
#include "common/status.h"

namespace kvf::engine {
namespace {

class StoreOnboard final : public TierOnboard {
 public:
  explicit StoreOnboard(std::shared_ptr<worker::OnboardTicket> ticket)
      : ticket_(std::move(ticket)) {}
  bool done() const override { return ticket_->done(); }
  size_t readyPrefix() const override { return ticket_->readyPrefix(); }

 private:
  std::shared_ptr<worker::OnboardTicket> ticket_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<LiveTiers>> LiveTiers::create(LiveTiersOptions options) {
  std::unique_ptr<LiveTiers> tiers(new LiveTiers(std::move(options)));
  KVF_ASSIGN_OR_RETURN(tiers->store_,
                       worker::TieredStore::create(tiers->options_.store, tiers.get()));
  return tiers;
}

LiveTiers::~LiveTiers() { store_.reset(); }

void LiveTiers::offload(std::span<const worker::BlockHash> hashes,
                        std::span<const std::span<const std::byte>> payloads) {
  for (size_t i = 0; i < hashes.size(); ++i) {
    const worker::BlockKey key = hashes[i].value();
    absl::Status s = store_->offload(key, payloads[i]);
    if (absl::IsUnavailable(s)) {
      // Every host block waits for the disk: the eviction waits for room instead of losing it.
      offload_waits_.fetch_add(1, std::memory_order_relaxed);
      s = store_->offloadWait(key, payloads[i], std::chrono::nanoseconds(options_.offload_wait));
    }
    if (!s.ok()) {
      offload_timeouts_.fetch_add(1, std::memory_order_relaxed);
      log::warn("tier offload failed", "key", key, "error", std::string(s.message()));
    }
  }
}

TierRun LiveTiers::lookup(std::span<const worker::BlockHash> hashes) {
  TierRun run;
  std::vector<worker::BlockKey> keys = keysOf(hashes);
  run.tiers = store_->lookup(keys);
  for (worker::TierId t : run.tiers) (t == worker::TierId::kHost ? run.host : run.disk)++;
  return run;
}

std::unique_ptr<TierOnboard> LiveTiers::onboard(
    std::span<const worker::BlockHash> hashes, std::span<const std::span<std::byte>> destinations) {
  std::vector<worker::BlockKey> keys = keysOf(hashes);
  return std::make_unique<StoreOnboard>(store_->onboard(keys, destinations));
}

PromoteOutcome LiveTiers::promote(worker::BlockHash hash) {
  promotions_in_flight_->fetch_add(1, std::memory_order_acq_rel);
  absl::Status s = store_->promote(hash.value(), [in_flight = promotions_in_flight_](bool) {
    in_flight->fetch_sub(1, std::memory_order_acq_rel);
  });
  if (s.ok()) return PromoteOutcome::kStarted;
  promotions_in_flight_->fetch_sub(1, std::memory_order_acq_rel);
  if (absl::IsAlreadyExists(s)) return PromoteOutcome::kInHost;
  if (absl::IsNotFound(s)) return PromoteOutcome::kNotOnDisk;
  return PromoteOutcome::kNoRoom;
}

HostRoom LiveTiers::hostRoom() const {
  worker::HostTier::Usage u = store_->host().usage();
  return {u.capacity, u.capacity - std::min(u.capacity, u.resident) + u.evictable};
}

void LiveTiers::touch(std::span<const worker::BlockHash> hashes) {
  std::vector<worker::BlockKey> keys = keysOf(hashes);
  store_->touch(keys);
}

std::vector<worker::KvEvent> LiveTiers::takeEvents() {
  std::lock_guard lock(events_mu_);
  return std::exchange(events_, {});
}

void LiveTiers::onStored(worker::TierId tier, std::span<const worker::BlockKey> keys) {
  // As vLLM's OffloadingConnector: the tier's medium, no parent, no token ids.
  worker::BlockStored ev;
  for (worker::BlockKey k : keys) ev.block_hashes.emplace_back(k);
  ev.parent_block_hash.reset();
  ev.block_size = options_.block_size;
  ev.lora_id.reset();
  ev.medium = std::string(worker::tierMedium(tier));
  std::lock_guard lock(events_mu_);
  events_.emplace_back(std::move(ev));
}

void LiveTiers::onRemoved(worker::TierId tier, std::span<const worker::BlockKey> keys) {
  worker::BlockRemoved ev;
  for (worker::BlockKey k : keys) ev.block_hashes.emplace_back(k);
  ev.medium = std::string(worker::tierMedium(tier));
  std::lock_guard lock(events_mu_);
  events_.emplace_back(std::move(ev));
}

void LiveTiers::onCleared(worker::TierId /*tier*/) {
  // Only the disk tier clears, at start, before this engine holds anything: the whole
  // instance's earlier holdings (every medium) are gone as far as a router knows.
  std::lock_guard lock(events_mu_);
  events_.emplace_back(worker::AllBlocksCleared{});
}

}  // namespace kvf::engine
