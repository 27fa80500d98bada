#include "policy/cache_index.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <iterator>

namespace kvf::policy {

namespace {

bool validInstance(int instance) { return instance >= 0 && instance < kMaxInstances; }
bool validStream(int stream) { return stream >= 0 && stream < kMaxStreams; }

// Event runs (a prompt's blocks, an eviction batch, due expiries) touch one random slot per
// block: prefetching the slot of the block kAhead positions on keeps that many cache misses in
// flight instead of one at a time.
constexpr size_t kAhead = 16;

void prefetchAhead(const FlatU64Map<BlockHash>& engine_to_ours, std::span<const uint64_t> keys,
                   size_t i) {
  if (i + kAhead < keys.size()) engine_to_ours.prefetch(keys[i + kAhead]);
}
// The same in the holder table for an engine whose hashes are ours (setEngineHashesAreOurs).
void prefetchAhead(const HolderTable& table, std::span<const uint64_t> own, size_t i) {
  if (i + kAhead < own.size()) table.prefetch(BlockHash{own[i + kAhead]});
}
// The same for runs that erase (removals): the slots after the erased one are scanned too.
void prefetchRunAhead(const HolderTable& table, std::span<const uint64_t> own, size_t i) {
  if (i + kAhead < own.size()) table.prefetchRun(BlockHash{own[i + kAhead]});
}

// The leading-run bookkeeping of matchLengths / hashAndMatch: which of the first out.size()
// instances still hold every block so far, and each one's run length once it ends. Instances
// below kWordInstances run as bits of one word; past them (clusters of more than 63), the listed
// ones still running are kept in `listed`, ascending, which every block's listed holders thin.
class RunTracker {
 public:
  RunTracker(std::span<uint32_t> out, std::vector<ListedInstance>* listed)
      : out_(out.first(std::min<size_t>(out.size(), kMaxInstances))), listed_(listed) {
    std::fill(out.begin(), out.end(), 0u);
    const size_t n = out_.size();
    alive_ = instanceBit(static_cast<int>(std::min<size_t>(n, kWordInstances))) - 1;
    listed_all_ = n > static_cast<size_t>(kWordInstances);
    listed_live_ = listed_all_;
    listed_->clear();
  }
  // Block `i` (`hash`, whose holder-table entry is `e`) is held by the entry's instances and
  // by the soft cursor's (`soft_word` and soft.listed()); false once no instance continues the
  // run. Inlined into the match loops: only the word path runs for a small cluster.
  [[gnu::always_inline]] bool step(size_t i, const HolderTable& table, BlockHash hash,
                                   HolderTable::Entry e, InstanceMask soft_word,
                                   const SoftTree::Cursor& soft) {
    InstanceMask exact_word = e;
    if (!HolderTable::isWord(e)) [[unlikely]] {
      // Along a shared prefix the entry repeats: its decoded holders are at hand.
      if (e != last_entry_) decode(table, hash, e);
      exact_word = last_exact_.word;
    }
    const InstanceMask held = exact_word | soft_word;
    record(alive_ & ~held, i);
    alive_ &= held;
    // Listed holders change only where the entry or the soft node does: along a shared prefix
    // they do not, and the running listed instances go on without a look at them.
    if (listed_live_ && (listed_all_ || e != prev_e_ || soft.listed().data() != prev_b_.data() ||
                         soft.listed().size() != prev_b_.size())) [[unlikely]] {
      stepListed(i, HolderTable::isWord(e) ? std::span<const ListedInstance>{} : last_exact_.listed,
                 soft.listed());
      prev_e_ = e;
    }
    return alive_ != 0 || listed_live_;
  }
  // Every instance still running holds all `blocks` blocks.
  void finish(size_t blocks) {
    record(alive_, blocks);
    for (ListedInstance id : *listed_) out_[id] = static_cast<uint32_t>(blocks);
  }

