// Vocabulary shared by the KV tiers below the engine's pool: the host-memory tier (G2,
// host_tier.h), the disk tier (G3, disk_tier.h) and the chain that connects them
// (tiered_store.h). Blocks are identified by a 64-bit key (the engine's block hash value); every
// block has the same payload size within one chain. Counters are atomics, safe from any thread;
// a TierListener is called from the tiers' own threads (see its contract).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace kvf::worker {

// The engine's block hash as a plain value: tiers never interpret it.
using BlockKey = uint64_t;

enum class TierId : uint8_t { kHost, kDisk };
inline constexpr size_t kTierCount = 2;

// vLLM's KV-event `medium` for a tier: "CPU" (host memory) or "DISK".
std::string_view tierMedium(TierId tier);

// Why a block left the tiers for good. Every drop is one of these; nothing leaves silently.
enum class DropReason : uint8_t {
  kCapacity,         // LRU eviction from the lowest configured tier
  kFrequencyFilter,  // left host memory unwritten: seen fewer than offload_min_hits times
  kCorrupt,          // its checksum did not match on a read: dropped, never served
  kWriteFailed,      // the disk refused its write max_write_attempts times
  kRemoved,          // the owner removed it (remove())
  kLostBeforeWrite,  // decouple_eviction only: evicted from host memory before its disk write
};
inline constexpr size_t kDropReasonCount = 6;
std::string_view dropReasonName(DropReason reason);

// Monotonic counters of one chain, updated by both tiers. Relaxed atomics: readers see each
// value exactly but not a consistent cut across values.
struct TierCounters {
  std::array<std::atomic<uint64_t>, kDropReasonCount> dropped{};
  std::atomic<uint64_t> host_stored{0};         // blocks that entered host memory
  std::atomic<uint64_t> host_moved_down{0};     // left host memory, durable on disk
  std::atomic<uint64_t> host_backpressure{0};   // stores refused: no slot could be freed
  std::atomic<uint64_t> host_onboarded{0};      // blocks served from host memory
  std::atomic<uint64_t> disk_written{0};        // blocks made durable on disk
  std::atomic<uint64_t> disk_write_errors{0};   // writes the file system refused or cut short
  std::atomic<uint64_t> disk_onboarded{0};      // blocks served from disk
  std::atomic<uint64_t> disk_promoted{0};       // blocks read from disk into host memory
  std::atomic<uint64_t> disk_read_errors{0};    // reads that failed (I/O error, short read)
  std::atomic<uint64_t> disk_grow_failures{0};  // a slab file could not be allocated (full disk)
  std::atomic<uint64_t> disk_bytes_written{0};
  std::atomic<uint64_t> disk_bytes_read{0};

  void drop(DropReason reason, uint64_t n = 1) {
    dropped[static_cast<size_t>(reason)].fetch_add(n, std::memory_order_relaxed);
  }
  uint64_t droppedBy(DropReason reason) const {
    return dropped[static_cast<size_t>(reason)].load(std::memory_order_relaxed);
  }
};

inline void bump(std::atomic<uint64_t>& counter, uint64_t n = 1) {
  counter.fetch_add(n, std::memory_order_relaxed);
}

// Told when blocks enter or leave a tier, so the worker can publish BlockStored / BlockRemoved
// with the tier's medium. Called from whichever tier thread made the change (a caller's thread,
// the disk's I/O thread), never under a tier lock, in the order of the changes per tier. An
// implementation must be thread-safe, must not block, and must not call back into the tiers.
class TierListener {
 public:
  virtual ~TierListener() = default;
  virtual void onStored(TierId tier, std::span<const BlockKey> keys) = 0;
  virtual void onRemoved(TierId tier, std::span<const BlockKey> keys) = 0;
  // Every block of `tier` is gone (the disk tier cleared itself at start).
  virtual void onCleared(TierId tier) = 0;
};

}  // namespace kvf::worker
