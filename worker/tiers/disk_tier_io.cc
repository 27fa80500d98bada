// DiskTier's I/O thread: submits reads before writes, batches writes, allocates and evicts slots,
// and completes every I/O (checking read payloads against their checksums).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/log.h"
#include "common/strings.h"
#include "worker/tiers/disk_format.h"
#include "worker/tiers/disk_tier.h"
#include "worker/tiers/disk_tier_internal.h"
#include "worker/tiers/pinned_arena.h"

namespace kvf::worker {
namespace {

constexpr Nanos kGrowRetry = 5 * kNanosPerSecond;

bool sectorAligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kDiskSector == 0; }

// The status of an I/O that should have moved `expected` bytes and returned `result`.
absl::Status ioResult(int result, uint64_t expected, std::string_view what) {
  if (result >= 0 && static_cast<uint64_t>(result) == expected) return absl::OkStatus();
  if (result < 0) return errnoToStatus(-result, what);
  return absl::DataLossError(strCat(what, ": ", result, " of ", expected, " bytes"));
}

}  // namespace

void DiskTier::armWakeup() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
  io_uring_prep_read(sqe, wake_fd_, &ring_->wake_value, sizeof ring_->wake_value, 0);
  io_uring_sqe_set_data64(sqe, 0);
}

void DiskTier::run() {
  std::vector<Op*> held;  // finished ops a fault-injected slow disk has not released yet
  std::vector<Op*> finished_ops;
  armWakeup();
  while (true) {
    Nanos budget = -1;
    bool finished = false;
    {
      std::unique_lock lock(mu_);
      if (stop_) cancelPendingLocked();
      submitReadsLocked();
      submitWritesLocked(lock);
      finished = stop_ && writes_in_flight_ + reads_in_flight_ == 0 && held.empty();
      budget = waitBudgetLocked(clock_.now());
    }
    runDeferred();
    if (finished) break;
    Nanos now = clock_.now();
    for (const Op* op : held) {
      Nanos d = std::max<Nanos>(0, op->submitted + options_.fault_io_delay - now);
      budget = budget < 0 ? d : std::min(budget, d);
    }
    // One system call submits what was prepared and waits for the first completion.
    io_uring_cqe* cqe = nullptr;
    __kernel_timespec ts{budget / kNanosPerSecond, budget % kNanosPerSecond};
    int rc = io_uring_submit_and_wait_timeout(&ring_->ring, &cqe, 1, budget < 0 ? nullptr : &ts,
                                              nullptr);
    if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
      submit_log_.warn("disk tier: io_uring_submit_and_wait failed", "error", std::strerror(-rc));
    }
    finished_ops.clear();
    unsigned head = 0;
    unsigned count = 0;
    io_uring_for_each_cqe(&ring_->ring, head, cqe) {
      ++count;
      auto data = static_cast<uintptr_t>(io_uring_cqe_get_data64(cqe));
      if (data == 0) {  // the wakeup eventfd
        wake_armed_.store(false);
        armWakeup();
        continue;
      }
      auto* op = reinterpret_cast<Op*>(data & ~kHeaderTag);
      ((data & kHeaderTag) != 0 ? op->header_result : op->payload_result) = cqe->res;
      if (--op->remaining == 0) finished_ops.push_back(op);
    }
    io_uring_cq_advance(&ring_->ring, count);
    now = clock_.now();
    for (Op* op : finished_ops) {
      if (options_.fault_io_delay > 0 && now < op->submitted + options_.fault_io_delay) {
        held.push_back(op);
      } else {
        completeOp(op);
      }
    }
    std::erase_if(held, [&](Op* op) {
      if (now < op->submitted + options_.fault_io_delay) return false;
      completeOp(op);
      return true;
    });
  }
}

void DiskTier::runDeferred() {
  for (auto& [done, status] : deferred_) std::move(done)(std::move(status));
  deferred_.clear();
}

