#include "engine/queued_prefetch.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvf::engine {

const char* prefetchSkipName(PrefetchSkip reason) {
  switch (reason) {
    case PrefetchSkip::kBudget:
      return "budget";
    case PrefetchSkip::kHostFull:
      return "host_full";
  }
  return "unknown";
}

QueuedPrefetch::QueuedPrefetch(const worker::TierPrefetchOptions& options, LowerTiers* tiers,
                               const TimingModel* timing, int64_t block_size)
    : options_(options), tiers_(tiers), block_read_(timing->diskReadDuration(block_size)) {}

void QueuedPrefetch::skipRest(const TierRun& run, size_t from, PrefetchSkip reason) {
  uint64_t n = 0;
  for (size_t i = from; i < run.size(); ++i) n += run.tiers[i] == worker::TierId::kDisk ? 1 : 0;
  stats_.skipped[static_cast<size_t>(reason)] += n;
}

void QueuedPrefetch::onQueued(std::span<const BlockHash> past_g1, Nanos now,
                              std::vector<BlockHash>* held) {
  TierRun run = tiers_->lookup(past_g1);
  if (run.size() == 0) return;
  const size_t capacity = tiers_->hostRoom().capacity;
  const auto budget =
      static_cast<size_t>(std::floor(options_.budget_fraction * static_cast<double>(capacity)));
  touch_.clear();
  for (size_t i = 0; i < run.size(); ++i) {
    const BlockHash h = past_g1[i];
    if (auto it = entries_.find(h.value()); it != entries_.end()) {
      ++it->second.refs;  // promoted for an earlier request: this one waits on it too
      held->push_back(h);
      continue;
    }
    if (run.tiers[i] == worker::TierId::kHost) {
      // Touches cost no room; the budget bounds them as it bounds promotions.
      if (touch_.size() < budget) touch_.push_back(h);
      continue;
    }
    if (entries_.size() >= budget) {
      skipRest(run, i, PrefetchSkip::kBudget);
      break;
    }
    entries_.emplace(h.value(), Entry{0, 1, false, false});
    waiting_.push_back(h);
    held->push_back(h);
  }
  if (!touch_.empty()) {
    tiers_->touch(touch_);
    stats_.touched += touch_.size();
  }
  pump(now);
}

void QueuedPrefetch::pump(Nanos now) {
  while (!reads_.empty() && reads_.front() <= now) reads_.pop_front();
  if (waiting_.empty()) return;
  const HostRoom room = tiers_->hostRoom();
  const auto margin =
      static_cast<size_t>(std::ceil(options_.margin_fraction * static_cast<double>(room.capacity)));
  size_t available = room.available;
  while (!waiting_.empty() &&
         std::max(reads_.size(), tiers_->promotionsInFlight()) < options_.max_reads_in_flight) {
    auto it = entries_.find(waiting_.front().value());
    if (it == entries_.end() || it->second.started) {  // released (or started) meanwhile
      waiting_.pop_front();
      continue;
    }
    if (available <= margin) break;  // room frees as the LRU's dirty blocks reach the disk
    PromoteOutcome outcome = tiers_->promote(waiting_.front());
    if (outcome == PromoteOutcome::kNoRoom) {
      ++stats_.skipped[static_cast<size_t>(PrefetchSkip::kHostFull)];
      break;
    }
    waiting_.pop_front();
    Entry& e = it->second;
    e.started = true;
    if (outcome == PromoteOutcome::kInHost) {
      e.ready_at = now;  // host memory has it (an offload came first): nothing to read
      continue;
    }
    if (outcome == PromoteOutcome::kNotOnDisk) {
      e.ready_at = std::numeric_limits<Nanos>::max();  // gone: the admission finds it or not
      continue;
    }
    --available;
    disk_free_at_ = std::max(now, disk_free_at_) + block_read_;
    reads_.push_back(disk_free_at_);
    e.ready_at = disk_free_at_;
    ++stats_.promoted;
  }
}

void QueuedPrefetch::adjustRun(std::span<const BlockHash> hashes, TierRun& run, Nanos now) const {
  if (entries_.empty()) return;
  for (size_t i = 0; i < run.size() && i < hashes.size(); ++i) {
    if (run.tiers[i] != worker::TierId::kHost) continue;
    auto it = entries_.find(hashes[i].value());
    if (it == entries_.end() || (it->second.started && it->second.ready_at <= now)) continue;
    // The modelled read is not done: the onboard pays for the disk, as without prefetch.
    run.tiers[i] = worker::TierId::kDisk;
    --run.host;
    ++run.disk;
  }
}

void QueuedPrefetch::onOnboard(std::span<const BlockHash> hashes,
                               std::span<const worker::TierId> tiers) {
  if (entries_.empty()) return;
  for (size_t i = 0; i < hashes.size() && i < tiers.size(); ++i) {
    auto it = entries_.find(hashes[i].value());
    if (it == entries_.end()) continue;
    if (tiers[i] == worker::TierId::kHost) {
      ++stats_.used;
      it->second.used = true;
    } else {
      ++stats_.late;  // still being read (modelled or for real), or gone from host memory
    }
  }
}

void QueuedPrefetch::release(std::vector<BlockHash>* held) {
  for (BlockHash h : *held) {
    auto it = entries_.find(h.value());
    if (it == entries_.end() || --it->second.refs > 0) continue;
    if (!it->second.used) ++stats_.wasted;
    entries_.erase(it);
  }
  held->clear();
}

}  // namespace kvf::engine
