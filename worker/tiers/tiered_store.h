// The chain below an engine's KV pool (G1): host memory (G2) and, optionally, local disk (G3).
// The engine offloads a block it evicts (offload), asks which of a request's blocks the tiers
// hold (lookup), and onboards them back into its own memory (onboard), waiting only for its own
// blocks, each with its own ready state. An offloader thread hands dirty host blocks to the disk
// under the write policy; a block leaves host memory only once durable on disk or dropped by a
// counted policy, so the disk falling behind turns into backpressure on offload, never loss.
//
// Threads: every public method is thread-safe. Onboard callbacks and the TierListener run on the
// store's own threads (onboard copy threads, the disk's I/O thread) and must not block.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/metrics.h"
#include "worker/tiers/disk_tier.h"
#include "worker/tiers/host_tier.h"
#include "worker/tiers/tier_types.h"

namespace boost::asio {
class thread_pool;
}

namespace kvf::worker {

// Disk -> host promotion of the prefix of a request waiting in the engine's queue (docs/tiers.md,
// "Prefetch while queued"). The store only promotes (TieredStore::promote); the engine decides
// what, within these bounds.
enum class PrefetchMode : uint8_t {
  kAdmission,  // a request's blocks are read only once it is admitted (disk blocks from disk)
  kQueued,     // its disk-only blocks are promoted into host memory while it waits
};
struct TierPrefetchOptions {
  PrefetchMode mode = PrefetchMode::kQueued;
  // Promoted blocks that no admitted request has used yet, as a share of the host tier's slots.
  double budget_fraction = 0.25;
  // Host slots a promotion leaves free or cleanly evictable (for the pool's offloads), as a
  // share of the host tier's slots: below it nothing is promoted.
  double margin_fraction = 0.1;
  uint32_t max_reads_in_flight = 64;  // promotion reads in flight (blocks)
};

struct TieredStoreOptions {
  HostTierOptions host;  // has_lower_tier is set from `disk`
  std::optional<DiskTierOptions> disk;
  uint32_t onboard_threads = 2;  // host-memory copies back into the engine's memory
  // Check each host-memory read against the block's checksum (a second pass over the bytes);
  // disk reads are always checked.
  bool verify_host_reads = false;
  TierPrefetchOptions prefetch;  // the engine's; the store itself takes no part in the policy
};

enum class OnboardState : uint8_t { kPending, kReady, kMissing, kCorrupt, kFailed };

// The per-block outcome of one onboard() call, shared by the caller and the store's threads.
class OnboardTicket {
 public:
  // Runs once per block as it finishes (on a store thread); optional.
  using BlockCallback = std::function<void(size_t index, OnboardState state)>;

  OnboardTicket(size_t blocks, BlockCallback on_block);

  size_t size() const { return states_.size(); }
  OnboardState state(size_t i) const { return states_[i].load(std::memory_order_acquire); }
  // Where block i came from (meaningful once it is kReady).
  TierId source(size_t i) const { return sources_[i]; }
  // The leading blocks that are ready: the scheduler may run the chunk they cover.
  size_t readyPrefix() const;
  bool done() const;
  // Waits until block i (or every block) is no longer pending; false on timeout.
  bool wait(size_t i, std::chrono::nanoseconds timeout) const;
  bool waitAll(std::chrono::nanoseconds timeout) const;

 private:
  friend class TieredStore;
  void finish(size_t i, OnboardState state, TierId source);

  std::vector<std::atomic<OnboardState>> states_;
  std::vector<TierId> sources_;
  BlockCallback on_block_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  size_t pending_;
};

// A consistent-enough view of the chain for tests, benchmarks and /metrics.
struct TierStats {
  std::array<uint64_t, kDropReasonCount> dropped{};
  uint64_t host_stored = 0;
  uint64_t host_moved_down = 0;
  uint64_t host_backpressure = 0;
  uint64_t host_onboarded = 0;
  uint64_t disk_written = 0;
  uint64_t disk_write_errors = 0;
  uint64_t disk_onboarded = 0;
  uint64_t disk_promoted = 0;
  uint64_t disk_read_errors = 0;
  uint64_t disk_grow_failures = 0;
  uint64_t disk_bytes_written = 0;
  uint64_t disk_bytes_read = 0;
  HostTier::Usage host;
  size_t disk_blocks = 0;
  size_t disk_capacity_blocks = 0;
  size_t disk_allocated_blocks = 0;
  size_t disk_queued_writes = 0;

  uint64_t droppedBy(DropReason r) const { return dropped[static_cast<size_t>(r)]; }
};

class TieredStore {
 public:
  static absl::StatusOr<std::unique_ptr<TieredStore>> create(TieredStoreOptions options,
                                                             TierListener* listener = nullptr);
  // Stops the offloader and the copy threads; disk writes not yet submitted are abandoned (their
  // blocks were only in host memory, which goes away with the store). flush() first to keep them.
  ~TieredStore();
  TieredStore(const TieredStore&) = delete;
  TieredStore& operator=(const TieredStore&) = delete;

