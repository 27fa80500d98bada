#include "worker/tier_push.h"

#include <memory>
#include <mutex>
#include <utility>

namespace kvf::worker {
namespace {

// The disk reads of one run, finished block by block on the store's threads: once the last one
// is in, the caller learns how many leading blocks arrived intact.
struct DiskReads {
  DiskReads(size_t n, absl::AnyInvocable<void(size_t) &&> done)
      : states(n, OnboardState::kPending), left(n), on_done(std::move(done)) {}
  std::mutex mu;
  std::vector<OnboardState> states;
  size_t left;
  absl::AnyInvocable<void(size_t) &&> on_done;
};

}  // namespace

TierPushSource::~TierPushSource() {
  for (auto& [id, pins] : pins_) {
    for (const HostTier::Pin& p : pins) store_.host().unpin(p);
  }
}

PayloadRegion TierPushSource::region() const {
  std::span<std::byte> arena = store_.host().arena();
  return {arena.data(), arena.size()};
}

TierPushRun TierPushSource::pin(std::span<const BlockHash> hashes,
                                std::span<const std::span<std::byte>> disk_buffers,
                                absl::AnyInvocable<void(size_t) &&> on_disk_read) {
  std::vector<BlockKey> keys;
  keys.reserve(hashes.size());
  for (BlockHash h : hashes) keys.push_back(h.value());
  const std::vector<TierId> held = store_.lookup(keys);
  const std::byte* base = store_.host().arena().data();
  TierPushRun run;
  std::vector<HostTier::Pin> pins;
  std::vector<BlockKey> disk_keys;
  for (size_t i = 0; i < held.size(); ++i) {
    if (held[i] == TierId::kHost) {
      if (std::optional<HostTier::Pin> p = store_.host().pin(keys[i])) {
        run.blocks.push_back({TierId::kHost, static_cast<uint64_t>(p->bytes.data() - base)});
        pins.push_back(*p);
        continue;
      }
      // It left host memory since the lookup (moved down or dropped): the read below finds its
      // disk copy, or reports it missing, which ends the run there.
    }
    if (disk_keys.size() >= disk_buffers.size()) {  // no room: the rest is missing
      run.out_of_buffers = true;
      break;
    }
    run.blocks.push_back({TierId::kDisk, disk_keys.size()});
    disk_keys.push_back(keys[i]);
  }
  if (!pins.empty()) {
    run.id = next_id_++;
    pins_.emplace(run.id, std::move(pins));
  }
  run.disk = disk_keys.size();
  if (disk_keys.empty()) {
    std::move(on_disk_read)(0);
    return run;
  }
  auto reads = std::make_shared<DiskReads>(disk_keys.size(), std::move(on_disk_read));
  auto on_block = [reads](size_t i, OnboardState state) {
    std::unique_lock lock(reads->mu);
    reads->states[i] = state;
    if (--reads->left > 0) return;
    size_t intact = 0;
    while (intact < reads->states.size() && reads->states[intact] == OnboardState::kReady) {
      ++intact;
    }
    lock.unlock();
    std::move(reads->on_done)(intact);
  };
  // The ticket is not kept: every block reports through on_block, and the store keeps a block it
  // reads pinned in its tier until its bytes are in the buffer.
  store_.onboard(disk_keys, disk_buffers.first(disk_keys.size()), std::move(on_block));
  return run;
}

void TierPushSource::unpin(uint64_t id) {
  auto it = pins_.find(id);
  if (it == pins_.end()) return;
  for (const HostTier::Pin& p : it->second) store_.host().unpin(p);
  pins_.erase(it);
}

}  // namespace kvf::worker
