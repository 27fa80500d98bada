#include "policy/cache_index.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace kvf::policy {

namespace {

InstanceMask bit(int instance) { return InstanceMask{1} << instance; }

bool validInstance(int instance) { return instance >= 0 && instance < kMaxInstances; }

// Whether `me` holds the block exactly (from events), not only softly (routed).
bool holdsExactly(const BlockTable::Entry* entry, InstanceMask me) {
  return entry != nullptr && (entry->holders & me) && (entry->soft & me) == 0;
}

// Event runs (a prompt's blocks, an eviction batch, due expiries) touch one random slot per
// block: prefetching the slot of the block kAhead positions on keeps that many cache misses in
// flight instead of one at a time.
constexpr size_t kAhead = 16;

template <class Table>
void prefetchAhead(const Table& table, std::span<const uint64_t> keys, size_t i) {
  if (i + kAhead < keys.size()) table.prefetch(keys[i + kAhead]);
}
// The same for runs that erase (removals): the slots after the erased one are scanned too.
void prefetchRunAhead(const BlockTable& table, std::span<const uint64_t> keys, size_t i) {
  if (i + kAhead < keys.size()) table.prefetchRun(keys[i + kAhead]);
}

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
    : config_(config),
      entries_(processSalt(), static_cast<int>(std::lround(config.table_max_load * 8))),
      instances_(kMaxInstances) {}

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
  if (state.hashes_are_ours)
    return storeOwnChain(instance, engine_hashes, has_parent, engine_parent, next);
  BlockHash parent = kRootBlockHash;
  if (has_parent) {
    const BlockHash* ours = state.engine_to_ours.find(engine_parent);
    if (ours == nullptr) {
      ++stats_.stored_events_rejected;
      return false;
    }
    parent = *ours;
  }
  const InstanceMask me = bit(instance);
  for (size_t i = 0; i < engine_hashes.size(); ++i) {
    prefetchAhead(state.engine_to_ours, engine_hashes, i);
    parent = next(parent, i);
    auto [mapped, inserted] = state.engine_to_ours.tryEmplace(engine_hashes[i], parent);
    if (inserted && state.engine_to_ours.size() > config_.max_blocks_per_instance) {
      state.engine_to_ours.eraseValue(mapped);
      ++stats_.stored_events_rejected;
      return false;
    }
    if (!inserted && *mapped != parent) {
      // The engine reused a hash for other content (its hash differs from ours in what it
      // covers); the newest mapping wins and the old block loses this instance.
      clearExact(*mapped, instance);
      *mapped = parent;
    }
    BlockTable::Entry* entry = entries_.insert(parent);
    if (!holdsExactly(entry, me)) markExact(parent, entry, instance);
  }
  return true;
}

// Makes `instance` an exact holder of a block it does not hold exactly yet (a predicted entry
// is confirmed). `entry` is the block's slot (inserted when the block was absent).
void CacheIndex::markExact(BlockHash hash, BlockTable::Entry* entry, int instance) {
  const InstanceMask me = bit(instance);
  if (entry->holders & me) {
    ++stats_.soft_confirmed;
    unsetSoft(hash, entry, instance);
  }
  ++stats_.exact_entries;
  entry->holders |= me;
}

// storeChain() for an instance whose engine hashes are ours: the block table itself says what
// the instance holds exactly (where the mapped path asks its engine->ours map), with the same
// outcomes: an unknown parent or a full instance rejects the event, a held block is skipped.
template <class NextHash>
bool CacheIndex::storeOwnChain(int instance, std::span<const uint64_t> hashes, bool has_parent,
                               BlockHash parent, NextHash next) {
  InstanceState& state = instances_[instance];
  const InstanceMask me = bit(instance);
  if (!has_parent) {
    parent = kRootBlockHash;
  } else if (!holdsExactly(entries_.find(parent), me)) {
    ++stats_.stored_events_rejected;
    return false;
  }
  for (size_t i = 0; i < hashes.size(); ++i) {
    prefetchAhead(entries_, hashes, i);
    parent = next(parent, i);
    if (parent != hashes[i]) {  // not our hash after all: the instance is misdeclared
      ++stats_.stored_events_rejected;
      return false;
    }
    // Below the cap the block may be added: find or insert in one probe (an inserted entry has
    // no holder, so it reads as not held); at the cap only look.
    const bool room = state.own_blocks + 1 <= config_.max_blocks_per_instance;
    BlockTable::Entry* entry = room ? entries_.insert(parent) : entries_.find(parent);
    if (holdsExactly(entry, me)) continue;
    if (!room) {
      ++stats_.stored_events_rejected;
      return false;
    }
    ++state.own_blocks;
    markExact(parent, entry, instance);
  }
  return true;
}

