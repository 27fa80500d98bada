// G3: KV blocks on local disk through io_uring. Blocks live in fixed slots of preallocated slab
// files (slab_files.h, disk_format.h) under a byte budget, with an LRU, a per-block xxh3 checksum
// checked on every read (a mismatch drops the block and is never served), writes batched the way
// the seed's offloader does ("30 ms or 1 MiB"), at most queue_depth writes and as many reads in
// flight, and an optional write rate limit. At start the index is rebuilt from the slot headers
// or the directory is cleared, by config, and startReport() says which.
//
// Threads: one I/O thread owns the ring and runs every completion callback. write(), read(),
// remove() and the queries are thread-safe. A TierListener is called with the tier's lock held.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/log.h"
#include "worker/tiers/slab_files.h"
#include "worker/tiers/slot_list.h"
#include "worker/tiers/tier_types.h"

namespace kvf::worker {

enum class DiskStart : uint8_t { kRebuild, kClear };
// kOnDemand: a slab file is allocated when the tier first needs a slot in it (a full disk then
// caps the tier's size instead of failing the start); kEager: every file at start.
enum class Preallocate : uint8_t { kOnDemand, kEager };

struct DiskTierOptions {
  std::string dir;
  uint64_t block_bytes = 0;
  uint64_t capacity_bytes = 0;      // budget over every slab file
  uint64_t file_bytes = 256 << 20;  // per slab file, rounded down to whole slots
  DirectIo direct_io = DirectIo::kAuto;
  Preallocate preallocate = Preallocate::kOnDemand;
  DiskStart on_start = DiskStart::kRebuild;
  uint32_t queue_depth = 16;        // writes in flight (and, separately, reads in flight)
  uint32_t max_queued_writes = 64;  // accepted but unfinished writes: the offload queue's bound
  uint64_t batch_bytes = 1 << 20;   // submit the queued writes once this many bytes wait ...
  Nanos batch_window = 30 * kNanosPerMilli;  // ... or the oldest waited this long, or the queue
                                             // (max_queued_writes) is full
  uint64_t write_bytes_per_second = 0;       // 0: unlimited
  Nanos fault_io_delay = 0;  // fault injection: every I/O takes at least this long (a slow disk)
};

struct DiskStartReport {
  DiskStart action = DiskStart::kClear;  // kRebuild: the index came from the files
  std::string reason;
  uint64_t recovered_blocks = 0;
  uint64_t invalid_slots = 0;  // allocated slots whose header did not check out
  bool direct_io = false;
};

class DiskTier {
 public:
  // Runs on the I/O thread (or, for an immediate answer, on the caller's thread).
  using Done = absl::AnyInvocable<void(absl::Status) &&>;

  static absl::StatusOr<std::unique_ptr<DiskTier>> create(const DiskTierOptions& options,
                                                          TierCounters* counters,
                                                          TierListener* listener);
  // Cancels writes not yet submitted (Cancelled), waits for those in flight.
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // Accepts an asynchronous write of one block. `payload` holds the block's bytes first; when it
  // is 4 KiB-aligned and spans block_bytes rounded up to 4 KiB it is written in place, otherwise
  // through a bounce buffer. It must stay valid and unchanged until `done`, which gets OK once
  // the block is durable (readable from the file), or the error. Unavailable: the write queue is
  // full (backpressure; `done` is not called). AlreadyExists: the key is on disk already.
  absl::Status write(BlockKey key, std::span<const std::byte> payload, uint64_t checksum,
                     Done done);
  // Reads `key` into `out` (at least block_bytes; aligned room for the padded size avoids a bounce
  // copy). `done` gets OK, NotFound (not on disk; may run before read() returns), DataLoss (the
  // checksum did not match: the block is dropped as kCorrupt) or an I/O error. The block cannot
  // be evicted while its read is in flight. `promotion`: a read into host memory, counted as
  // promoted rather than onboarded.
  void read(BlockKey key, std::span<std::byte> out, Done done, bool promotion = false);
  // Drops `key` (counted as kRemoved when `count_drop`: false when the caller counted the block
  // already); false when not on disk. A pending write of it is cancelled.
  bool remove(BlockKey key, bool count_drop = true);
  bool contains(BlockKey key) const;
  // Every key on disk now (for publishing what a rebuild recovered).
  std::vector<BlockKey> keys() const;

  // Waits until every accepted write finished; submits partial batches at once meanwhile.
  bool drain(std::chrono::nanoseconds timeout);