void DiskTier::cancelPendingLocked() {
  for (WriteRequest& w : pending_writes_) {
    forgetWritingKeyLocked(w.key);
    --accepted_writes_;
    deferred_.emplace_back(std::move(w.done), absl::CancelledError("disk tier stopped"));
  }
  pending_writes_.clear();
  released_writes_ = 0;
  for (ReadRequest& r : pending_reads_) {
    unpinLocked(r.slot);
    deferred_.emplace_back(std::move(r.done), absl::CancelledError("disk tier stopped"));
  }
  pending_reads_.clear();
  if (accepted_writes_ == 0) drained_cv_.notify_all();
}

// True when the key's last pending or in-flight write is gone and a removal cancelled it.
bool DiskTier::forgetWritingKeyLocked(BlockKey key) {
  auto it = writing_keys_.find(key);
  bool cancelled = cancelled_keys_.contains(key);
  if (it != writing_keys_.end() && --it->second == 0) {
    writing_keys_.erase(it);
    cancelled_keys_.erase(key);
  }
  return cancelled;
}

DiskTier::Op* DiskTier::takeOp() {
  Op* op = free_ops_.back();
  free_ops_.pop_back();
  op->submitted = clock_.now();
  return op;
}

// Points the op's payload request at `caller` when O_DIRECT can use it in place, else at the
// op's bounce buffer.
bool DiskTier::setPayload(Op* op, std::byte* caller, size_t caller_size) {
  bool direct = files_->directIo();
  op->payload_len = static_cast<uint32_t>(direct ? padded_bytes_ : block_bytes_);
  op->bounced = direct && (!sectorAligned(caller) || caller_size < padded_bytes_);
  if (!op->bounced) {
    op->payload = caller;
    return true;
  }
  if (op->bounce == nullptr) op->bounce = allocateSectors(padded_bytes_);
  op->payload = op->bounce.get();
  return op->payload != nullptr;
}

void DiskTier::submitReadsLocked() {
  while (reads_in_flight_ < options_.queue_depth && !pending_reads_.empty() && !free_ops_.empty()) {
    ReadRequest r = std::move(pending_reads_.front());
    pending_reads_.pop_front();
    Op* op = takeOp();
    op->kind = Op::Kind::kRead;
    op->key = r.key;
    op->slot = r.slot;
    op->checksum = r.checksum;
    op->out = r.out;
    op->done = std::move(r.done);
    op->promotion = r.promotion;
    if (!setPayload(op, r.out.data(), r.out.size())) {
      unpinLocked(r.slot);
      deferred_.emplace_back(std::move(op->done), absl::ResourceExhaustedError("out of memory"));
      free_ops_.push_back(op);
      continue;
    }
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
    io_uring_prep_read(sqe, files_->fd(fileOf(r.slot)), op->payload, op->payload_len,
                       payloadOffsetOf(r.slot));
    io_uring_sqe_set_data64(sqe, reinterpret_cast<uintptr_t>(op));
    op->remaining = 1;
    ++reads_in_flight_;
  }
}

bool DiskTier::writeBatchDueLocked(Nanos now) {
  size_t waiting = pending_writes_.size() - released_writes_;
  if (waiting > 0) {
    const WriteRequest& oldest = pending_writes_[released_writes_];
    // A full queue cannot grow into a bigger batch: waiting longer would only stall the writer.
    bool queue_full = accepted_writes_ >= options_.max_queued_writes;
    if (waiting * block_bytes_ >= options_.batch_bytes || queue_full ||
        now - oldest.enqueued >= options_.batch_window || draining_ || stop_) {
      released_writes_ = pending_writes_.size();
    }
  }
  return released_writes_ > 0;
}

