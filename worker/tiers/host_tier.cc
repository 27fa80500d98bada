#include "worker/tiers/host_tier.h"

#include <limits>
#include <utility>

#include "common/strings.h"

namespace kvf::worker {
namespace {

// Disk writes go straight from the slots with O_DIRECT, which wants 4 KiB-aligned buffers and
// lengths.
constexpr uint64_t kSlotAlign = 4096;

}  // namespace

absl::StatusOr<std::unique_ptr<HostTier>> HostTier::create(const HostTierOptions& options,
                                                           TierCounters* counters,
                                                           TierListener* listener,
                                                           const Clock* clock) {
  if (options.block_bytes == 0) return absl::InvalidArgumentError("host tier: block_bytes is 0");
  uint64_t slot_bytes = (options.block_bytes + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
  uint64_t slots = options.capacity_bytes / slot_bytes;
  if (slots == 0) {
    return absl::InvalidArgumentError(strCat("host tier: capacity ", options.capacity_bytes,
                                             " bytes holds no block of ", slot_bytes, " bytes"));
  }
  if (slots > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(strCat("host tier: ", slots, " slots is too many"));
  }
  if (options.offload_min_hits == 0 || options.max_write_attempts == 0) {
    return absl::InvalidArgumentError(
        "host tier: offload_min_hits and max_write_attempts must be at least 1");
  }
  auto arena = PinnedArena::create(slots * slot_bytes, options.pin);
  if (!arena.ok()) return arena.status();
  return std::unique_ptr<HostTier>(
      new HostTier(options, std::move(*arena), slot_bytes, slots, counters, listener, clock));
}

HostTier::HostTier(const HostTierOptions& options, std::unique_ptr<PinnedArena> arena,
                   uint64_t slot_bytes, size_t slots, TierCounters* counters,
                   TierListener* listener, const Clock* clock)
    : options_(options),
      arena_(std::move(arena)),
      slot_bytes_(slot_bytes),
      max_dirty_(options.writeback_max_dirty > 0 ? options.writeback_max_dirty
                                                 : std::max<uint64_t>(1, slots / 2)),
      counters_(counters),
      listener_(listener),
      clock_(clock),
      slots_(slots),
      lru_(slots),
      dirty_(slots) {
  free_.reserve(slots);
  for (size_t i = slots; i > 0; --i) free_.push_back(static_cast<int32_t>(i - 1));
  index_.reserve(slots);
}

std::span<std::byte> HostTier::slotBytes(int32_t slot) const {
  return {arena_->data() + static_cast<uint64_t>(slot) * slot_bytes_, slot_bytes_};
}

bool HostTier::evictable(const Slot& s) const {
  if (s.state != SlotState::kResident || s.pins > 0 || s.doomed) return false;
  switch (s.lower) {
    case Lower::kClean:
    case Lower::kExempt:
      return true;
    case Lower::kDirty:
      return options_.decouple_eviction;
    case Lower::kWriting:
      return false;  // the disk is reading the slot: never reusable, even when decoupled
  }
  return false;
}

template <class F>
void HostTier::update(int32_t i, F&& change) {
  Slot& s = slots_[i];
  bool was = evictable(s);
  change(s);
  bool now = evictable(s);
  if (now && !was) {
    ++evictable_;
    notifySpaceLocked();
  } else if (was && !now) {
    --evictable_;
  }
}

void HostTier::notifySpaceLocked() { space_cv_.notify_all(); }

int32_t HostTier::findVictim() const {
  if (evictable_ == 0) return SlotList::kNone;
  for (int32_t i = lru_.back(); i != SlotList::kNone; i = lru_.prev(i)) {
    if (evictable(slots_[i])) return i;
  }
  return SlotList::kNone;
}

void HostTier::evictLocked(int32_t i) {
  Slot& s = slots_[i];
  switch (s.lower) {
    case Lower::kClean:
      if (options_.has_lower_tier) {
        bump(counters_->host_moved_down);
      } else {
        counters_->drop(DropReason::kCapacity);
      }
      break;
    case Lower::kExempt:
      counters_->drop(s.exempt_reason);
      break;
    case Lower::kDirty:  // decouple_eviction: the write never happened
      counters_->drop(DropReason::kLostBeforeWrite);
      dirty_.remove(i);
      break;
    case Lower::kWriting:
      break;  // not evictable
  }
  BlockKey key = s.key;
  if (listener_ != nullptr) listener_->onRemoved(TierId::kHost, {&key, 1});
  index_.erase(key);
  lru_.remove(i);
  freeLocked(i);
}

void HostTier::freeLocked(int32_t i) {
  update(i, [](Slot& s) { s = Slot{}; });
  free_.push_back(i);
  notifySpaceLocked();
  if (dirty_.empty() && writing_ == 0) written_cv_.notify_all();
}

void HostTier::countUseLocked(int32_t i) {
  Slot& s = slots_[i];
  if (s.hits < std::numeric_limits<uint32_t>::max()) ++s.hits;
  lru_.moveToFront(i);
  if (s.lower == Lower::kExempt && s.exempt_reason == DropReason::kFrequencyFilter &&
      s.hits >= options_.offload_min_hits) {
    update(i, [&](Slot& x) {
      x.lower = Lower::kDirty;
      x.dirty_since = clock_->now();
    });
    dirty_.pushBack(i);
  }
}

absl::StatusOr<HostTier::Reservation> HostTier::reserve(BlockKey key) {
  std::lock_guard lock(mu_);
  if (auto it = index_.find(key); it != index_.end()) {
    if (slots_[it->second].state == SlotState::kResident) countUseLocked(it->second);
    return absl::AlreadyExistsError("host tier: block already stored");
  }
  if (free_.empty()) {
    int32_t victim = findVictim();
    if (victim == SlotList::kNone) {
      bump(counters_->host_backpressure);
      return absl::UnavailableError(strCat("host tier full: ", dirty_.size(), " blocks wait for ",
                                           "the disk, ", writing_, " are being written"));
    }
    evictLocked(victim);
  }
  int32_t slot = free_.back();
  free_.pop_back();
  update(slot, [&](Slot& s) {
    s.state = SlotState::kFilling;
    s.key = key;
  });
  index_.emplace(key, slot);
  return Reservation{slot, key, slotBytes(slot).first(options_.block_bytes)};
}

void HostTier::commit(const Reservation& r, std::optional<uint64_t> checksum, bool durable_below) {
  std::lock_guard lock(mu_);
  Lower lower = Lower::kClean;
  if (options_.has_lower_tier && !durable_below) {
    lower = options_.offload_min_hits > 1 ? Lower::kExempt : Lower::kDirty;
  }
  update(r.slot, [&](Slot& s) {
    s.state = SlotState::kResident;
    s.checksum = checksum.value_or(0);
    s.has_checksum = checksum.has_value();
    s.hits = 1;
    s.lower = lower;
    s.exempt_reason = DropReason::kFrequencyFilter;
    s.dirty_since = clock_->now();
  });
  if (lower == Lower::kDirty) dirty_.pushBack(r.slot);
  lru_.pushFront(r.slot);
  bump(counters_->host_stored);
  if (listener_ != nullptr) listener_->onStored(TierId::kHost, {&r.key, 1});
}

void HostTier::abort(const Reservation& r) {
  std::lock_guard lock(mu_);
  index_.erase(r.key);
  freeLocked(r.slot);
}

std::optional<HostTier::Pin> HostTier::pin(BlockKey key) {
  std::lock_guard lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end() || slots_[it->second].state != SlotState::kResident) return std::nullopt;
  int32_t i = it->second;
  countUseLocked(i);
  update(i, [](Slot& s) { ++s.pins; });
  const Slot& s = slots_[i];
  return Pin{i, key, slotBytes(i).first(options_.block_bytes),
             s.has_checksum ? std::optional(s.checksum) : std::nullopt};
}

void HostTier::unpin(const Pin& pin) {
  std::lock_guard lock(mu_);
  update(pin.slot, [](Slot& s) { --s.pins; });
  const Slot& s = slots_[pin.slot];
  if (s.doomed && s.pins == 0 && s.lower != Lower::kWriting) freeLocked(pin.slot);
}

void HostTier::touch(std::span<const BlockKey> keys) {
  std::lock_guard lock(mu_);
  for (BlockKey key : keys) {
    auto it = index_.find(key);
    if (it != index_.end() && slots_[it->second].state == SlotState::kResident) {
      countUseLocked(it->second);
    }
  }
}

bool HostTier::writeDueLocked(const Slot& s, Nanos now) const {
  if (options_.write_policy == WritePolicy::kWriteThrough || flushing_) return true;
  return now - s.dirty_since >= options_.writeback_max_lag || dirty_.size() > max_dirty_;
}

std::vector<HostTier::WriteJob> HostTier::takeDirty(size_t max_blocks) {
  std::vector<WriteJob> jobs;
  std::lock_guard lock(mu_);
  Nanos now = clock_->now();
  while (jobs.size() < max_blocks && !dirty_.empty()) {
    int32_t i = dirty_.front();
    if (!writeDueLocked(slots_[i], now)) break;
    dirty_.remove(i);
    update(i, [](Slot& s) { s.lower = Lower::kWriting; });
    ++writing_;
    const Slot& s = slots_[i];
    jobs.push_back(
        {i, s.key, slotBytes(i), s.has_checksum ? std::optional(s.checksum) : std::nullopt});
  }
  return jobs;
}

void HostTier::setChecksum(const WriteJob& job, uint64_t checksum) {
  std::lock_guard lock(mu_);
  slots_[job.slot].checksum = checksum;
  slots_[job.slot].has_checksum = true;
}

void HostTier::finishWrite(const WriteJob& job, WriteOutcome outcome) {
  std::lock_guard lock(mu_);
  --writing_;
  Slot& s = slots_[job.slot];
  if (s.doomed) {
    update(job.slot, [](Slot& x) { x.lower = Lower::kClean; });
    if (s.pins == 0) freeLocked(job.slot);
  } else if (outcome == WriteOutcome::kDurable) {
    update(job.slot, [](Slot& x) {
      x.lower = Lower::kClean;
      x.write_attempts = 0;
    });
  } else if (outcome == WriteOutcome::kNotTried) {
    update(job.slot, [](Slot& x) { x.lower = Lower::kDirty; });
    dirty_.pushFront(job.slot);
  } else if (s.write_attempts + 1u >= options_.max_write_attempts) {
    update(job.slot, [](Slot& x) {
      x.lower = Lower::kExempt;
      x.exempt_reason = DropReason::kWriteFailed;
    });
  } else {
    update(job.slot, [](Slot& x) {
      ++x.write_attempts;
      x.lower = Lower::kDirty;
    });
    dirty_.pushBack(job.slot);
  }
  if (dirty_.empty() && writing_ == 0) written_cv_.notify_all();
}

std::optional<Nanos> HostTier::nextWriteDue() const {
  std::lock_guard lock(mu_);
  if (options_.write_policy == WritePolicy::kWriteThrough || dirty_.empty()) return std::nullopt;
  if (flushing_ || dirty_.size() > max_dirty_) return clock_->now();
  return slots_[dirty_.front()].dirty_since + options_.writeback_max_lag;
}

void HostTier::setFlushing(bool flushing) {
  std::lock_guard lock(mu_);
  flushing_ = flushing;
}

bool HostTier::drop(BlockKey key, DropReason reason) {
  std::lock_guard lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end() || slots_[it->second].state != SlotState::kResident) return false;
  int32_t i = it->second;
  counters_->drop(reason);
  if (listener_ != nullptr) listener_->onRemoved(TierId::kHost, {&key, 1});
  index_.erase(it);
  lru_.remove(i);
  dirty_.remove(i);
  const Slot& s = slots_[i];
  if (s.pins > 0 || s.lower == Lower::kWriting) {
    update(i, [](Slot& x) { x.doomed = true; });
  } else {
    freeLocked(i);
  }
  if (dirty_.empty() && writing_ == 0) written_cv_.notify_all();
  return true;
}

bool HostTier::contains(BlockKey key) const {
  std::lock_guard lock(mu_);
  auto it = index_.find(key);
  return it != index_.end() && slots_[it->second].state == SlotState::kResident;
}

bool HostTier::waitForSpace(std::chrono::nanoseconds timeout) {
  std::unique_lock lock(mu_);
  return space_cv_.wait_for(lock, timeout, [&] { return !free_.empty() || evictable_ > 0; });
}

bool HostTier::waitWritten(std::chrono::nanoseconds timeout) {
  std::unique_lock lock(mu_);
  return written_cv_.wait_for(lock, timeout, [&] { return dirty_.empty() && writing_ == 0; });
}

HostTier::Usage HostTier::usage() const {
  std::lock_guard lock(mu_);
  return {slots_.size(), index_.size(), dirty_.size(), writing_, evictable_};
}

}  // namespace kvf::worker
