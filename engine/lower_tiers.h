// The KV tiers below the engine's pool (G2 host memory, G3 local disk), as the engine core sees
// them: the pool offloads the cached blocks it evicts, admission looks up the prefix beyond its
// G1 hit and onboards those blocks into pool blocks. Two implementations follow the same rules
// (lossless: a block leaves only into the next tier or by a counted policy; byte budgets; LRU):
// the live engine's, on worker::TieredStore with the pool's real payload bytes
// (engine/live_tiers.h), and the simulator's capacity/LRU accounting (engine/accounted_tiers.h).
// What the modelled clock charges for onboarding comes from the timing model, not from here.
// Owned by the EngineCore and called on its thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "worker/kv_events.h"
#include "worker/tiers/tier_types.h"

namespace kvf::engine {

// One onboard in progress: the blocks land in order, each ready on its own.
class TierOnboard {
 public:
  virtual ~TierOnboard() = default;
  // True once no block is pending (each is ready or failed); the destinations are the caller's
  // again.
  virtual bool done() const = 0;
  // The leading blocks that are ready (checked: a block that failed its checksum never counts).
  virtual size_t readyPrefix() const = 0;
};

// Blocks per tier of the leading run lookup() found, in that order (host blocks are not
// necessarily first: each block's own tier).
struct TierRun {
  std::vector<worker::TierId> tiers;
  size_t host = 0;
  size_t disk = 0;
  size_t size() const { return tiers.size(); }
};

// What promote() did with one block.
enum class PromoteOutcome : uint8_t {
  kStarted,    // the disk -> host read is under way (or, in the accounting, done)
  kInHost,     // host memory holds the block already (or is filling it)
  kNotOnDisk,  // nothing to promote
  kNoRoom,     // no host slot can be freed without losing a block
};

// Host memory's room for promotions, in slots: all of them, and those free or cleanly evictable.
struct HostRoom {
  size_t capacity = 0;
  size_t available = 0;
};

class LowerTiers {
 public:
  virtual ~LowerTiers() = default;
  // The pool evicted these cached blocks; payloads[i] is hashes[i]'s bytes (empty when the pool
  // holds none), valid during the call only. Every block is kept or counted as dropped by a
  // stated policy: with the tiers full of blocks still waiting for the disk, this waits for room
  // (backpressure) instead of losing one.
  virtual void offload(std::span<const worker::BlockHash> hashes,
                       std::span<const std::span<const std::byte>> payloads) = 0;
  // The tier of each block of the leading run of `hashes` held below the pool.
  virtual TierRun lookup(std::span<const worker::BlockHash> hashes) = 0;
  // Starts copying `hashes` into `destinations` (one per hash, block bytes each, or empty spans
  // when the pool holds no payload). The destinations must stay untouched until done().
  virtual std::unique_ptr<TierOnboard> onboard(
      std::span<const worker::BlockHash> hashes,
      std::span<const std::span<std::byte>> destinations) = 0;
  // Starts a disk -> host promotion of `hash` (on disk only): once in, the block is a clean host
  // block (its disk copy kept), and an onboard reads it from host memory. A promotion never
  // evicts a host block that has no copy below.
  virtual PromoteOutcome promote(worker::BlockHash hash) = 0;
  // Promotion reads started and not finished (0 where a promotion takes no real time).
  virtual size_t promotionsInFlight() const { return 0; }
  virtual HostRoom hostRoom() const = 0;
  // Makes the blocks of `hashes` held in host memory the most recently used (a waiting request's
  // prefix, so that offloads do not evict it before its admission).
  virtual void touch(std::span<const worker::BlockHash> hashes) = 0;
  // Retires the tiers' completed asynchronous work (device copies); never blocks. The engine
  // calls it once per step.
  virtual void poll() {}
  // The KV events of the tiers since the last call (BlockStored / BlockRemoved with medium
  // "CPU" or "DISK", as vLLM's OffloadingConnector writes them), in the order they happened.
  virtual std::vector<worker::KvEvent> takeEvents() = 0;
};

// The store's keys of engine block hashes (the same 64-bit values).
inline std::vector<worker::BlockKey> keysOf(std::span<const worker::BlockHash> hashes) {
  std::vector<worker::BlockKey> keys;
  keys.reserve(hashes.size());
  for (worker::BlockHash h : hashes) keys.push_back(h.value());
  return keys;
}

// Puts the tiers' events since the last call in front of a step's events, the order the live
// engine and the simulator publish in: a block the step evicted enters CPU before it leaves GPU,
// so a router that knows the block by its GPU entry (vLLM's tier events carry no tokens) can
// place the host copy on the prompt's chain before the GPU removal drops that entry.
inline void putTierEventsFirst(LowerTiers& tiers, std::vector<worker::KvEvent>& events) {
  std::vector<worker::KvEvent> below = tiers.takeEvents();
  if (below.empty()) return;
  below.insert(below.end(), std::make_move_iterator(events.begin()),
               std::make_move_iterator(events.end()));
  events = std::move(below);
}

}  // namespace kvf::engine