void CacheIndex::removeOwnBlocks(int instance, std::span<const uint64_t> hashes) {
  InstanceState& state = instances_[instance];
  const InstanceMask me = bit(instance);
  for (size_t i = 0; i < hashes.size(); ++i) {
    prefetchRunAhead(entries_, hashes, i);
    BlockHash hash = hashes[i];
    BlockTable::Entry* entry = entries_.find(hash);
    if (!holdsExactly(entry, me)) {
      ++stats_.removed_unknown;
      continue;
    }
    --stats_.exact_entries;
    --state.own_blocks;
    entries_.clearBits(entry, me);
  }
}

void CacheIndex::setEngineHashesAreOurs(int instance, bool value) {
  if (!validInstance(instance)) return;
  InstanceState& state = instances_[instance];
  if (state.hashes_are_ours == value) return;
  clearInstance(instance);  // the other representation's exact entries cannot carry over
  state.hashes_are_ours = value;
}

void CacheIndex::removeBlocks(int instance, std::span<const uint64_t> engine_hashes) {
  if (!validInstance(instance)) return;
  InstanceState& state = instances_[instance];
  if (state.hashes_are_ours) {
    removeOwnBlocks(instance, engine_hashes);
    return;
  }
  for (size_t i = 0; i < engine_hashes.size(); ++i) {
    prefetchAhead(state.engine_to_ours, engine_hashes, i);
    BlockHash* ours = state.engine_to_ours.find(engine_hashes[i]);
    if (ours == nullptr) {
      ++stats_.removed_unknown;
      continue;
    }
    clearExact(*ours, instance);
    state.engine_to_ours.eraseValue(ours);
  }
}

void CacheIndex::clearInstance(int instance) {
  if (!validInstance(instance)) return;
  InstanceState& state = instances_[instance];
  state.engine_to_ours.forEach([&](uint64_t, BlockHash ours) { clearExact(ours, instance); });
  state.engine_to_ours.clear();
  // Its soft entries (their queued records become stale), and its exact ones where no map
  // lists them.
  const InstanceMask me = bit(instance);
  std::vector<BlockHash> held;
  entries_.forEach([&](BlockHash hash, const BlockTable::Entry& e) {
    if (e.holders & me) held.push_back(hash);
  });
  for (BlockHash hash : held) {
    BlockTable::Entry* entry = entries_.find(hash);
    if (entry->soft & me) {
      unsetSoft(hash, entry, instance);
    } else {
      --stats_.exact_entries;  // only with hashes_are_ours: clearExact dropped the others
    }
    entries_.clearBits(entry, me);
  }
  state.own_blocks = 0;
}

void CacheIndex::addSoft(int instance, std::span<const BlockHash> hashes, Nanos now,
                         bool approximate) {
  if (!validInstance(instance)) return;
  Nanos expiry = now + (approximate ? config_.approximate_ttl : config_.predicted_ttl);
  SoftQueue& queue = approximate ? approximate_queue_ : predicted_queue_;
  const InstanceMask me = bit(instance);
  for (size_t i = 0; i < hashes.size(); ++i) {
    prefetchAhead(entries_, hashes, i);
    BlockHash hash = hashes[i];
    // Below the cap a new entry may be added: find or insert in one probe (an inserted entry
    // has no holder yet, so it reads as fresh); at the cap only look.
    const bool room = stats_.soft_entries < config_.max_soft_entries;
    BlockTable::Entry* entry = room ? entries_.insert(hash) : entries_.find(hash);
    bool fresh = entry == nullptr || (entry->holders & me) == 0;
    if (!fresh && (entry->soft & me) == 0) continue;  // already confirmed
    if (fresh) {
      if (!room) break;
      entry->holders |= me;
      ++stats_.soft_entries;
    } else {
      killRecord(softRecord(hash, *entry, instance));  // refreshed: the new record replaces it
    }
    const auto record = static_cast<int64_t>(queue.nextSeq()) * 2 + (approximate ? 1 : 0);
    if (entry->soft == 0) {  // the block's only soft holder (the usual case): in its slot
      entry->soft = me;
      entry->soft_record = record;
    } else {
      setSoftRecord(hash, entry, instance, fresh, record);
    }
    queue.push(SoftRecord{expiry, hash, instance, true});
  }
}

