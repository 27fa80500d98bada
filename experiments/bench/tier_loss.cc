// kvf-tier-bench --mode=loss: the seed's failure on a real block stream. A window of a Mooncake
// trace runs twice through an engine pool (G1, LRU, fixed size) whose evictions are offloaded
// into the host tier (G2, turning over ~11 times) and on to disk (G3, room for every block).
// Pass 1 computes what no tier holds; pass 2 (the seed's warm run) counts where each block is
// found and checks every onboarded block byte for byte. The default arm is lossless; the lossy
// arm decouples host eviction from the disk write, as Dynamo KVBM did.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <unordered_set>

#include "absl/container/flat_hash_map.h"
#include "experiments/bench/tier_bench.h"
#include "trace/reader.h"
#include "worker/block_payload.h"
#include "worker/tiers/disk_format.h"
#include "worker/tiers/slot_list.h"
#include "worker/tiers/tiered_store.h"

namespace kvf::bench {
namespace {

namespace kw = kvf::worker;
using Clock = std::chrono::steady_clock;

struct PassCounts {
  uint64_t lookups = 0;
  uint64_t g1 = 0;
  uint64_t g2 = 0;
  uint64_t g3 = 0;
  uint64_t computed = 0;
  uint64_t mismatches = 0;  // onboarded bytes that were not the block's
  uint64_t offload_failures = 0;
};

// The engine's pool: an LRU of fixed size. The blocks of the chunk being assembled are never
// evicted; every eviction is offloaded to the tiers, waiting for room as an engine would.
class EnginePool {
 public:
  EnginePool(uint64_t blocks, uint64_t block_bytes, kw::TieredStore* store)
      : block_bytes_(block_bytes),
        stride_(kw::roundUpToSector(block_bytes)),
        memory_(blocks * stride_),
        keys_(blocks),
        marks_(blocks, 0),
        lru_(blocks),
        store_(store) {
    for (size_t i = blocks; i > 0; --i) free_.push_back(static_cast<int32_t>(i - 1));
  }

  void beginChunk() { ++mark_; }
  bool use(kw::BlockKey key) {
    auto it = index_.find(key);
    if (it == index_.end()) return false;
    lru_.moveToFront(it->second);
    marks_[it->second] = mark_;
    return true;
  }
  // A slot for `key` (not held), evicting the least recent block of an earlier request.
  std::span<std::byte> admit(kw::BlockKey key, PassCounts* counts) {
    int32_t slot;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else {
      slot = lru_.back();
      while (marks_[slot] == mark_) slot = lru_.prev(slot);  // chunks are below the pool size
      absl::Status s = store_->offloadWait(keys_[slot], bytes(slot), std::chrono::minutes(5));
      if (!s.ok()) ++counts->offload_failures;
      index_.erase(keys_[slot]);
      lru_.remove(slot);
    }
    keys_[slot] = key;
    marks_[slot] = mark_;
    index_.emplace(key, slot);
    lru_.pushFront(slot);
    return bytes(slot);
  }
  bool holds(kw::BlockKey key) const { return index_.contains(key); }

 private:
  std::span<std::byte> bytes(int32_t slot) {
    return memory_.slice(static_cast<uint64_t>(slot) * stride_, block_bytes_);
  }

  uint64_t block_bytes_;
  uint64_t stride_;
  AlignedBuffer memory_;
  std::vector<kw::BlockKey> keys_;
  std::vector<uint64_t> marks_;
  uint64_t mark_ = 0;
  kw::SlotList lru_;
  std::vector<int32_t> free_;
  absl::flat_hash_map<kw::BlockKey, int32_t> index_;
  kw::TieredStore* store_;
};

// Charges the modelled prefill time of each computed block: the producer's pace. Sleeps in
// steps of at least a millisecond, so the pace holds on average.
class PrefillClock {
 public:
  explicit PrefillClock(Nanos per_block) : per_block_(per_block) {}
  void charge() {
    if (per_block_ <= 0) return;
    debt_ += per_block_;
    if (debt_ < kNanosPerMilli) return;
    auto t0 = Clock::now();
    std::this_thread::sleep_for(std::chrono::nanoseconds(debt_));
    debt_ -= std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  }