  const DiskStartReport& startReport() const { return start_; }
  uint64_t blockBytes() const { return block_bytes_; }
  size_t queuedWrites() const;
  size_t maxQueuedWrites() const { return options_.max_queued_writes; }
  size_t blocks() const;
  size_t capacityBlocks() const { return slots_.size(); }
  // Slots in allocated files: below capacityBlocks() while the tier grows or the disk is full.
  size_t allocatedBlocks() const;
  bool directIo() const { return files_->directIo(); }

 private:
  struct Op;
  struct WriteRequest;
  struct ReadRequest;
  enum class SlotState : uint8_t { kFree, kWriting, kResident };
  struct Slot {
    BlockKey key = 0;
    uint64_t checksum = 0;
    uint32_t pins = 0;
    SlotState state = SlotState::kFree;
    bool doomed = false;  // removed while pinned: freed at the last unpin
  };

  DiskTier(const DiskTierOptions& options, std::unique_ptr<SlabFiles> files, TierCounters* counters,
           TierListener* listener);
  absl::Status start(bool rebuild, std::string reason);
  absl::Status rebuildIndex();
  uint64_t headerOffsetOf(int32_t slot) const;
  uint64_t payloadOffsetOf(int32_t slot) const;
  uint64_t slotsIn(uint32_t file) const;
  uint32_t fileOf(int32_t slot) const;

  // I/O thread.
  void run();
  void runDeferred();
  void cancelPendingLocked();
  bool forgetWritingKeyLocked(BlockKey key);
  Op* takeOp();
  bool setPayload(Op* op, std::byte* caller, size_t caller_size);
  void submitReadsLocked();
  void submitWritesLocked(std::unique_lock<std::mutex>& lock);
  int32_t allocateSlotLocked(std::unique_lock<std::mutex>& lock);
  bool writeBatchDueLocked(Nanos now);
  void completeOp(Op* op);
  void completeWrite(Op* op);
  void completeRead(Op* op);
  void armWakeup();
  void wake();
  Nanos waitBudgetLocked(Nanos now) const;

  // Removes a resident block; counts it under `reason` unless nullopt.
  void dropLocked(int32_t slot, std::optional<DropReason> reason);
  void unpinLocked(int32_t slot);
  void freeSlotLocked(int32_t slot);

  const DiskTierOptions options_;
  const uint64_t block_bytes_;
  const uint64_t padded_bytes_;  // block_bytes rounded up to a sector
  const uint64_t slot_bytes_;
  const uint64_t slots_per_file_;
  std::unique_ptr<SlabFiles> files_;
  TierCounters* counters_;
  TierListener* listener_;
  SteadyClock clock_;
  DiskStartReport start_;

  mutable std::mutex mu_;
  std::condition_variable drained_cv_;
  std::vector<Slot> slots_;
  absl::flat_hash_map<BlockKey, int32_t> index_;
  SlotList lru_;
  std::vector<int32_t> free_;
  size_t allocated_slots_ = 0;  // slots in allocated slab files
  Nanos grow_retry_at_ = 0;
  std::deque<WriteRequest> pending_writes_;
  size_t released_writes_ = 0;  // leading pending writes whose batch is due
  uint64_t pending_write_bytes_ = 0;
  size_t accepted_writes_ = 0;
  absl::flat_hash_map<BlockKey, uint32_t> writing_keys_;  // pending or in flight, per key
  absl::flat_hash_map<BlockKey, bool> cancelled_keys_;    // removed while being written
  std::deque<ReadRequest> pending_reads_;
  uint64_t sequence_ = 1;
  Nanos next_write_at_ = 0;  // rate limit
  bool draining_ = false;
  bool stop_ = false;
  uint32_t writes_in_flight_ = 0;
  uint32_t reads_in_flight_ = 0;

  // I/O thread only.
  struct Ring;
  std::unique_ptr<Ring> ring_;
  std::vector<std::unique_ptr<Op>> ops_;
  std::vector<Op*> free_ops_;
  std::vector<std::pair<Done, absl::Status>> deferred_;  // run after the lock is released
  log::RateLimitedLog io_log_;
  log::RateLimitedLog grow_log_;
  log::RateLimitedLog submit_log_;
  int wake_fd_ = -1;
  std::atomic<bool> wake_armed_{false};
  std::thread thread_;
};

}  // namespace kvf::worker