  // G1 -> G2: copies `bytes` (block_bytes) into host memory with its checksum. OK when stored or
  // already held. Unavailable: backpressure (every host block waits for the disk or is in use);
  // nothing was stored and the caller still owns the only copy.
  absl::Status offload(BlockKey key, std::span<const std::byte> bytes);
  // offload() with the caller's copy: `fill` writes the block into its reserved host slot
  // (block_bytes of page-locked memory, CUDA-pinned when a device is present: the target of a
  // device-to-host cudaMemcpy) and returns OK, or an error that abandons the slot and is
  // returned. Runs on the caller's thread, without a tier lock held.
  absl::Status offloadInto(BlockKey key,
                           absl::FunctionRef<absl::Status(std::span<std::byte>)> fill);
  // offloadInto() in two steps, for a fill that completes later (an asynchronous device copy):
  // beginOffload reserves `key`'s host slot (AlreadyExists: held already, nothing to copy;
  // Unavailable: backpressure, as offload()); endOffload makes it visible once the bytes are in
  // (`filled`), or abandons it. Every reservation must be ended exactly once.
  absl::StatusOr<HostTier::Reservation> beginOffload(BlockKey key);
  void endOffload(const HostTier::Reservation& reservation, bool filled);
  // offload(), waiting up to `timeout` for room instead of failing at once: the engine's eviction
  // waits for the disk rather than losing the block.
  absl::Status offloadWait(BlockKey key, std::span<const std::byte> bytes,
                           std::chrono::nanoseconds timeout);

  // The tier of each block in the leading run of `keys` held below G1 (host memory first).
  std::vector<TierId> lookup(std::span<const BlockKey> keys) const;
  // Reads each key into its destination (block_bytes each; valid until the block is no longer
  // pending), from host memory or disk. A key in neither ends kMissing at once. Blocks being read
  // are pinned: an eviction or removal meanwhile never frees them under the copy.
  std::shared_ptr<OnboardTicket> onboard(std::span<const BlockKey> keys,
                                         std::span<const std::span<std::byte>> destinations,
                                         OnboardTicket::BlockCallback on_block = {});
  // G3 -> G2: reads `key` from disk into a host slot (its checksum checked: a corrupt copy is
  // dropped, never stored) and makes it a clean host block; the disk copy stays. OK: the read
  // started, and `done` (optional) runs on the disk's I/O thread with whether the block was
  // stored. AlreadyExists: host memory holds the key or is filling it; NotFound: not on disk;
  // Unavailable: no host slot can be freed (only clean blocks are ever evicted for it).
  absl::Status promote(BlockKey key, std::function<void(bool stored)> done = {});
  // Counts a use of blocks the engine hit in its own pool (frequency filter, LRU).
  void touch(std::span<const BlockKey> keys);
  // Drops `key` from every tier (DropReason::kRemoved); false when no tier held it.
  bool remove(BlockKey key);
  // Writes every dirty host block to disk (write-back included) and waits; false on timeout.
  bool flush(std::chrono::nanoseconds timeout);

  // Counts blocks a caller onboarded itself from pinned host slots (a device copier's DMA), so
  // the host tier's onboard counter means the same with or without one.
  void countHostOnboards(uint64_t blocks) { bump(counters_.host_onboarded, blocks); }

  TierStats stats() const;
  uint64_t blockBytes() const { return host_->blockBytes(); }
  PinKind hostPinKind() const { return host_->pinKind(); }
  HostTier& host() { return *host_; }
  DiskTier* disk() { return disk_.get(); }
  const TierCounters& counters() const { return counters_; }

 private:
  explicit TieredStore(TieredStoreOptions options);
  void runOffloader();
  void pokeOffloader();
  bool handWrites();
  void copyFromHost(const std::shared_ptr<OnboardTicket>& ticket, size_t i, HostTier::Pin pin,
                    std::span<std::byte> dst);
  void readFromDisk(const std::shared_ptr<OnboardTicket>& ticket, size_t i, BlockKey key,
                    std::span<std::byte> dst);

  const TieredStoreOptions options_;
  SteadyClock clock_;
  TierCounters counters_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<DiskTier> disk_;
  std::unique_ptr<boost::asio::thread_pool> copiers_;

  std::mutex offload_mu_;
  std::condition_variable offload_cv_;
  bool poked_ = false;
  bool stop_ = false;
  std::thread offloader_;
};

// Prometheus export of the store's counters and occupancy (kvfabric_tier_*), read at scrape time.
// The store must outlive every scrape of `registry`.
void exportMetrics(const TieredStore& store, metrics::Registry& registry,
                   const metrics::Labels& labels = {});

}  // namespace kvf::worker
