// The blocks an instance holds in tiers other than its GPU prefix cache ("CPU", "DISK",
// "STORAGE", ... as KV events name them in `medium`), by engine hash with a count of copies, and
// by our chained hash where it is known, so a request's leading run can continue from its GPU
// hits into host memory and disk (run()). Tier events may carry hashes only (vLLM's
// OffloadingConnector, LMCache): the owner resolves our hash from the GPU index (the block was
// offloaded from there, and the engine hash is the same in both), from another tier, or from
// the event's tokens (RoutingCore::storeTierBlocks); blocks it cannot resolve are kept and
// shown, never credited. Only "CPU" and "DISK" are credited (other media are remote or of
// unknown speed). Bounded: a few tier names, a capacity per tier. Pure; single-threaded (the
// routing core's owner).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/flat_u64_map.h"
#include "policy/block_hash.h"

namespace kvf::policy {

// The leading run past a GPU match, in blocks: those in host memory, and those only on disk.
struct LowerTierRun {
  size_t cpu_blocks = 0;
  size_t disk_blocks = 0;
};

class TierHoldings {
 public:
  static constexpr size_t kMaxTiers = 8;

  // Adds one copy of each hash to `medium`; ours[i] is block i's chained hash (value 0, or
  // `ours` shorter than the hashes: unknown, kept uncredited). False (nothing past the bound is
  // kept) when the tier would exceed `capacity` distinct blocks (0: unbounded) or a new tier
  // name would exceed kMaxTiers.
  bool store(std::string_view medium, std::span<const uint64_t> engine_hashes,
             std::span<const BlockHash> ours, size_t capacity);
  // Drops one copy of each; returns how many hashes it did not hold.
  size_t remove(std::string_view medium, std::span<const uint64_t> engine_hashes);
  void clear();

  size_t blocks(std::string_view medium) const;
  bool holds(std::string_view medium, uint64_t engine_hash) const;
  // Our hash of an engine hash held in any tier, if known.
  std::optional<BlockHash> ourHash(uint64_t engine_hash) const;
  // Whether run() can find anything: some CPU or DISK block with our hash known.
  bool creditable() const { return credited_ours_ > 0; }
  // The run of `chain` from block `from` on that the credited tiers hold, block by block (a
  // block in host memory counts there, else on disk); stops at the first block neither holds.
  LowerTierRun run(std::span<const BlockHash> chain, size_t from) const;
  // (medium, distinct blocks) for every tier seen, in first-seen order.
  std::vector<std::pair<std::string, size_t>> summary() const;
  // Blocks stored whose our hash was unknown (kept, not credited), since the last clear.
  uint64_t unresolved() const { return unresolved_; }

 private:
  enum class Kind { kCpu, kDisk, kOther };
  struct Held {
    uint64_t ours = 0;  // 0: unknown
    uint32_t copies = 0;
  };
  struct Tier {
    std::string medium;
    Kind kind = Kind::kOther;
    FlatU64Map<Held> blocks;    // by engine hash
    FlatU64Map<uint32_t> ours;  // our hash -> engine hashes mapping to it
  };
  Tier* find(std::string_view medium);
  const Tier* find(std::string_view medium) const;
  void dropOurs(Tier& tier, uint64_t ours);

  std::vector<Tier> tiers_;
  const Tier* cpu_ = nullptr;  // the credited tiers, when seen (pointers into tiers_, reserved)
  const Tier* disk_ = nullptr;
  size_t credited_ours_ = 0;  // our hashes in the credited tiers
  uint64_t unresolved_ = 0;
};

}  // namespace kvf::policy
