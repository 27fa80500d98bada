#include "policy/cache_index.h"

#include <algorithm>
#include <bit>

namespace kvf::policy {

namespace {

uint64_t processSalt() {
  // ASLR places this variable differently in every process; the mix spreads its few random
  // bits over the word, and | 1 keeps the multiply a bijection.
  static const uint64_t kSalt = [] {
    static const char anchor = 0;
    uint64_t x = reinterpret_cast<uintptr_t>(&anchor) ^ 0x9e3779b97f4a7c15ULL;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 29;
    return x | 1;
  }();
  return kSalt;
}

InstanceMask bit(int instance) { return InstanceMask{1} << instance; }

bool validInstance(int instance) { return instance >= 0 && instance < kMaxInstances; }

// The leading-run bookkeeping of matchLengths / hashAndMatch: which of the first out.size()
// instances still hold every block so far, and each one's run length once it ends.
class RunTracker {
 public:
  explicit RunTracker(std::span<uint32_t> out) : out_(out) {
    std::fill(out.begin(), out.end(), 0u);
    size_t n = std::min<size_t>(out.size(), kMaxInstances);
    alive_ = n == kMaxInstances ? ~InstanceMask{0} : (bit(static_cast<int>(n)) - 1);
  }
  // Block `i` is held by `held`; false once no instance continues the run.
  bool step(size_t i, InstanceMask held) {
    record(alive_ & ~held, i);
    alive_ &= held;
    return alive_ != 0;
  }
  // Every instance still running holds all `blocks` blocks.
  void finish(size_t blocks) { record(alive_, blocks); }

 private:
  void record(InstanceMask ended, size_t length) {
    while (ended) {
      out_[std::countr_zero(ended)] = static_cast<uint32_t>(length);
      ended &= ended - 1;
    }
  }
  std::span<uint32_t> out_;
  InstanceMask alive_ = 0;
};

}  // namespace

CacheIndex::CacheIndex(CacheIndexConfig config)
    : config_(config), entries_(processSalt()), instances_(kMaxInstances) {}

bool CacheIndex::storeBlocks(int instance, const StoredBlocks& event) {
  if (!validInstance(instance) || event.engine_hashes.empty()) return false;
  // Our chain only maps when the engine's blocks are the same size as ours and carry exactly
  // their tokens; otherwise the engine hash cannot be translated and the event is dropped.
  if (event.block_size != config_.block_size ||
      event.token_ids.size() != event.engine_hashes.size() * config_.block_size) {
    ++stats_.stored_events_rejected;
    return false;
  }
  std::span<const TokenId> tokens(event.token_ids);
  return storeChain(instance, event.engine_hashes, event.has_parent, event.engine_parent,
                    [&](BlockHash parent, size_t i) {
                      return hashBlock(parent,
                                       tokens.subspan(i * config_.block_size, config_.block_size));
                    });
}

// Maps each engine hash to our chain hash (`next(parent, i)` for block i) and records the
// instance as an exact holder, confirming its predicted entries.
template <class NextHash>
bool CacheIndex::storeChain(int instance, std::span<const uint64_t> engine_hashes, bool has_parent,
                            uint64_t engine_parent, NextHash next) {
  InstanceState& state = instances_[instance];
  BlockHash parent = kRootBlockHash;
  if (has_parent) {
    auto it = state.engine_to_ours.find(engine_parent);
    if (it == state.engine_to_ours.end()) {
      ++stats_.stored_events_rejected;
      return false;
    }
    parent = it->second;
  }
  for (size_t i = 0; i < engine_hashes.size(); ++i) {
    parent = next(parent, i);
    auto [it, inserted] = state.engine_to_ours.try_emplace(engine_hashes[i], parent);
    if (inserted && state.engine_to_ours.size() > config_.max_blocks_per_instance) {
      state.engine_to_ours.erase(it);
      ++stats_.stored_events_rejected;
      return false;
    }
    if (!inserted && it->second != parent) {
      // The engine reused a hash for other content (its hash differs from ours in what it
      // covers); the newest mapping wins and the old block loses this instance.
      clearExact(it->second, instance);
      it->second = parent;
    }
    if (entries_.get(parent) & bit(instance)) {
      if (!holdsSoft(parent, instance)) continue;  // already held exactly
      ++stats_.soft_confirmed;
      dropSoft(SoftKey{parent, instance});
    }
    ++stats_.exact_entries;
    entries_.add(parent, bit(instance));
  }
  return true;
}

void CacheIndex::removeBlocks(int instance, std::span<const uint64_t> engine_hashes) {
  if (!validInstance(instance)) return;
  InstanceState& state = instances_[instance];
  for (uint64_t engine_hash : engine_hashes) {
    auto it = state.engine_to_ours.find(engine_hash);
    if (it == state.engine_to_ours.end()) {
      ++stats_.removed_unknown;
      continue;
    }
    clearExact(it->second, instance);
    state.engine_to_ours.erase(it);
  }
}

void CacheIndex::clearInstance(int instance) {
  if (!validInstance(instance)) return;
  InstanceState& state = instances_[instance];
  for (const auto& [engine_hash, ours] : state.engine_to_ours) clearExact(ours, instance);
  state.engine_to_ours = {};
  std::vector<SoftKey> soft;
  for (const auto& [key, expiry] : soft_expiry_) {
    if (key.instance == instance) soft.push_back(key);
  }
  for (const SoftKey& key : soft) dropSoft(key);
}

void CacheIndex::addSoft(int instance, std::span<const BlockHash> hashes, Nanos now,
                         bool approximate) {
  if (!validInstance(instance)) return;
  Nanos expiry = now + (approximate ? config_.approximate_ttl : config_.predicted_ttl);
  auto& queue = approximate ? approximate_queue_ : predicted_queue_;
  for (BlockHash hash : hashes) {
    SoftKey key{hash, instance};
    if (entries_.get(hash) & bit(instance)) {
      auto it = soft_expiry_.find(key);
      if (it == soft_expiry_.end()) continue;  // already confirmed
      it->second = expiry;
    } else {
      if (soft_expiry_.size() >= config_.max_soft_entries) break;
      soft_expiry_.emplace(key, expiry);
      ++stats_.soft_entries;
      entries_.add(hash, bit(instance));
    }
    queue.push_back(SoftRecord{expiry, key});
  }
}

void CacheIndex::expire(Nanos now) {
  for (auto* queue : {&predicted_queue_, &approximate_queue_}) {
    while (!queue->empty() && queue->front().expiry <= now) {
      SoftRecord record = queue->front();
      queue->pop_front();
      auto it = soft_expiry_.find(record.key);
      // A refreshed entry has a later expiry and a later record; this one is stale.
      if (it == soft_expiry_.end() || it->second != record.expiry) continue;
      ++stats_.soft_expired;
      dropSoft(record.key);
    }
  }
}

void CacheIndex::dropSoft(const SoftKey& key) {
  if (soft_expiry_.erase(key) == 0) return;
  --stats_.soft_entries;
  entries_.remove(key.hash, bit(key.instance));
}

void CacheIndex::clearExact(BlockHash hash, int instance) {
  if ((entries_.get(hash) & bit(instance)) == 0 || holdsSoft(hash, instance)) return;
  --stats_.exact_entries;
  entries_.remove(hash, bit(instance));
}

void CacheIndex::matchLengths(std::span<const BlockHash> hashes, std::span<uint32_t> out) const {
  RunTracker run(out);
  constexpr size_t kPrefetch = 8;
  for (size_t i = 0; i < std::min(kPrefetch, hashes.size()); ++i) entries_.prefetch(hashes[i]);
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (i + kPrefetch < hashes.size()) entries_.prefetch(hashes[i + kPrefetch]);
    if (!run.step(i, holders(hashes[i]))) return;
  }
  run.finish(hashes.size());
}