 private:
  void record(InstanceMask ended, size_t length) {
    while (ended) {
      out_[std::countr_zero(ended)] = static_cast<uint32_t>(length);
      ended &= ended - 1;
    }
  }
  // An entry equal to the block before's (a shared prefix's blocks have the same
  // holders) is not decoded again. Decoding alternates between two buffers, so the block
  // before's listed holders stay readable for stepListed.
  [[gnu::noinline]] void decode(const HolderTable& table, BlockHash hash, HolderTable::Entry e) {
    cur_ ^= 1;
    last_exact_ = table.view(hash, e, scratch_[cur_]);
    last_entry_ = e;
  }
  [[gnu::noinline]] void stepListed(size_t i, std::span<const ListedInstance> a,
                                    std::span<const ListedInstance> b) {
    if (listed_all_) {
      // The first block: every listed instance ran so far, those holding it go on (the others
      // keep length 0).
      listed_all_ = false;
      std::set_union(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(*listed_));
      while (!listed_->empty() && listed_->back() >= out_.size()) listed_->pop_back();
    } else if (!sameIds(a, prev_a_) || !sameIds(b, prev_b_)) {
      // One merge walk: the running instances, a and b all ascend.
      size_t ia = 0, ib = 0, kept = 0;
      for (ListedInstance id : *listed_) {
        while (ia < a.size() && a[ia] < id) ++ia;
        while (ib < b.size() && b[ib] < id) ++ib;
        if ((ia < a.size() && a[ia] == id) || (ib < b.size() && b[ib] == id)) {
          (*listed_)[kept++] = id;
        } else {
          out_[id] = static_cast<uint32_t>(i);
        }
      }
      listed_->resize(kept);
    }
    // Otherwise the block has the same listed holders as the one before (a shared prefix
    // usually does), which every running instance holds: nothing ends.
    prev_a_ = a;
    prev_b_ = b;
    listed_live_ = !listed_->empty();
  }
  // A loop, not memcmp: the lists are short, and a library call per block cost more.
  static bool sameIds(std::span<const ListedInstance> x, std::span<const ListedInstance> y) {
    if (x.size() != y.size()) return false;
    if (x.data() == y.data()) return true;
    uint32_t differ = 0;
    for (size_t k = 0; k < x.size(); ++k) differ |= x[k] ^ y[k];
    return differ == 0;
  }

