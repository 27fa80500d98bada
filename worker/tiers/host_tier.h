// G2: KV blocks in page-locked host memory. A byte budget split into fixed slots, an LRU, a
// per-block xxh3 checksum, and the lossless rule: with a disk tier below, a block leaves host
// memory only once its disk write completed (or a counted policy drops it: the frequency filter,
// a write that failed for good). The slot memory is the DMA source of the disk writes and the
// target of a GPU's copies. The tier owns its slots; every method is thread-safe (one mutex, never
// held during a copy: a slot being filled, read or written to disk is held by its state or pins).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "worker/tiers/pinned_arena.h"
#include "worker/tiers/slot_list.h"
#include "worker/tiers/tier_types.h"

namespace kvf::worker {

// When a block is written to the tier below. Write-through: as soon as it is stored.
// Write-back: once it has waited writeback_max_lag, or while more than writeback_max_dirty blocks
// wait; a block that is used again meanwhile costs no write.
enum class WritePolicy : uint8_t { kWriteThrough, kWriteBack };

struct HostTierOptions {
  uint64_t block_bytes = 0;     // payload bytes per block
  uint64_t capacity_bytes = 0;  // budget; slots are block_bytes rounded up to 4 KiB
  PinMode pin = PinMode::kPreferred;
  bool has_lower_tier = false;  // a disk tier below: blocks must be written before they leave
  // The seed's failure, for experiments only: eviction ignores whether the disk write happened
  // (a block whose write has not started is lost, counted as kLostBeforeWrite).
  bool decouple_eviction = false;
  uint32_t offload_min_hits = 1;  // frequency filter: 1 = every block is written
  uint32_t max_write_attempts = 3;
  WritePolicy write_policy = WritePolicy::kWriteThrough;
  Nanos writeback_max_lag = 2 * kNanosPerSecond;
  uint64_t writeback_max_dirty = 0;  // 0: half the slots
};

class HostTier {
 public:
  static absl::StatusOr<std::unique_ptr<HostTier>> create(const HostTierOptions& options,
                                                          TierCounters* counters,
                                                          TierListener* listener,
                                                          const Clock* clock);

  // A slot reserved for one key, to be filled by the caller and then committed or aborted.
  struct Reservation {
    int32_t slot = -1;
    BlockKey key = 0;
    std::span<std::byte> bytes;  // block_bytes
  };
  // Reserves a slot for `key`, evicting the least recently used block that may leave.
  // AlreadyExists: the key is stored (its use is counted). Unavailable: no slot may be freed now
  // (every block is dirty, being written or pinned): backpressure, nothing changed.
  absl::StatusOr<Reservation> reserve(BlockKey key);
  // The bytes are in: the block becomes visible. `checksum`: the payload's, when the caller has
  // it (else the offloader computes it before the disk write, off the engine's path).
  // `durable_below`: the tier below already holds the key, so the block is clean at once.
  void commit(const Reservation& reservation, std::optional<uint64_t> checksum, bool durable_below);
  void abort(const Reservation& reservation);

  // A resident block held for reading: it cannot be evicted or reused until unpin().
  struct Pin {
    int32_t slot = -1;
    BlockKey key = 0;
    std::span<const std::byte> bytes;
    std::optional<uint64_t> checksum;  // nullopt until computed
  };
  // Pins `key` and counts a use; nullopt when it is not resident.
  std::optional<Pin> pin(BlockKey key);
  void unpin(const Pin& pin);
  // Counts a use of each resident key and refreshes its LRU position (blocks the engine hit in
  // its own pool, for the frequency filter).
  void touch(std::span<const BlockKey> keys);

