// Queued-time prefetch (tiers.prefetch.mode: queued): when a request enters the waiting queue
// behind others, the blocks of its prefix past the G1 hit that sit only on disk start a disk ->
// host promotion, and those already in host memory are made the most recent, so that at
// admission they onboard from host memory (PCIe) instead of disk. The modelled clock is kept
// here, for the live engine and the simulator alike: promotions share one disk read channel at
// the profile's read bandwidth, and a block counts as in host memory at admission only once its
// modelled promotion is done (else it is charged as a disk block, as without prefetch).
// Bounded: promoted blocks not yet used by an admitted request (budget_fraction of the host
// slots), reads in flight (the rest wait in order and start as reads finish, at the next
// onQueued or pump), and host slots left free or cleanly evictable (margin_fraction).
// Owned by the Scheduler; its thread only.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/lower_tiers.h"
#include "engine/timing_model.h"
#include "worker/tiers/tiered_store.h"

namespace kvf::engine {

using worker::BlockHash;

// Why a disk block of a queued request was not promoted.
enum class PrefetchSkip : uint8_t {
  kBudget,    // promoted blocks awaiting use fill the budget
  kHostFull,  // host memory keeps its margin: no free or cleanly evictable slot to spare
};
inline constexpr size_t kPrefetchSkipCount = 2;
const char* prefetchSkipName(PrefetchSkip reason);

struct PrefetchStats {
  uint64_t promoted = 0;  // disk blocks whose promotion started
  uint64_t used = 0;      // onboarded from host memory at admission after their promotion
  uint64_t late = 0;      // met at admission before their promotion was done: read from disk
  // Promotions no admitted request used (late, evicted or removed before use, or no longer
  // needed); each stays a clean cached host block while the LRU keeps it.
  uint64_t wasted = 0;
  uint64_t touched = 0;  // host blocks made most recent for a waiting request
  std::array<uint64_t, kPrefetchSkipCount> skipped{};
  uint64_t skippedBy(PrefetchSkip r) const { return skipped[static_cast<size_t>(r)]; }
};

class QueuedPrefetch {
 public:
  // `tiers` and `timing` must outlive this.
  QueuedPrefetch(const worker::TierPrefetchOptions& options, LowerTiers* tiers,
                 const TimingModel* timing, int64_t block_size);

  // A request entered the queue at `now`; `past_g1` is its prefix past the pool's hit. The
  // blocks it now waits on are appended to `held` (release() gives them back).
  void onQueued(std::span<const BlockHash> past_g1, Nanos now, std::vector<BlockHash>* held);
  // Admission at `now` found `run` below the pool for `hashes` (its leading run): a host block
  // whose modelled promotion is not done yet becomes a disk block in `run`.
  void adjustRun(std::span<const BlockHash> hashes, TierRun& run, Nanos now) const;
  // Starts waiting promotions while reads in flight stay under the bound (every step).
  void pump(Nanos now);
  // An onboard of `hashes` from `tiers` (adjustRun's) started: counts promotions used and late.
  void onOnboard(std::span<const BlockHash> hashes, std::span<const worker::TierId> tiers);
  // The request left the queue (admitted or aborted): its blocks no longer count against the
  // budget, and those no request used are counted as wasted.
  void release(std::vector<BlockHash>* held);

  const PrefetchStats& stats() const { return stats_; }
  size_t awaitingUse() const { return entries_.size(); }

 private:
  struct Entry {
    Nanos ready_at = 0;  // when the modelled promotion is done (once started)
    uint32_t refs = 0;   // waiting requests that hold it
    bool started = false;
    bool used = false;
  };
  // Skips the rest of a run's disk blocks from index `from` on.
  void skipRest(const TierRun& run, size_t from, PrefetchSkip reason);

  worker::TierPrefetchOptions options_;
  LowerTiers* tiers_;
  Nanos block_read_;               // modelled disk read of one block
  Nanos disk_free_at_ = 0;         // the modelled read channel's next free moment
  std::deque<Nanos> reads_;        // modelled ends of the reads issued, oldest first
  std::deque<BlockHash> waiting_;  // promotions not started yet, in order (entries may be gone)
  absl::flat_hash_map<uint64_t, Entry> entries_;
  std::vector<BlockHash> touch_;  // scratch
  PrefetchStats stats_;
};

}  // namespace kvf::engine