  std::span<uint32_t> out_;
  InstanceMask alive_ = 0;
  bool listed_all_ = false;
  bool listed_live_ = false;  // listed_all_ or some listed instance still running
  std::vector<ListedInstance>* listed_;
  std::span<const ListedInstance> prev_a_, prev_b_;  // the last block's listed holders
  HolderTable::Entry last_entry_ = 0;                // the last decoded entry
  HolderTable::Entry prev_e_ = 0;                    // the entry stepListed last saw
  HolderView last_exact_;
  ListedInstance scratch_[2][HolderTable::kCompactIds];
  int cur_ = 0;
};

}  // namespace

CacheIndex::CacheIndex(CacheIndexConfig config)
    : config_(config),
      entries_(processSalt(), static_cast<int>(std::lround(config.table_max_load * 8))),
      instances_(kMaxInstances),
      soft_(config.max_soft_entries) {
  run_scratch_.reserve(kMaxInstances);
}

bool CacheIndex::storeBlocks(int instance, const StoredBlocks& event, int stream) {
  if (!validInstance(instance) || !validStream(stream) || event.engine_hashes.empty()) {
    return false;
  }
  // Our chain only maps when the engine's blocks are the same size as ours and carry exactly
  // their tokens; otherwise the engine hash cannot be translated and the event is dropped.
  if (event.block_size != config_.block_size ||
      event.token_ids.size() != event.engine_hashes.size() * config_.block_size) {
    ++stats_.stored_events_rejected;
    return false;
  }
  std::span<const TokenId> tokens(event.token_ids);
  return storeChain(instance, stream, event.engine_hashes, event.has_parent, event.engine_parent,
                    [&](BlockHash parent, size_t i) {
                      if (i < event.extras.size()) parent = keyedParent(parent, event.extras[i]);
                      return hashBlock(parent,
                                       tokens.subspan(i * config_.block_size, config_.block_size));
                    });
}

size_t CacheIndex::streamCapacity(const InstanceState& state) const {
  return state.capacity == 0 ? config_.max_blocks_per_instance
                             : std::min(state.capacity, config_.max_blocks_per_instance);
}

void CacheIndex::setCapacity(int instance, size_t blocks) {
  if (validInstance(instance)) instances_[instance].capacity = blocks;
}

void CacheIndex::acquire(BlockHash ours, int instance) {
  HolderTable::Entry* entry = entries_.insert(ours);
  if (entries_.holds(entry, ours, instance)) {
    ++instances_[instance].extra_refs.tryEmplace(ours.value, 0).first[0];
    return;
  }
  ++stats_.exact_entries;
  entries_.add(entry, ours, instance);
}

void CacheIndex::release(BlockHash ours, int instance) {
  FlatU64Map<uint32_t>& refs = instances_[instance].extra_refs;
  if (uint32_t* extra = refs.find(ours.value)) {
    if (--*extra == 0) refs.eraseValue(extra);
    return;
  }
  clearExact(ours, instance);
}

// Maps each engine hash to our chain hash (`next(parent, i)` for block i) and records the
// instance as an exact holder.
template <class NextHash>
bool CacheIndex::storeChain(int instance, int stream, std::span<const uint64_t> engine_hashes,
                            bool has_parent, uint64_t engine_parent, NextHash next) {
  InstanceState& state = instances_[instance];
  if (state.hashes_are_ours)
    return storeOwnChain(instance, engine_hashes, has_parent, BlockHash{engine_parent}, next);
  StreamState& st = state.stream(stream);
  BlockHash parent = kRootBlockHash;
  if (has_parent) {
    const BlockHash* ours = st.engine_to_ours.find(engine_parent);
    if (ours == nullptr) {
      ++stats_.stored_events_rejected;
      return false;
    }
    parent = *ours;
  }
  const size_t capacity = streamCapacity(state);
  for (size_t i = 0; i < engine_hashes.size(); ++i) {
    prefetchAhead(st.engine_to_ours, engine_hashes, i);
    parent = next(parent, i);
    auto [mapped, inserted] = st.engine_to_ours.tryEmplace(engine_hashes[i], parent);
    if (inserted) {
      if (st.engine_to_ours.size() > capacity) {
        st.engine_to_ours.eraseValue(mapped);
        ++stats_.stored_events_rejected;
        ++stats_.over_capacity;
        return false;
      }
      acquire(parent, instance);
    } else if (*mapped != parent) {
      // The engine reused a hash for other content (its hash differs from ours in what it
      // covers); the newest mapping wins and the old block loses this reference, every copy.
      release(*mapped, instance);
      st.extra_copies.erase(engine_hashes[i]);
      *mapped = parent;
      acquire(parent, instance);
    } else {
      // The same block cached again (a second copy): it leaves only with its last copy.
      ++st.extra_copies.tryEmplace(engine_hashes[i], 0).first[0];
    }
  }
  return true;
}

// storeChain() for an instance whose engine hashes are ours: the holder table itself says what
// the instance holds exactly (where the mapped path asks its engine->ours map), with the same
// outcomes: an unknown parent or a full instance rejects the event, a held block is skipped.
template <class NextHash>
bool CacheIndex::storeOwnChain(int instance, std::span<const uint64_t> hashes, bool has_parent,
                               BlockHash parent, NextHash next) {
  // The engine's hashes are ours (setEngineHashesAreOurs): each is converted as it is checked.
  InstanceState& state = instances_[instance];
  if (!has_parent) {
    parent = kRootBlockHash;
  } else if (!entries_.holds(entries_.find(parent), parent, instance)) {
    ++stats_.stored_events_rejected;
    return false;
  }
  for (size_t i = 0; i < hashes.size(); ++i) {
    prefetchAhead(entries_, hashes, i);
    parent = next(parent, i);
    if (parent != BlockHash{hashes[i]}) {  // not our hash after all: the instance is misdeclared
      ++stats_.stored_events_rejected;
      return false;
    }
    // Below the cap the block may be added: find or insert in one probe (an inserted entry has
    // no holder, so it reads as not held); at the cap only look.
    const bool room = state.own_blocks + 1 <= config_.max_blocks_per_instance;
    HolderTable::Entry* entry = room ? entries_.insert(parent) : entries_.find(parent);
    if (entries_.holds(entry, parent, instance)) continue;
    if (!room) {
      ++stats_.stored_events_rejected;
      return false;
    }
    ++state.own_blocks;
    ++stats_.exact_entries;
    entries_.add(entry, parent, instance);
  }
  return true;
}

void CacheIndex::removeOwnBlocks(int instance, std::span<const uint64_t> hashes) {
  InstanceState& state = instances_[instance];
  for (size_t i = 0; i < hashes.size(); ++i) {
    prefetchRunAhead(entries_, hashes, i);
    const BlockHash hash{hashes[i]};
    HolderTable::Entry* entry = entries_.find(hash);
    if (!entries_.holds(entry, hash, instance)) {
      ++stats_.removed_unknown;
      continue;
    }
    --stats_.exact_entries;
    --state.own_blocks;
    entries_.remove(entry, hash, instance);
  }
}

void CacheIndex::setEngineHashesAreOurs(int instance, bool value) {
  if (!validInstance(instance)) return;
  InstanceState& state = instances_[instance];
  if (state.hashes_are_ours == value) return;
  clearInstance(instance);  // the other representation's exact entries cannot carry over
  state.hashes_are_ours = value;
}

void CacheIndex::removeBlocks(int instance, std::span<const uint64_t> engine_hashes, int stream) {
  if (!validInstance(instance) || !validStream(stream)) return;
  InstanceState& state = instances_[instance];
  if (state.hashes_are_ours) {
    removeOwnBlocks(instance, engine_hashes);
    return;
  }
  StreamState& st = state.stream(stream);
  for (size_t i = 0; i < engine_hashes.size(); ++i) {
    prefetchAhead(st.engine_to_ours, engine_hashes, i);
    BlockHash* ours = st.engine_to_ours.find(engine_hashes[i]);
    if (ours == nullptr) {
      ++stats_.removed_unknown;
      continue;
    }
    if (uint32_t* copies = st.extra_copies.find(engine_hashes[i])) {
      if (--*copies == 0) st.extra_copies.eraseValue(copies);
      continue;
    }
    release(*ours, instance);
    st.engine_to_ours.eraseValue(ours);
  }
}

void CacheIndex::clearStream(int instance, int stream) {
  if (!validInstance(instance) || !validStream(stream)) return;
  InstanceState& state = instances_[instance];
  if (static_cast<size_t>(stream) >= state.streams.size()) return;
  StreamState& st = state.streams[static_cast<size_t>(stream)];
  std::vector<BlockHash> held;
  held.reserve(st.engine_to_ours.size());
  st.engine_to_ours.forEach([&](uint64_t, BlockHash ours) { held.push_back(ours); });
  st.engine_to_ours.clear();
  st.extra_copies.clear();
  for (BlockHash ours : held) release(ours, instance);
}

void CacheIndex::clearInstance(int instance) {
  if (!validInstance(instance)) return;
  InstanceState& state = instances_[instance];
  for (StreamState& st : state.streams) {
    st.engine_to_ours.forEach([&](uint64_t, BlockHash ours) { clearExact(ours, instance); });
    st.engine_to_ours.clear();
    st.extra_copies.clear();
  }
  state.streams.resize(1);
  state.extra_refs.clear();
  // Its exact entries where no map lists them, and its soft ones.
  if (state.hashes_are_ours) {
    std::vector<BlockHash> held;
    entries_.forEach([&](BlockHash hash, HolderView holders) {
      if (holders.contains(instance)) held.push_back(hash);
    });
    for (BlockHash hash : held) clearExact(hash, instance);
  }
  soft_.clearInstance(instance);
  state.own_blocks = 0;
}

void CacheIndex::clearSoft(int instance) {
  if (validInstance(instance)) soft_.clearInstance(instance);
}

void CacheIndex::addSoft(int instance, std::span<const BlockHash> hashes, Nanos now,
                         bool approximate) {
  if (!validInstance(instance)) return;
  Nanos expiry = now + (approximate ? config_.approximate_ttl : config_.predicted_ttl);
  soft_.add(instance, hashes, expiry, approximate ? 1 : 0);
}

void CacheIndex::expire(Nanos now) { soft_.expire(now); }

void CacheIndex::clearExact(BlockHash hash, int instance) {
  HolderTable::Entry* entry = entries_.find(hash);
  if (!entries_.holds(entry, hash, instance)) return;
  --stats_.exact_entries;
  entries_.remove(entry, hash, instance);
}

void CacheIndex::matchLengths(std::span<const BlockHash> hashes, std::span<uint32_t> out) const {
  RunTracker run(out, &run_scratch_);
  SoftTree::Cursor soft(soft_);
  constexpr size_t kPrefetch = 8;
  for (size_t i = 0; i < std::min(kPrefetch, hashes.size()); ++i) entries_.prefetch(hashes[i]);
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (i + kPrefetch < hashes.size()) entries_.prefetch(hashes[i + kPrefetch]);
    const BlockHash h = hashes[i];
    if (!run.step(i, entries_, h, entries_.raw(h), soft.next(h), soft)) return;
  }
  run.finish(hashes.size());
}