void DiskTier::submitWritesLocked(std::unique_lock<std::mutex>& lock) {
  Nanos now = clock_.now();
  if (!writeBatchDueLocked(now)) return;
  while (released_writes_ > 0 && writes_in_flight_ < options_.queue_depth && !free_ops_.empty()) {
    if (options_.write_bytes_per_second > 0 && now < next_write_at_) break;
    if (cancelled_keys_.contains(pending_writes_.front().key)) {
      WriteRequest w = std::move(pending_writes_.front());
      pending_writes_.pop_front();
      --released_writes_;
      --accepted_writes_;
      forgetWritingKeyLocked(w.key);
      deferred_.emplace_back(std::move(w.done), absl::CancelledError("block removed"));
      continue;
    }
    int32_t slot = allocateSlotLocked(lock);  // may drop the lock to grow the tier
    if (slot == SlotList::kNone) break;
    WriteRequest w = std::move(pending_writes_.front());
    pending_writes_.pop_front();
    --released_writes_;
    Op* op = takeOp();
    op->kind = Op::Kind::kWrite;
    op->key = w.key;
    op->slot = slot;
    op->checksum = w.checksum;
    op->done = std::move(w.done);
    auto* payload = const_cast<std::byte*>(w.payload.data());
    if (!setPayload(op, payload, w.payload.size())) {
      freeSlotLocked(slot);
      --accepted_writes_;
      forgetWritingKeyLocked(w.key);
      deferred_.emplace_back(std::move(op->done), absl::ResourceExhaustedError("out of memory"));
      free_ops_.push_back(op);
      continue;
    }
    if (op->bounced) std::memcpy(op->bounce.get(), w.payload.data(), block_bytes_);
    encodeSlotHeader({w.key, block_bytes_, w.checksum, sequence_++},
                     {op->header.get(), kDiskSector});
    slots_[slot].state = SlotState::kWriting;
    slots_[slot].key = w.key;
    // Payload and header go together; a crash between them leaves a header whose checksum the
    // old payload fails, so the block is dropped, never served.
    int fd = files_->fd(fileOf(slot));
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
    io_uring_prep_write(sqe, fd, op->payload, op->payload_len, payloadOffsetOf(slot));
    io_uring_sqe_set_data64(sqe, reinterpret_cast<uintptr_t>(op));
    sqe = io_uring_get_sqe(&ring_->ring);
    io_uring_prep_write(sqe, fd, op->header.get(), kDiskSector, headerOffsetOf(slot));
    io_uring_sqe_set_data64(sqe, reinterpret_cast<uintptr_t>(op) | kHeaderTag);
    op->remaining = 2;
    ++writes_in_flight_;
    if (options_.write_bytes_per_second > 0) {
      Nanos cost = static_cast<Nanos>(static_cast<double>(op->payload_len + kDiskSector) * 1e9 /
                                      static_cast<double>(options_.write_bytes_per_second));
      next_write_at_ = std::max(now, next_write_at_) + cost;
    }
  }
}

int32_t DiskTier::allocateSlotLocked(std::unique_lock<std::mutex>& lock) {
  auto take = [&] {
    int32_t slot = free_.back();
    free_.pop_back();
    return slot;
  };
  if (!free_.empty()) return take();
  Nanos now = clock_.now();
  if (now >= grow_retry_at_) {
    for (uint32_t f = 0; f < files_->fileCount(); ++f) {
      if (files_->fd(f) >= 0) continue;
      lock.unlock();
      absl::Status grown = files_->allocate(f);
      lock.lock();
      if (grown.ok()) {
        auto first = static_cast<int32_t>(f * slots_per_file_);
        auto n = static_cast<int32_t>(files_->fileBytes(f) / slot_bytes_);
        for (int32_t i = first + n - 1; i >= first; --i) free_.push_back(i);
        allocated_slots_ += static_cast<size_t>(n);
        return take();
      }
      bump(counters_->disk_grow_failures);
      grow_retry_at_ = now + kGrowRetry;
      grow_log_.warn("disk tier cannot grow: evicting within what it has", "error",
                     std::string(grown.message()), "blocks", allocated_slots_);
      if (!free_.empty()) return take();  // freed while the lock was down
      break;
    }
  }
  for (int32_t i = lru_.back(); i != SlotList::kNone; i = lru_.prev(i)) {
    if (slots_[i].pins == 0) {
      dropLocked(i, DropReason::kCapacity);
      return take();
    }
  }
  return SlotList::kNone;
}

