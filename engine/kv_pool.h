// Paged KV pool with prefix caching: fixed-size blocks with reference counts, a hash -> block
// map (the worker's BlockTable) for full computed blocks, and an LRU free queue in which freed
// blocks stay cached until they are reused (evicted). Every block owns payload bytes inside one
// contiguous allocation (registered once for RDMA later), written with content derived from the
// block's hash; that allocation is the pool's own host memory, or a PayloadMemory (device
// memory) the pool writes and checks through. Owned and used by the engine loop thread only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "common/prefetch.h"
#include "engine/lower_tiers.h"
#include "engine/payload_memory.h"
#include "worker/block_table.h"
#include "worker/kv_events.h"

namespace kvf::engine {

using worker::BlockHash;
using worker::BlockIndex;

struct KvPoolOptions {
  int block_size = 16;
  int64_t num_blocks = 0;
  size_t payload_bytes_per_block = 256;
  bool enable_prefix_caching = true;
};

class KvPool {
 public:
  // `sink` (may be null) receives BlockRemoved for evicted hashes; it must outlive the pool.
  // `memory` (may be null: the pool allocates host memory) holds the payloads instead; its
  // region must hold num_blocks * payload_bytes_per_block bytes.
  static absl::StatusOr<std::unique_ptr<KvPool>> create(
      KvPoolOptions options, worker::KvEventSink* sink,
      std::shared_ptr<PayloadMemory> memory = nullptr);
  ~KvPool();
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  // KV tiers below the pool (may be null, must outlive the pool): every cached block the pool
  // evicts is offloaded there, its payload still intact, before the block is reused.
  void setLowerTiers(LowerTiers* tiers) { tiers_ = tiers; }
  LowerTiers* lowerTiers() const { return tiers_; }

  int blockSize() const { return options_.block_size; }
  int64_t numBlocks() const { return static_cast<int64_t>(blocks_.size()); }
  // Blocks not referenced by any request (free or cached-and-evictable).
  int64_t numFreeBlocks() const { return num_free_; }
  // Fraction of blocks referenced by requests (vLLM's kv_cache_usage_perc, 0..1).
  double usage() const;
  bool prefixCachingEnabled() const { return options_.enable_prefix_caching; }

  // Blocks holding the longest run of leading `hashes` in the cache (no references taken).
  std::vector<BlockIndex> findCachedPrefix(std::span<const BlockHash> hashes) const {
    return findCachedPrefix(hashes, {});
  }
  // The same, given the blocks an earlier lookup of these hashes found: those still holding
  // their hash are taken by a check of the block (no hash-table probe), the rest looked up.
  std::vector<BlockIndex> findCachedPrefix(std::span<const BlockHash> hashes,
                                           std::span<const BlockIndex> hint) const;
  // Watching a lookup's result between steps (the scheduler's waiting head, which under
  // overload is looked up again every step): watchCachedPrefix replaces the watched blocks and
  // returns the watch's id; while watchIntact(id), none of them has lost its hash (eviction,
  // prefix cache reset), so a lookup of the same hashes finds them again and need only probe
  // past them.
  uint64_t watchCachedPrefix(std::span<const BlockIndex> blocks);
  bool watchIntact(uint64_t id) const { return id != 0 && id == watch_id_ && watch_intact_; }
  // Adds `blocks` (not yet watched) to the intact watch `id`.
  void extendWatch(uint64_t id, std::span<const BlockIndex> blocks);
  // Stops watching (the looked-up request was admitted or left the queue).
  void endWatch() { watch_intact_ = false; }
  // countUnreferenced of the intact watch's blocks, kept as references come and go.
  int64_t watchedUnreferenced() const { return watched_unref_; }
  // How many of `blocks` are unreferenced (touching them takes them off the free queue).
  int64_t countUnreferenced(std::span<const BlockIndex> blocks) const;
  // Takes a reference on each (cached) block.
  void acquire(std::span<const BlockIndex> blocks);
  // `n` fresh blocks with one reference each, evicting least recently freed cached blocks
  // (one BlockRemoved event per call listing every evicted hash); nullopt (and no change)
  // when fewer than n blocks are free.
  std::optional<std::vector<BlockIndex>> allocate(int64_t n);
  // The same, appending the blocks to `*blocks` (a request's block list: no vector per call);
  // false (and no change) when fewer than n blocks are free.
  bool allocateInto(int64_t n, std::vector<BlockIndex>* blocks);
  // Drops one reference from each block in order; blocks reaching zero join the free queue
  // (cached ones at the LRU tail, in this order; uncached ones at the head, reused first).
  void release(std::span<const BlockIndex> blocks);
  // Registers a full computed block under `hash` and writes its payload. False when caching is
  // off or the hash is already cached in another block (this one then stays uncached). Inline:
  // the scheduler calls it once per computed block.
  bool cacheBlock(BlockIndex block, BlockHash hash) {
    if (!options_.enable_prefix_caching) return false;
    if (hasHash(block)) return blocks_[block].hash == hash;
    if (!table_.insert(hash, block)) return false;
    blocks_[block].state |= kHasHash;
    blocks_[block].hash = hash;
    if (payload_ != nullptr) writePayload(block, hash);
    return true;
  }
  // Brings what cacheBlock(block, hash) touches towards the cache (a few calls ahead of it).
  void prefetchCacheBlock(BlockIndex block, BlockHash hash) const {
    prefetchLine(&blocks_[block]);
    table_.prefetch(hash);
  }
  std::optional<BlockHash> hashOf(BlockIndex block) const;
  int refCount(BlockIndex block) const { return static_cast<int>(refs(block)); }