void CacheIndex::hashAndMatch(std::span<const TokenId> tokens, std::vector<BlockHash>* hashes,
                              std::span<uint32_t> out) const {
  RunTracker run(out, &run_scratch_);
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
  SoftTree::Cursor soft(soft_);
  size_t i = 0;
  for (; i < blocks; ++i) {
    if (i % kStep == 0 && hashed < blocks) extend(std::min(blocks, hashed + kStep));
    if (!run.step(i, entries_, dst[i], entries_.raw(dst[i]), soft.next(dst[i]), soft)) break;
  }
  if (i == blocks) run.finish(blocks);
  hashes->resize(hashed);  // only what was hashed; completeBlockHashes() goes on from there
}

HolderSet CacheIndex::holders(std::span<const BlockHash> chain) const {
  if (chain.empty()) return {};
  SoftTree::Cursor soft(soft_);
  InstanceMask last = 0;
  for (BlockHash hash : chain) last = soft.next(hash);
  HolderSet out = entries_.getSet(chain.back());
  out |= HolderView{last, soft.listed()};
  return out;
}

HolderSet CacheIndex::exactHolders(BlockHash hash) const { return entries_.getSet(hash); }

std::optional<BlockHash> CacheIndex::ourHash(int instance, int stream, uint64_t engine_hash) const {
  if (!validInstance(instance) || !validStream(stream)) return std::nullopt;
  const InstanceState& state = instances_[instance];
  if (state.hashes_are_ours) return BlockHash{engine_hash};
  if (static_cast<size_t>(stream) >= state.streams.size()) return std::nullopt;
  const BlockHash* ours =
      state.streams[static_cast<size_t>(stream)].engine_to_ours.find(engine_hash);
  if (ours == nullptr) return std::nullopt;
  return *ours;
}