void CacheIndex::hashAndMatch(std::span<const TokenId> tokens, std::vector<BlockHash>* hashes,
                              std::span<uint32_t> out) const {
  RunTracker run(out);
  size_t bs = config_.block_size;
  size_t blocks = bs == 0 ? 0 : tokens.size() / bs;
  hashes->resize(blocks);
  // A software pipeline: hashing runs kAhead blocks ahead of the lookups, kStep blocks at a
  // time straight into `hashes` (no allocation, no per-step resize), and each new hash's slot
  // is prefetched at once, so the table's cache misses are in flight while the next blocks
  // are hashed. (A loop that hashed and probed one block per iteration measured the same.)
  constexpr size_t kAhead = 64;
  constexpr size_t kStep = 16;
  BlockHash* dst = hashes->data();
  size_t hashed = 0;
  BlockHash parent = kRootBlockHash;
  auto extend = [&](size_t upto) {
    parent = hashTokenBlocksTo(tokens.subspan(hashed * bs), bs, parent,
                               std::span<BlockHash>(dst + hashed, upto - hashed));
    for (size_t j = hashed; j < upto; ++j) entries_.prefetch(dst[j]);
    hashed = upto;
  };
  extend(std::min(blocks, kAhead));
  size_t i = 0;
  for (; i < blocks; ++i) {
    if (i % kStep == 0 && hashed < blocks) extend(std::min(blocks, hashed + kStep));
    if (!run.step(i, holders(dst[i]))) break;
  }
  if (i == blocks) run.finish(blocks);
  hashes->resize(hashed);  // only what was hashed; completeBlockHashes() goes on from there
}

InstanceMask CacheIndex::holders(BlockHash hash) const { return entries_.get(hash); }

InstanceMask CacheIndex::exactHolders(BlockHash hash) const {
  InstanceMask exact = 0;
  for (InstanceMask held = entries_.get(hash); held != 0; held &= held - 1) {
    int instance = std::countr_zero(held);
    if (!holdsSoft(hash, instance)) exact |= bit(instance);
  }
  return exact;
}

size_t CacheIndex::instanceBlocks(int instance) const {
  return validInstance(instance) ? instances_[instance].engine_to_ours.size() : 0;
}

CacheIndexStats CacheIndex::stats() const {
  CacheIndexStats s = stats_;
  s.blocks = entries_.size();
  return s;
}

// storeBlocks() for token-free events: the chain runs over content keys instead of tokens.
bool CacheIndex::storeKeyedBlocks(int instance, std::span<const uint64_t> engine_hashes,
                                  bool has_parent, uint64_t engine_parent,
                                  std::span<const uint64_t> block_keys, size_t block_size) {
  if (!validInstance(instance) || engine_hashes.empty()) return false;
  if (block_size != config_.block_size || block_keys.size() != engine_hashes.size()) {
    ++stats_.stored_events_rejected;
    return false;
  }
  return storeChain(
      instance, engine_hashes, has_parent, engine_parent,
      [&](BlockHash parent, size_t i) { return hashBlockKey(parent, block_keys[i]); });
}

}  // namespace kvf::policy