void CacheIndex::expire(Nanos now) {
  for (SoftQueue* queue : {&predicted_queue_, &approximate_queue_}) {
    while (!queue->empty() && queue->front().expiry <= now) {
      if (queue->size() > kAhead && queue->at(kAhead).live) {
        entries_.prefetchRun(queue->at(kAhead).hash);
      }
      SoftRecord record = queue->front();
      queue->pop();
      // Dead: confirmed, cleared or refreshed since (the entry's current record is another).
      if (!record.live) continue;
      const InstanceMask me = bit(record.instance);
      BlockTable::Entry* entry = entries_.find(record.hash);
      if (entry == nullptr || (entry->soft & me) == 0) continue;  // not reached
      ++stats_.soft_expired;
      if (entry->soft_record == kRecordInMap) {
        unsetSoft(record.hash, entry, record.instance);
      } else {  // the only soft holder; its record is this one, already off the queue
        --stats_.soft_entries;
        entry->soft_record = 0;
      }
      entries_.clearBits(entry, me);
    }
  }
}

// Where a soft entry's record id lives: in the block's slot while the block has one soft
// holder (the common case: one routed instance, confirmed or expired before another routes
// there), else every soft holder's in soft_record_ (entry.soft_record == kRecordInMap).
void CacheIndex::setSoftRecord(BlockHash hash, BlockTable::Entry* entry, int instance, bool fresh,
                               int64_t record) {
  const InstanceMask me = bit(instance);
  const InstanceMask others = entry->soft & ~me;
  const bool in_map = others != 0 && entry->soft_record == kRecordInMap;
  entry->soft |= me;
  if (others == 0) {
    // A refresh of the last soft holder of a block that had several: back into the slot.
    if (!fresh && entry->soft_record == kRecordInMap) soft_record_.erase(SoftKey{hash, instance});
    entry->soft_record = record;
    return;
  }
  if (!in_map) {  // a second soft holder: the first one's record moves out of the slot
    soft_record_.insert_or_assign(SoftKey{hash, std::countr_zero(others)}, entry->soft_record);
    entry->soft_record = kRecordInMap;
  }
  soft_record_.insert_or_assign(SoftKey{hash, instance}, record);
}

int64_t CacheIndex::softRecord(BlockHash hash, const BlockTable::Entry& entry, int instance) const {
  if (entry.soft_record != kRecordInMap) return entry.soft_record;
  auto it = soft_record_.find(SoftKey{hash, instance});
  return it == soft_record_.end() ? -1 : it->second;
}

// Marks a queued record dead (an id of a record already popped, or -1, is ignored).
void CacheIndex::killRecord(int64_t record) {
  if (record < 0) return;
  SoftQueue& queue = (record & 1) != 0 ? approximate_queue_ : predicted_queue_;
  if (SoftRecord* r = queue.find(static_cast<uint64_t>(record >> 1))) r->live = false;
}

// Drops `instance`'s soft entry (its bit and record); the caller keeps it as a holder
// (confirmed) or clears that too.
void CacheIndex::unsetSoft(BlockHash hash, BlockTable::Entry* entry, int instance) {
  --stats_.soft_entries;
  if (entry->soft_record == kRecordInMap) {
    auto it = soft_record_.find(SoftKey{hash, instance});
    if (it != soft_record_.end()) {
      killRecord(it->second);
      soft_record_.erase(it);
    }
  } else {
    killRecord(entry->soft_record);
  }
  entry->soft &= ~bit(instance);
  if (entry->soft == 0) entry->soft_record = 0;
}

void CacheIndex::clearExact(BlockHash hash, int instance) {
  const InstanceMask me = bit(instance);
  BlockTable::Entry* entry = entries_.find(hash);
  if (!holdsExactly(entry, me)) return;
  --stats_.exact_entries;
  entries_.clearBits(entry, me);
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
  const BlockTable::Entry* entry = entries_.find(hash);
  return entry == nullptr ? 0 : entry->holders & ~entry->soft;
}

size_t CacheIndex::instanceBlocks(int instance) const {
  if (!validInstance(instance)) return 0;
  const InstanceState& state = instances_[instance];
  return state.hashes_are_ours ? state.own_blocks : state.engine_to_ours.size();
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

bool CacheIndex::storeOwnHashes(int instance, std::span<const uint64_t> hashes, bool has_parent,
                                uint64_t parent, size_t block_size) {
  if (!validInstance(instance) || hashes.empty()) return false;
  if (block_size != config_.block_size || !instances_[instance].hashes_are_ours) {
    ++stats_.stored_events_rejected;
    return false;
  }
  return storeOwnChain(instance, hashes, has_parent, parent,
                       [&](BlockHash, size_t i) { return hashes[i]; });
}

}  // namespace kvf::policy