size_t CacheIndex::instanceBlocks(int instance) const {
  if (!validInstance(instance)) return 0;
  const InstanceState& state = instances_[instance];
  if (state.hashes_are_ours) return state.own_blocks;
  size_t n = 0;
  for (const StreamState& st : state.streams) n += st.engine_to_ours.size();
  return n;
}

CacheIndexStats CacheIndex::stats() const {
  CacheIndexStats s = stats_;
  s.blocks = entries_.size();
  s.soft_entries = soft_.claims();
  s.soft_blocks = soft_.blocks();
  s.soft_expired = soft_.expired();
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
      instance, 0, engine_hashes, has_parent, engine_parent,
      [&](BlockHash parent, size_t i) { return hashBlockKey(parent, block_keys[i]); });
}

bool CacheIndex::storeOwnHashes(int instance, std::span<const uint64_t> hashes, bool has_parent,
                                uint64_t parent, size_t block_size) {
  if (!validInstance(instance) || hashes.empty()) return false;
  if (block_size != config_.block_size || !instances_[instance].hashes_are_ours) {
    ++stats_.stored_events_rejected;
    return false;
  }
  return storeOwnChain(instance, hashes, has_parent, BlockHash{parent},
                       [&](BlockHash, size_t i) { return BlockHash{hashes[i]}; });
}

}  // namespace kvf::policy