  // A block handed to the disk: it stays pinned until finishWrite().
  struct WriteJob {
    int32_t slot = -1;
    BlockKey key = 0;
    std::span<const std::byte> bytes;  // the whole slot: the payload, then zeros to 4 KiB
    std::optional<uint64_t> checksum;  // nullopt until computed: setChecksum() before writing
  };
  enum class WriteOutcome : uint8_t {
    kDurable,   // the disk holds the block now: it may leave host memory
    kFailed,    // the disk refused it: written again later, up to max_write_attempts
    kNotTried,  // never reached the disk (its queue was full): back in line, no attempt counted
  };
  // Up to `max_blocks` blocks due for writing, oldest first (write-back: only those due).
  std::vector<WriteJob> takeDirty(size_t max_blocks);
  // Records the checksum of a block handed out by takeDirty() (its bytes cannot change).
  void setChecksum(const WriteJob& job, uint64_t checksum);
  // After max_write_attempts failures a block stays unwritten and leaves as kWriteFailed.
  void finishWrite(const WriteJob& job, WriteOutcome outcome);
  // Write-back: when the oldest dirty block falls due; nullopt when none waits for time.
  std::optional<Nanos> nextWriteDue() const;
  // While set, write-back treats every dirty block as due (a flush before shutdown or a test).
  void setFlushing(bool flushing);

  // Drops `key` with `reason` (a corrupt copy, a removal); a pinned or in-flight block is freed
  // when released. False when not resident.
  bool drop(BlockKey key, DropReason reason);
  bool contains(BlockKey key) const;

  // Waits (real time) until reserve() could succeed or `timeout` passes; false on timeout.
  bool waitForSpace(std::chrono::nanoseconds timeout);
  // Waits until no block waits for or is in a disk write (write-back blocks not yet due count
  // as waiting); false on timeout.
  bool waitWritten(std::chrono::nanoseconds timeout);

  struct Usage {
    size_t capacity = 0;  // slots
    size_t resident = 0;
    size_t dirty = 0;    // waiting for a disk write
    size_t writing = 0;  // in a disk write
    size_t evictable = 0;
  };
  Usage usage() const;
  uint64_t blockBytes() const { return options_.block_bytes; }
  PinKind pinKind() const { return arena_->kind(); }
  // The whole slot arena (fixed for the tier's life): what a transport registers so that a
  // pinned slot's bytes (Pin::bytes lie inside it) can be sent without a copy.
  std::span<std::byte> arena() const { return {arena_->data(), arena_->size()}; }

 private:
  enum class SlotState : uint8_t { kFree, kFilling, kResident };
  enum class Lower : uint8_t { kClean, kDirty, kWriting, kExempt };
  struct Slot {
    BlockKey key = 0;
    uint64_t checksum = 0;
    Nanos dirty_since = 0;
    uint32_t pins = 0;
    uint32_t hits = 0;
    uint8_t write_attempts = 0;
    bool has_checksum = false;
    SlotState state = SlotState::kFree;
    Lower lower = Lower::kClean;
    DropReason exempt_reason = DropReason::kCapacity;  // with kExempt: why it is not written
    bool doomed = false;                               // dropped while held: free on release
  };

  HostTier(const HostTierOptions& options, std::unique_ptr<PinnedArena> arena, uint64_t slot_bytes,
           size_t slots, TierCounters* counters, TierListener* listener, const Clock* clock);

  std::span<std::byte> slotBytes(int32_t slot) const;
  bool evictable(const Slot& s) const;
  // Applies `change` to slot `i`, keeping evictable_ and the counts in step.
  template <class F>
  void update(int32_t i, F&& change);
  int32_t findVictim() const;
  void evictLocked(int32_t i);
  void freeLocked(int32_t i);
  void countUseLocked(int32_t i);
  void notifySpaceLocked();
  bool writeDueLocked(const Slot& s, Nanos now) const;

  const HostTierOptions options_;
  std::unique_ptr<PinnedArena> arena_;
  const uint64_t slot_bytes_;
  const uint64_t max_dirty_;
  TierCounters* counters_;
  TierListener* listener_;
  const Clock* clock_;

  mutable std::mutex mu_;
  std::condition_variable space_cv_;
  std::condition_variable written_cv_;
  std::vector<Slot> slots_;
  absl::flat_hash_map<BlockKey, int32_t> index_;
  SlotList lru_;    // resident blocks, most recent first
  SlotList dirty_;  // blocks waiting for a disk write, oldest first
  std::vector<int32_t> free_;
  size_t evictable_ = 0;
  size_t writing_ = 0;
  bool flushing_ = false;
};

}  // namespace kvf::worker