 private:
  Nanos per_block_;
  Nanos debt_ = 0;
};

// One pass over the window: every block of every request is made present in the pool, from the
// pool itself, the tiers (onboarded and checked) or computed.
PassCounts runPass(const std::vector<trace::Request>& requests, EnginePool& pool,
                   kw::TieredStore& store, size_t chunk_blocks, Nanos compute_per_block) {
  PassCounts c;
  PrefillClock prefill(compute_per_block);
  std::vector<kw::BlockKey> keys;
  std::vector<std::span<std::byte>> into;
  // Onboards the chunk's blocks the tiers hold into their pool slots and checks them.
  auto onboardChunk = [&] {
    if (keys.empty()) return;
    auto ticket = store.onboard(keys, into);
    ticket->waitAll(std::chrono::minutes(5));
    for (size_t i = 0; i < keys.size(); ++i) {
      if (ticket->state(i) != kw::OnboardState::kReady) {  // gone meanwhile: recompute
        kw::fillBlockPayload(kw::BlockHash{keys[i]}, into[i]);
        ++c.computed;
        continue;
      }
      if (!kw::verifyBlockPayload(kw::BlockHash{keys[i]}, into[i])) ++c.mismatches;
      ++(ticket->source(i) == kw::TierId::kHost ? c.g2 : c.g3);
    }
    keys.clear();
    into.clear();
  };
  for (const trace::Request& r : requests) {
    // A chunk's blocks stay in the pool until its onboard is done (chunked prefill).
    for (size_t start = 0; start < r.hash_ids.size(); start += chunk_blocks) {
      pool.beginChunk();
      size_t end = std::min(r.hash_ids.size(), start + chunk_blocks);
      for (size_t b = start; b < end; ++b) {
        kw::BlockKey key = r.hash_ids[b];
        ++c.lookups;
        if (pool.use(key)) {
          ++c.g1;
          continue;
        }
        std::span<std::byte> slot = pool.admit(key, &c);
        if (!store.lookup({&key, 1}).empty()) {
          keys.push_back(key);
          into.push_back(slot);
        } else {
          kw::fillBlockPayload(kw::BlockHash{key}, slot);  // prefill computes it
          ++c.computed;
          prefill.charge();
        }
      }
      onboardChunk();
    }
  }
  return c;
}

std::vector<trace::Request> readWindow(const std::string& path, uint64_t unique_blocks,
                                       uint64_t* unique_out) {
  auto all = trace::readAll(path);
  if (!all.ok()) {
    std::fprintf(stderr, "%s: %s\n", path.c_str(), std::string(all.status().message()).c_str());
    std::exit(1);
  }
  std::unordered_set<trace::HashId> seen;
  std::vector<trace::Request> window;
  for (trace::Request& r : *all) {
    if (seen.size() >= unique_blocks) break;
    for (trace::HashId id : r.hash_ids) seen.insert(id);
    window.push_back(std::move(r));
  }
  *unique_out = seen.size();
  return window;
}

}  // namespace

int runLossExperiment(const LossOptions& o) {
  uint64_t unique = 0;
  std::vector<trace::Request> window = readWindow(o.trace, o.unique_blocks, &unique);
  uint64_t disk_blocks = o.disk_blocks > 0 ? o.disk_blocks : unique + unique / 20;
  uint64_t refs = 0;
  for (const auto& r : window) refs += r.hash_ids.size();
  std::printf(
      "loss experiment: %zu requests, %llu block references, %llu distinct blocks of %llu KiB; "
      "G1 %llu, G2 %llu (distinct blocks / G2 = %.1f), disk %llu blocks; %u disk I/Os in "
      "flight; prefill %.0f us per computed block\n",
      window.size(), static_cast<unsigned long long>(refs), static_cast<unsigned long long>(unique),
      static_cast<unsigned long long>(o.block_bytes >> 10),
      static_cast<unsigned long long>(o.g1_blocks), static_cast<unsigned long long>(o.g2_blocks),
      static_cast<double>(unique) / static_cast<double>(o.g2_blocks),
      static_cast<unsigned long long>(disk_blocks), o.queue_depth,
      static_cast<double>(o.compute_per_block) / 1e3);
  std::printf(
      "| arm | host stores | host stores / G2 | lost (counted) | lost (observed) | pass 2: G1 / G2 "
      "/ "
      "disk / recomputed | disk hit ratio | byte mismatches | offloads refused for room | "
      "wall s |\n|---|---|---|---|---|---|---|---|---|---|\n");
  int rc = 0;
  for (const std::string& arm : o.arms) {
    std::filesystem::remove_all(o.dir);
    kw::TieredStoreOptions so;
    so.host.block_bytes = o.block_bytes;
    so.host.capacity_bytes = o.g2_blocks * kw::roundUpToSector(o.block_bytes);
    so.host.decouple_eviction = arm == "lossy";
    kw::DiskTierOptions d;
    d.dir = o.dir;
    d.capacity_bytes = disk_blocks * kw::diskSlotBytes(o.block_bytes);
    d.queue_depth = o.queue_depth;
    d.max_queued_writes = o.queue_depth;
    d.on_start = kw::DiskStart::kClear;
    so.disk = d;
    auto store = kw::TieredStore::create(so);
    if (!store.ok()) {
      std::fprintf(stderr, "tiers: %s\n", std::string(store.status().message()).c_str());
      return 1;
    }
    auto t0 = Clock::now();
    size_t chunk = std::max<size_t>(1, o.g1_blocks / 2);
    EnginePool pool(o.g1_blocks, o.block_bytes, store->get());
    PassCounts first = runPass(window, pool, **store, chunk, o.compute_per_block);
    (*store)->flush(std::chrono::minutes(10));
    uint64_t lost_observed = 0;
    std::unordered_set<trace::HashId> checked;
    for (const auto& r : window) {
      for (trace::HashId id : r.hash_ids) {
        kw::BlockKey key = id;
        if (!checked.insert(id).second || pool.holds(id)) continue;
        if ((*store)->lookup({&key, 1}).empty()) ++lost_observed;
      }
    }
    kw::TierStats after_first = (*store)->stats();
    PassCounts second = runPass(window, pool, **store, chunk, o.compute_per_block);
    double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    kw::TierStats st = (*store)->stats();
    double below = static_cast<double>(second.g3 + second.computed);
    std::printf(
        "| %s | %llu | %.1fx | %llu | %llu | %llu / %llu / %llu / %llu | %.1f%% | %llu | %llu | "
        "%.1f |\n",
        arm.c_str(), static_cast<unsigned long long>(after_first.host_stored),
        static_cast<double>(after_first.host_stored) / static_cast<double>(o.g2_blocks),
        static_cast<unsigned long long>(after_first.droppedBy(kw::DropReason::kLostBeforeWrite)),
        static_cast<unsigned long long>(lost_observed), static_cast<unsigned long long>(second.g1),
        static_cast<unsigned long long>(second.g2), static_cast<unsigned long long>(second.g3),
        static_cast<unsigned long long>(second.computed),
        below > 0 ? 100.0 * static_cast<double>(second.g3) / below : 100.0,
        static_cast<unsigned long long>(first.mismatches + second.mismatches),
        static_cast<unsigned long long>(st.host_backpressure), wall);
    if (first.mismatches + second.mismatches > 0 || first.offload_failures > 0 ||
        second.offload_failures > 0) {
      rc = 1;
    }
    uint64_t other_drops = 0;
    for (size_t i = 0; i < kw::kDropReasonCount; ++i) {
      if (static_cast<kw::DropReason>(i) != kw::DropReason::kLostBeforeWrite) {
        other_drops += st.dropped[i];
      }
    }
    if (other_drops > 0) {
      std::printf("  (%s: %llu blocks dropped by a stated policy)\n", arm.c_str(),
                  static_cast<unsigned long long>(other_drops));
    }
  }
  std::filesystem::remove_all(o.dir);
  return rc;
}

}  // namespace kvf::bench