Nanos DiskTier::waitBudgetLocked(Nanos now) const {
  Nanos budget = -1;
  auto until = [&](Nanos t) {
    Nanos d = std::max<Nanos>(0, t - now);
    budget = budget < 0 ? d : std::min(budget, d);
  };
  if (pending_writes_.size() > released_writes_) {
    until(pending_writes_[released_writes_].enqueued + options_.batch_window);
  }
  if (released_writes_ > 0 && writes_in_flight_ < options_.queue_depth) {
    if (options_.write_bytes_per_second > 0 && next_write_at_ > now) until(next_write_at_);
    if (free_.empty() && grow_retry_at_ > now) until(grow_retry_at_);
  }
  return budget;
}

void DiskTier::completeOp(Op* op) {
  if (op->kind == Op::Kind::kWrite) {
    completeWrite(op);
  } else {
    completeRead(op);
  }
}

void DiskTier::completeWrite(Op* op) {
  absl::Status status = ioResult(op->payload_result, op->payload_len, "writing a block");
  if (status.ok()) status = ioResult(op->header_result, kDiskSector, "writing a block header");
  Done done = std::move(op->done);
  {
    std::lock_guard lock(mu_);
    --writes_in_flight_;
    --accepted_writes_;
    bool cancelled = forgetWritingKeyLocked(op->key);
    if (!status.ok()) {
      bump(counters_->disk_write_errors);
      io_log_.warn("disk tier write failed", "error", std::string(status.message()));
      freeSlotLocked(op->slot);
    } else if (cancelled || index_.contains(op->key)) {
      freeSlotLocked(op->slot);  // removed meanwhile, or a duplicate: nothing new to keep
      if (cancelled) status = absl::CancelledError("block removed");
    } else {
      slots_[op->slot] = Slot{op->key, op->checksum, 0, SlotState::kResident, false};
      index_.emplace(op->key, op->slot);
      lru_.pushFront(op->slot);
      bump(counters_->disk_written);
      bump(counters_->disk_bytes_written, block_bytes_);
      if (listener_ != nullptr) listener_->onStored(TierId::kDisk, {&op->key, 1});
    }
    if (accepted_writes_ == 0) drained_cv_.notify_all();
    free_ops_.push_back(op);
  }
  std::move(done)(std::move(status));
}

void DiskTier::completeRead(Op* op) {
  absl::Status status = ioResult(op->payload_result, op->payload_len, "reading a block");
  bool corrupt = false;
  if (status.ok()) {
    std::span<std::byte> out = op->out.first(block_bytes_);
    uint64_t sum =
        op->bounced ? copyWithChecksum(out, {op->bounce.get(), block_bytes_}) : blockChecksum(out);
    corrupt = sum != op->checksum;
    if (corrupt) {
      status = absl::DataLossError(strCat("disk tier: block ", op->key, " failed its checksum"));
    }
  }
  Done done = std::move(op->done);
  {
    std::lock_guard lock(mu_);
    --reads_in_flight_;
    if (corrupt) {
      io_log_.warn("disk tier: corrupt block dropped", "key", op->key);
      auto it = index_.find(op->key);
      if (it != index_.end() && it->second == op->slot) dropLocked(op->slot, DropReason::kCorrupt);
    } else if (status.ok()) {
      if (!slots_[op->slot].doomed) lru_.moveToFront(op->slot);  // a hit makes it recent
      bump(op->promotion ? counters_->disk_promoted : counters_->disk_onboarded);
      bump(counters_->disk_bytes_read, block_bytes_);
    } else {
      bump(counters_->disk_read_errors);
      io_log_.warn("disk tier read failed", "error", std::string(status.message()));
    }
    unpinLocked(op->slot);
    free_ops_.push_back(op);
  }
  std::move(done)(std::move(status));
}

}  // namespace kvf::worker