  // Keeps a cached block from eviction (KV push source); NotFound if not cached.
  absl::Status pin(BlockHash hash);
  absl::Status unpin(BlockHash hash);

  // Drops every cached hash of unreferenced blocks (returns false if any block is in use).
  bool resetPrefixCache();

  // Every cached block's payload checked byte for byte against its hash (the emulator's
  // payload is a function of the hash): a write that reached a live block shows up here.
  struct PayloadAudit {
    int64_t cached_blocks = 0;
    int64_t corrupt_blocks = 0;
  };
  PayloadAudit auditPayloads() const;
  // True when `block` holds exactly `hash`'s payload (or the pool keeps no payload bytes).
  bool verifyPayload(BlockIndex block, BlockHash hash) const;
  // False when the payloads live in a PayloadMemory (device memory): payload() spans are then
  // addresses the host must not read or write.
  bool payloadOnHost() const { return memory_ == nullptr; }

  std::span<std::byte> payload(BlockIndex block);
  std::span<const std::byte> payload(BlockIndex block) const;
  // The whole payload region (for one memory registration).
  std::span<std::byte> payloadRegion() { return {payload_, payload_bytes_}; }
  const worker::BlockTable& table() const { return table_; }

 private:
  static constexpr BlockIndex kNone = ~BlockIndex{0};
  // A block's hash, free-queue generation and state word (the reference count, whether it
  // holds a hash, whether the prefix watch includes it) in one 16-byte record, so allocate,
  // release and cacheBlock touch one random line per block. A block is in the free queue
  // exactly when its count is 0.
  struct Block {
    BlockHash hash;
    uint32_t queue_gen = 0;  // the generation of its live free-queue entry
    uint32_t state = 0;      // reference count | kHasHash | kWatched
  };
  static_assert(sizeof(Block) == 16, "four block records per cache line");
  // The free queue in eviction order (the least recently freed cached blocks first, uncached
  // blocks ahead of them), as a ring of (block, generation) entries with lazy removal: a block
  // leaving the queue from anywhere (taken by a request, or evicted) bumps its generation, which
  // makes its entry stale; pops skip stale entries. The live entries are in exactly the order a
  // doubly linked list would keep, but taking a run from the front reads the ring in sequence
  // (the blocks ahead can be prefetched) instead of chasing each block's link to the next, and
  // taking a block from the middle touches that block alone, not its two neighbours.
  struct QueueEntry {
    BlockIndex block;
    uint32_t gen;
  };
  bool live(const QueueEntry& e) const { return blocks_[e.block].queue_gen == e.gen; }
  QueueEntry& ringAt(size_t i) { return ring_[(ring_head_ + i) & ring_mask_]; }
  // Stale entries outnumber the free blocks (plus a margin): time to compact before a push.
  bool queueMostlyStale() const { return ring_size_ > 2 * static_cast<size_t>(num_free_) + 64; }
  [[gnu::noinline]] void makeQueueRoom();
  // Before every push: compacts or grows the ring in the rare case it needs it.
  void roomForPush() {
    if (ring_size_ >= ring_.size() || queueMostlyStale()) [[unlikely]]
      makeQueueRoom();
  }
  static constexpr uint32_t kHasHash = uint32_t{1} << 31;
  static constexpr uint32_t kWatched = uint32_t{1} << 30;  // in the last prefix watch
  static constexpr uint32_t kRefMask = kWatched - 1;
  bool hasHash(BlockIndex b) const { return (blocks_[b].state & kHasHash) != 0; }
  uint32_t refs(BlockIndex b) const { return blocks_[b].state & kRefMask; }
  explicit KvPool(KvPoolOptions options, worker::KvEventSink* sink);
  // Inline (release calls it once per freed block); the rare compaction or growth is not.
  void pushBack(BlockIndex b) {
    roomForPush();
    ringAt(ring_size_++) = QueueEntry{b, ++blocks_[b].queue_gen};
    ++num_free_;
  }
  void pushFront(BlockIndex b);
  void writePayload(BlockIndex block, BlockHash hash);
  // Hands the evicted blocks (still holding their payload) to the lower tiers in one batch.
  [[gnu::noinline]] void offloadEvicted(std::span<const BlockHash> hashes,
                                        std::span<const BlockIndex> blocks);
  // f(b) for each of `blocks` in order, with the block records a few blocks ahead prefetched:
  // the blocks of a request or a lookup came off the free queue in eviction order, so they lie
  // at random in blocks_ and would otherwise cost one miss after another.
  template <class F>
  void prefetchBlocks(std::span<const BlockIndex> blocks, F&& f) {
    forEachPrefetched(
        blocks, kPrefetchAhead, [&](BlockIndex b) { prefetchLine(&blocks_[b]); }, f);
  }
  // Blocks, or table slots, whose lines are prefetched ahead of their use in a run.
  static constexpr size_t kPrefetchAhead = 8;
  void unlink(BlockIndex b);
  void ref(BlockIndex b);

  KvPoolOptions options_;
  worker::KvEventSink* sink_;
  LowerTiers* tiers_ = nullptr;
  std::vector<BlockIndex> evicted_blocks_;  // allocateInto scratch, with tiers only
  std::vector<Block> blocks_;
  worker::BlockTable table_;
  std::vector<QueueEntry> ring_;  // a power of two entries
  size_t ring_mask_ = 0;
  size_t ring_head_ = 0;  // position of the front entry
  size_t ring_size_ = 0;  // entries, stale ones included
  int64_t num_free_ = 0;
  std::byte* payload_ = nullptr;
  size_t payload_bytes_ = 0;
  std::shared_ptr<PayloadMemory> memory_;  // null: payload_ is the pool's own allocation
  // watchCachedPrefix: the blocks of the last watch, which carry kWatched until the next watch
  // clears it (the bit counts only while the watch is intact).
  std::vector<BlockIndex> watch_blocks_;
  uint64_t watch_id_ = 0;
  bool watch_intact_ = false;
  int64_t watched_unref_ = 0;  // watched blocks with no reference
  bool watched(BlockIndex b) const { return watch_intact_ && (blocks_[b].state & kWatched) != 0; }
};

}  // namespace kvf::engine
