#include "engine/kv_pool.h"

#include <algorithm>
#include <cassert>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "common/prefetch.h"
#include "common/status.h"
#include "common/strings.h"
#include "worker/block_payload.h"

namespace kvf::engine {

absl::StatusOr<std::unique_ptr<KvPool>> KvPool::create(KvPoolOptions options,
                                                       worker::KvEventSink* sink,
                                                       std::shared_ptr<PayloadMemory> memory) {
  if (options.block_size < 1) return absl::InvalidArgumentError("block_size must be >= 1");
  if (options.num_blocks < 1 || options.num_blocks >= int64_t{kNone}) {
    return absl::InvalidArgumentError(strCat("num_blocks out of range: ", options.num_blocks));
  }
  std::unique_ptr<KvPool> pool(new KvPool(options, sink));
  size_t bytes = options.payload_bytes_per_block * static_cast<size_t>(options.num_blocks);
  if (memory != nullptr) {
    std::span<std::byte> region = memory->region();
    if (bytes == 0 || region.size() < bytes) {
      return absl::InvalidArgumentError(strCat("payload memory of ", region.size(),
                                               " bytes for a pool of ", bytes, " payload bytes"));
    }
    pool->payload_ = region.data();
    pool->payload_bytes_ = bytes;
    pool->memory_ = std::move(memory);
  } else if (bytes > 0) {
    constexpr size_t kAlign = 4096;
    size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    pool->payload_ = static_cast<std::byte*>(std::aligned_alloc(kAlign, rounded));
    if (pool->payload_ == nullptr) {
      return absl::ResourceExhaustedError(strCat("cannot allocate ", rounded, " payload bytes"));
    }
    std::memset(pool->payload_, 0, rounded);
    pool->payload_bytes_ = bytes;
  }
  return pool;
}

KvPool::KvPool(KvPoolOptions options, worker::KvEventSink* sink)
    : options_(options), sink_(sink), blocks_(static_cast<size_t>(options.num_blocks)) {
  for (BlockIndex b = 0; b < blocks_.size(); ++b) pushBack(b);
}

KvPool::~KvPool() {
  if (memory_ == nullptr) std::free(payload_);
}

double KvPool::usage() const {
  return blocks_.empty() ? 0.0 : 1.0 - static_cast<double>(num_free_) / blocks_.size();
}

// Before a push: drops the stale entries once they outnumber the free blocks (plus a margin),
// so compaction costs O(1) per push, and grows the ring when it is still full.
void KvPool::makeQueueRoom() {
  if (queueMostlyStale()) {
    size_t kept = 0;
    for (size_t i = 0; i < ring_size_; ++i) {
      QueueEntry e = ringAt(i);
      if (live(e)) ringAt(kept++) = e;
    }
    ring_size_ = kept;
  }
  if (ring_size_ < ring_.size()) return;
  std::vector<QueueEntry> bigger(std::max<size_t>(1024, 2 * ring_.size()));
  for (size_t i = 0; i < ring_size_; ++i) bigger[i] = ringAt(i);
  ring_ = std::move(bigger);
  ring_mask_ = ring_.size() - 1;
  ring_head_ = 0;
}

void KvPool::pushFront(BlockIndex b) {
  roomForPush();
  ring_head_ = (ring_head_ - 1) & ring_mask_;
  ++ring_size_;
  ringAt(0) = QueueEntry{b, ++blocks_[b].queue_gen};
  ++num_free_;
}

void KvPool::unlink(BlockIndex b) {
  assert(refs(b) == 0);
  ++blocks_[b].queue_gen;  // its entry turns stale
  --num_free_;
}

void KvPool::ref(BlockIndex b) {
  if (refs(b) == 0) {
    unlink(b);
    if (watched(b)) --watched_unref_;
  }
  assert(refs(b) < kRefMask && "reference count overflow");
  ++blocks_[b].state;
}

std::vector<BlockIndex> KvPool::findCachedPrefix(std::span<const BlockHash> hashes,
                                                 std::span<const BlockIndex> hint) const {
  std::vector<BlockIndex> out;
  if (!options_.enable_prefix_caching) return out;
  size_t i = 0;
  // A block holds hash h exactly when the table maps h to it (cacheBlock / allocate keep both).
  for (; i < hashes.size() && i < hint.size(); ++i) {
    BlockIndex b = hint[i];
    if (b >= blocks_.size() || !hasHash(b) || blocks_[b].hash != hashes[i]) break;
    out.push_back(b);
  }
  // Table misses in flight (a lookup past the run is harmless).
  forEachPrefetched(
      hashes.subspan(i), kPrefetchAhead, [&](BlockHash h) { table_.prefetch(h); },
      [&](BlockHash h) {
        auto b = table_.find(h);
        if (b) out.push_back(*b);
        return b.has_value();
      });
  return out;
}

int64_t KvPool::countUnreferenced(std::span<const BlockIndex> blocks) const {
  int64_t n = 0;
  for (BlockIndex b : blocks) n += refs(b) == 0 ? 1 : 0;
  return n;
}

void KvPool::acquire(std::span<const BlockIndex> blocks) {
  prefetchBlocks(blocks, [&](BlockIndex b) { ref(b); });
}

std::optional<std::vector<BlockIndex>> KvPool::allocate(int64_t n) {
  std::vector<BlockIndex> out;
  if (!allocateInto(n, &out)) return std::nullopt;
  return out;
}

bool KvPool::allocateInto(int64_t n, std::vector<BlockIndex>* blocks) {
  if (n < 0 || n > num_free_) return false;
  // Both lists are written by index into vectors sized up front (no capacity check per block):
  // `blocks` grows by n, the evicted hashes at the first eviction to the blocks still to come.
  const size_t first = blocks->size();
  blocks->resize(first + static_cast<size_t>(n));
  BlockIndex* out = blocks->data() + first;
  worker::BlockRemoved removed;
  std::vector<BlockHash>& evicted = removed.block_hashes;
  size_t num_evicted = 0;
  constexpr size_t kQueueAhead = 8;  // blocks ahead in the queue whose records are prefetched
  for (int64_t i = 0; i < n; ++i) {
    QueueEntry front;
    do {  // skip the entries of blocks that left the queue since they were pushed
      front = ringAt(0);
      if (ring_size_ > kQueueAhead) {
        BlockIndex ahead = ringAt(kQueueAhead).block;
        prefetchLine(&blocks_[ahead]);
      }
      ring_head_ = (ring_head_ + 1) & ring_mask_;
      --ring_size_;
    } while (!live(front));
    BlockIndex b = front.block;
    unlink(b);
    if (hasHash(b)) {
      if (evicted.empty()) evicted.resize(static_cast<size_t>(n - i));
      if (tiers_ != nullptr) evicted_blocks_.push_back(b);
      evicted[num_evicted++] = blocks_[b].hash;
      if (watched(b)) watch_intact_ = false;
    }
    blocks_[b].state = 1;  // one reference, no hash
    out[i] = b;
  }
  evicted.resize(num_evicted);
  if (tiers_ != nullptr && num_evicted > 0) offloadEvicted(evicted, evicted_blocks_);
  // Evicted hashes leave the table after the walk, with their slots prefetched a few ahead
  // (one random slot each: the misses overlap instead of queueing).
  forEachPrefetched(
      std::span<const BlockHash>(evicted), kPrefetchAhead, [&](BlockHash h) { table_.prefetch(h); },
      [&](BlockHash h) { table_.erase(h); });
  if (sink_ != nullptr && num_evicted > 0) sink_->onBlockRemoved(std::move(removed));
  return true;
}

void KvPool::release(std::span<const BlockIndex> blocks) {
  prefetchBlocks(blocks, [&](BlockIndex b) {
    assert(refs(b) > 0);
    if ((--blocks_[b].state & kRefMask) > 0) return;
    if (watched(b)) ++watched_unref_;
    if (hasHash(b)) {
      pushBack(b);
    } else {
      pushFront(b);
    }
  });
}

void KvPool::offloadEvicted(std::span<const BlockHash> hashes, std::span<const BlockIndex> blocks) {
  // Nothing has written the blocks since they were freed: their payload is the evicted KV.
  std::vector<std::span<const std::byte>> payloads;
  payloads.reserve(blocks.size());
  for (BlockIndex b : blocks) payloads.push_back(std::as_const(*this).payload(b));
  tiers_->offload(hashes, payloads);
  evicted_blocks_.clear();
}

void KvPool::writePayload(BlockIndex block, BlockHash hash) {
  if (memory_ != nullptr) {
    memory_->write(payload(block), hash);
  } else {
    worker::fillBlockPayload(hash, payload(block));
  }
}

bool KvPool::verifyPayload(BlockIndex block, BlockHash hash) const {
  if (payload_ == nullptr) return true;
  if (memory_ != nullptr) return memory_->verify(payload(block), hash);
  return worker::verifyBlockPayload(hash, payload(block));
}

std::optional<BlockHash> KvPool::hashOf(BlockIndex block) const {
  if (!hasHash(block)) return std::nullopt;
  return blocks_[block].hash;
}

absl::Status KvPool::pin(BlockHash hash) {
  auto b = table_.find(hash);
  if (!b) return absl::NotFoundError(strCat("block ", hash.value(), " is not cached"));
  KVF_RETURN_IF_ERROR(table_.pin(hash));
  ref(*b);
  return absl::OkStatus();
}

absl::Status KvPool::unpin(BlockHash hash) {
  auto b = table_.find(hash);
  if (!b) return absl::FailedPreconditionError(strCat("block ", hash.value(), " is not pinned"));
  KVF_RETURN_IF_ERROR(table_.unpin(hash));
  BlockIndex idx = *b;
  release(std::span<const BlockIndex>(&idx, 1));
  return absl::OkStatus();
}

uint64_t KvPool::watchCachedPrefix(std::span<const BlockIndex> blocks) {
  prefetchBlocks(watch_blocks_, [&](BlockIndex b) { blocks_[b].state &= ~kWatched; });
  watch_blocks_.clear();
  ++watch_id_;
  watch_intact_ = true;
  watched_unref_ = 0;
  extendWatch(watch_id_, blocks);
  return watch_id_;
}

void KvPool::extendWatch(uint64_t id, std::span<const BlockIndex> blocks) {
  if (!watchIntact(id)) return;
  watch_blocks_.insert(watch_blocks_.end(), blocks.begin(), blocks.end());
  prefetchBlocks(blocks, [&](BlockIndex b) {
    blocks_[b].state |= kWatched;
    if (refs(b) == 0) ++watched_unref_;
  });
}

bool KvPool::resetPrefixCache() {
  if (num_free_ != numBlocks()) return false;
  watch_intact_ = false;
  // kWatched stays: the next watch clears it.
  for (Block& block : blocks_) block.state &= ~kHasHash;
  table_.clear();
  if (sink_ != nullptr) sink_->onAllBlocksCleared();
  return true;
}

KvPool::PayloadAudit KvPool::auditPayloads() const {
  PayloadAudit audit;
  for (BlockIndex b = 0; b < static_cast<BlockIndex>(blocks_.size()); ++b) {
    if (!hasHash(b)) continue;
    ++audit.cached_blocks;
    if (!verifyPayload(b, blocks_[b].hash)) {
      ++audit.corrupt_blocks;
    }
  }
  return audit;
}

std::span<std::byte> KvPool::payload(BlockIndex block) {
  size_t n = options_.payload_bytes_per_block;
  if (payload_ == nullptr) return {};
  return {payload_ + n * block, n};
}

std::span<const std::byte> KvPool::payload(BlockIndex block) const {
  size_t n = options_.payload_bytes_per_block;
  if (payload_ == nullptr) return {};
  return {payload_ + n * block, n};
}

}  // namespace kvf::engine
