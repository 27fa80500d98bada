#include "engine/accounted_tiers.h"

#include <string>
#include <utility>
#include <variant>

#include "worker/block_payload.h"
#include "worker/tiers/disk_format.h"

namespace kvf::engine {
namespace {

constexpr uint64_t kHostSlotAlign = 4096;  // HostTier's slot alignment

// Nothing to copy: the accounting has no payload, so every block is ready when asked.
class ReadyOnboard final : public TierOnboard {
 public:
  explicit ReadyOnboard(size_t ready) : ready_(ready) {}
  bool done() const override { return true; }
  size_t readyPrefix() const override { return ready_; }

 private:
  size_t ready_;
};

}  // namespace

void AccountedTiers::Lru::touch(uint64_t key) {
  auto it = where.find(key);
  if (it != where.end()) order.splice(order.end(), order, it->second);
}

std::optional<uint64_t> AccountedTiers::Lru::insert(uint64_t key) {
  if (capacity == 0) return key;
  auto it = where.find(key);
  if (it != where.end()) {
    order.splice(order.end(), order, it->second);
    return std::nullopt;
  }
  std::optional<uint64_t> evicted;
  if (where.size() >= capacity) {
    evicted = order.front();
    where.erase(order.front());
    order.pop_front();
  }
  where.emplace(key, order.insert(order.end(), key));
  return evicted;
}

AccountedTiers::AccountedTiers(const worker::TieredStoreOptions& options) {
  uint64_t block = std::max<uint64_t>(1, options.host.block_bytes);
  uint64_t host_slot = (block + kHostSlotAlign - 1) / kHostSlotAlign * kHostSlotAlign;
  host_.capacity = options.host.capacity_bytes / host_slot;
  if (options.disk) {
    has_disk_ = true;
    disk_.capacity = options.disk->capacity_bytes / worker::diskSlotBytes(block);
  }
}

template <class Event>
void AccountedTiers::append(worker::TierId tier, uint64_t key) {
  // Consecutive changes of one kind and tier share an event, as a live batch would; no parent
  // and no token ids, as vLLM's OffloadingConnector writes them.
  if (!events_.empty()) {
    if (auto* last = std::get_if<Event>(&events_.back());
        last != nullptr && last->medium == worker::tierMedium(tier)) {
      last->block_hashes.emplace_back(key);
      return;
    }
  }
  Event ev;
  ev.block_hashes.emplace_back(key);
  ev.medium = std::string(worker::tierMedium(tier));
  events_.emplace_back(std::move(ev));
}

std::vector<worker::KvEvent> AccountedTiers::takeEvents() { return std::exchange(events_, {}); }

void AccountedTiers::offload(std::span<const worker::BlockHash> hashes,
                             std::span<const std::span<const std::byte>> /*payloads*/) {
  for (worker::BlockHash h : hashes) {
    const uint64_t key = h.value();
    const bool new_in_host = !host_.contains(key);
    if (has_disk_ && !disk_.contains(key)) {
      // Write-through: the disk gets every block stored in host memory.
      ++counts_.disk_written;
      std::optional<uint64_t> out = disk_.insert(key);
      if (out != key) append<worker::BlockStored>(worker::TierId::kDisk, key);
      if (out) {
        ++counts_.dropped_capacity;
        if (out != key) append<worker::BlockRemoved>(worker::TierId::kDisk, *out);
      }
    } else if (has_disk_) {
      disk_.touch(key);
    }
    if (!new_in_host) {
      host_.touch(key);
      continue;
    }
    storeInHost(key);
  }
}

void AccountedTiers::storeInHost(uint64_t key) {
  ++counts_.host_stored;
  std::optional<uint64_t> out = host_.insert(key);
  if (out != key) append<worker::BlockStored>(worker::TierId::kHost, key);
  if (out) {
    // With a disk below, the block was written before it could leave (lossless).
    if (has_disk_ && disk_.contains(*out)) {
      ++counts_.host_moved_down;
    } else {
      ++counts_.dropped_capacity;
    }
    if (out != key) append<worker::BlockRemoved>(worker::TierId::kHost, *out);
  }
}

PromoteOutcome AccountedTiers::promote(worker::BlockHash hash) {
  const uint64_t key = hash.value();
  if (host_.contains(key)) return PromoteOutcome::kInHost;
  if (!has_disk_ || !disk_.contains(key)) return PromoteOutcome::kNotOnDisk;
  // The block a promotion pushes out must have its copy on disk: a promotion never drops one.
  if (host_.capacity == 0 ||
      (host_.size() >= host_.capacity && !disk_.contains(host_.order.front()))) {
    return PromoteOutcome::kNoRoom;
  }
  ++counts_.promoted;
  disk_.touch(key);  // a read makes it recent, as the disk tier does
  storeInHost(key);
  return PromoteOutcome::kStarted;
}

HostRoom AccountedTiers::hostRoom() const {
  // Every block here is written through at once: each host block may leave (promote() checks
  // the one that would).
  return {host_.capacity, host_.capacity};
}

void AccountedTiers::touch(std::span<const worker::BlockHash> hashes) {
  for (worker::BlockHash h : hashes) host_.touch(h.value());
}

TierRun AccountedTiers::lookup(std::span<const worker::BlockHash> hashes) {
  TierRun run;
  for (worker::BlockHash h : hashes) {
    const uint64_t key = h.value();
    if (host_.contains(key)) {
      run.tiers.push_back(worker::TierId::kHost);
      ++run.host;
    } else if (has_disk_ && disk_.contains(key)) {
      run.tiers.push_back(worker::TierId::kDisk);
      ++run.disk;
    } else {
      break;
    }
  }
  return run;
}

std::unique_ptr<TierOnboard> AccountedTiers::onboard(
    std::span<const worker::BlockHash> hashes, std::span<const std::span<std::byte>> destinations) {
  size_t ready = 0;
  for (worker::BlockHash h : hashes) {
    const uint64_t key = h.value();
    if (host_.contains(key)) {
      host_.touch(key);
      ++counts_.onboarded_host;
    } else if (has_disk_ && disk_.contains(key)) {
      disk_.touch(key);  // a disk hit makes the block recent, as the disk tier does
      ++counts_.onboarded_disk;
    } else {
      break;
    }
    // A pool with payload bytes (an engine core run with accounting, e.g. in tests) gets the
    // block's content, which the emulator derives from its hash.
    if (ready < destinations.size() && !destinations[ready].empty()) {
      worker::fillBlockPayload(h, destinations[ready]);
    }
    ++ready;
  }
  return std::make_unique<ReadyOnboard>(ready);
}

}  // namespace kvf::engine
