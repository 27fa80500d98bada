// The cache index: which instances hold which blocks, keyed by our chained BlockHash, with an
// instance bitmask per block (up to kMaxInstances instances) in a flat BlockTable. Fed by exact KV
// events (engine hash -> our hash through BlockStored token ids, so BlockRemoved resolves; no
// map for a simulator's engine that hashes as we do), by short-TTL predicted entries written
// at routing time until an event confirms them, and by approximate entries (what was routed,
// with expiry) for instances without events. Pure and deterministic: time comes in as
// arguments. Single-threaded: the owner serialises every call.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/clock.h"
#include "common/flat_u64_map.h"
#include "policy/block_hash.h"
#include "policy/block_table.h"

namespace kvf::policy {

inline constexpr int kMaxInstances = 64;

struct CacheIndexConfig {
  size_t block_size = kDefaultBlockSize;
  Nanos predicted_ttl = 30 * kNanosPerSecond;     // routed, awaiting the engine's event
  Nanos approximate_ttl = 300 * kNanosPerSecond;  // routed to an instance without events
  size_t max_blocks_per_instance = 8u << 20;      // exact entries; further stores are dropped
  size_t max_soft_entries = 16u << 20;            // predicted + approximate (hash, instance)
  // The block table doubles once more than this fraction of its 32-byte slots would be used
  // (rounded to eighths, 0.125-0.75): 128-256 bytes per block at 0.25, half that at 0.5. A
  // quarter-full table has shorter probe runs: the simulator's whole Mooncake arm ran ~12%
  // faster and the 32k-token hash + match + decide ~13% faster than at half
  // (docs/benchmarks.md).
  double table_max_load = 0.25;
};

// One decoded BlockStored event, engine hashes already reduced to 64 bits.
struct StoredBlocks {
  std::vector<uint64_t> engine_hashes;
  bool has_parent = false;
  uint64_t engine_parent = 0;
  std::vector<TokenId> token_ids;  // all tokens of the blocks, concatenated
  size_t block_size = 0;
};

struct CacheIndexStats {
  uint64_t blocks = 0;                  // distinct block hashes with any holder
  uint64_t exact_entries = 0;           // (block, instance) pairs from events
  uint64_t soft_entries = 0;            // predicted + approximate pairs
  uint64_t stored_events_rejected = 0;  // unknown parent, size mismatch, over capacity
  uint64_t removed_unknown = 0;         // BlockRemoved for a hash never stored
  uint64_t soft_expired = 0;
  uint64_t soft_confirmed = 0;  // predicted entries confirmed by a BlockStored
};

class CacheIndex {
 public:
  explicit CacheIndex(CacheIndexConfig config = {});

  const CacheIndexConfig& config() const { return config_; }

  // Exact events for `instance`. storeBlocks returns false (and counts it) when the event
  // cannot be mapped to our hashes: parent never seen, block size or token count mismatch.
  bool storeBlocks(int instance, const StoredBlocks& event);
  // The same for a token-free BlockStored (a simulator's engine, engine::KeyedKvEventSink):
  // our hash of block i is hashBlockKey(parent, block_keys[i]); no token is hashed.
  bool storeKeyedBlocks(int instance, std::span<const uint64_t> engine_hashes, bool has_parent,
                        uint64_t engine_parent, std::span<const uint64_t> block_keys,
                        size_t block_size);
  // The same for an instance declared with setEngineHashesAreOurs whose engine runs in this
  // process and chains its hashes with hashBlockKey from kRootBlockHash by construction (a
  // simulator's engine): its hashes are taken as ours without deriving each one again from its
  // content key. Rejected like storeKeyedBlocks: another block size, an instance not declared,
  // a parent the instance does not hold, a full instance.
  bool storeOwnHashes(int instance, std::span<const uint64_t> hashes, bool has_parent,
                      uint64_t parent, size_t block_size);
  void removeBlocks(int instance, std::span<const uint64_t> engine_hashes);
  // AllBlocksCleared, restart or removal of an instance: drops every entry it holds.
  void clearInstance(int instance);
  // Declares that `instance`'s engine hashes token-free blocks with our hashBlockKey chained
  // from kRootBlockHash (a simulator's engine given it as its keyed hasher), so its engine
  // hashes are our hashes and no engine->ours map is kept: each stored block is checked
  // (hashBlockKey(parent, key) must equal the engine's hash, else the event is rejected) and
  // removals name our hashes. Entries and statistics are those of the mapped path. Live
  // engines never get this: they hash with their own function. Call while the instance holds
  // no exact entry (before its first event, or after clearInstance).
  void setEngineHashesAreOurs(int instance, bool value);

  // Routing-time entries for `instance` covering `hashes`, expiring at now + ttl (predicted
  // when `approximate` is false, else approximate). Refreshes existing soft entries.
  void addSoft(int instance, std::span<const BlockHash> hashes, Nanos now, bool approximate);
  // Drops soft entries whose time has come. Call before matching.
  void expire(Nanos now);

  // For each instance i < out.size(): the number of leading blocks of `hashes` it holds
  // (exact or soft). Cost: one lookup per block until no instance continues the run.
  void matchLengths(std::span<const BlockHash> hashes, std::span<uint32_t> out) const;
  // The same for a token-id prompt whose hashes are not known yet: hashes its blocks (chained
  // from kRootBlockHash, `config().block_size` tokens each) only as far as the match needs,
  // a few blocks ahead of the lookups. `hashes` is cleared and receives a prefix of the
  // prompt's block hashes; finish them with hashTokenBlocks(..., parent = hashes->back()), or
  // completeBlockHashes(), before writing soft entries.
  void hashAndMatch(std::span<const TokenId> tokens, std::vector<BlockHash>* hashes,
                    std::span<uint32_t> out) const;
  // Holders of one block (exact | soft).
  InstanceMask holders(BlockHash hash) const;
  InstanceMask exactHolders(BlockHash hash) const;

  size_t instanceBlocks(int instance) const;
  CacheIndexStats stats() const;

 private:
  struct SoftKey {
    BlockHash hash;
    int instance;
    bool operator==(const SoftKey&) const = default;
    template <class H>
    friend H AbslHashValue(H h, const SoftKey& k) {
      return H::combine(std::move(h), k.hash, k.instance);
    }
  };
  // A queued soft entry. Killed (live = false) when the entry is confirmed, refreshed or
  // cleared, so expire() pops it without a table probe.
  struct SoftRecord {
    Nanos expiry;
    BlockHash hash;
    int32_t instance;
    bool live;
  };
  // Records in expiry order (each queue has one TTL). A record's id is its sequence number in
  // its queue (counted from the first record ever pushed) times 2, plus 1 in the approximate
  // queue: what a soft entry's slot (or soft_record_) names. A ring of a power-of-two size, grown
  // by doubling when full, indexed by sequence number: pushes, pops and lookups by id are a mask
  // on one array.
  class SoftQueue {
   public:
    bool empty() const { return head_ == tail_; }
    size_t size() const { return static_cast<size_t>(tail_ - head_); }
    uint64_t nextSeq() const { return tail_; }
    SoftRecord& front() { return ring_[head_ & mask_]; }
    // The record `ahead` places after the front (ahead < size()).
    const SoftRecord& at(size_t ahead) const { return ring_[(head_ + ahead) & mask_]; }
    // The record of sequence number seq, if still queued.
    SoftRecord* find(uint64_t seq) {
      return seq >= head_ && seq < tail_ ? &ring_[seq & mask_] : nullptr;
    }
    void pop() { ++head_; }
    void push(const SoftRecord& r) {
      if (size() == ring_.size()) grow();
      ring_[tail_++ & mask_] = r;
    }

   private:
    void grow() {
      std::vector<SoftRecord> bigger(std::max<size_t>(1024, 2 * ring_.size()));
      const uint64_t mask = bigger.size() - 1;
      for (uint64_t seq = head_; seq < tail_; ++seq) bigger[seq & mask] = ring_[seq & mask_];
      ring_ = std::move(bigger);
      mask_ = mask;
    }
    std::vector<SoftRecord> ring_;
    uint64_t mask_ = 0;
    uint64_t head_ = 0;  // sequence number of the front record
    uint64_t tail_ = 0;  // sequence number of the next record pushed
  };
  struct InstanceState {
    FlatU64Map<BlockHash> engine_to_ours;
    bool hashes_are_ours = false;
    size_t own_blocks = 0;  // exact entries while hashes_are_ours (no map to count)
  };

  static constexpr int64_t kRecordInMap = std::numeric_limits<int64_t>::min();
  void clearExact(BlockHash hash, int instance);
  void markExact(BlockHash hash, BlockTable::Entry* entry, int instance);
  void setSoftRecord(BlockHash hash, BlockTable::Entry* entry, int instance, bool fresh,
                     int64_t record);
  int64_t softRecord(BlockHash hash, const BlockTable::Entry& entry, int instance) const;
  void killRecord(int64_t record);
  void unsetSoft(BlockHash hash, BlockTable::Entry* entry, int instance);
  template <class NextHash>
  bool storeOwnChain(int instance, std::span<const uint64_t> hashes, bool has_parent,
                     BlockHash parent, NextHash next);
  void removeOwnBlocks(int instance, std::span<const uint64_t> hashes);
  template <class NextHash>
  bool storeChain(int instance, std::span<const uint64_t> engine_hashes, bool has_parent,
                  uint64_t engine_parent, NextHash next);

  CacheIndexConfig config_;
  // Holders (exact | soft) per block, and which of them are soft. An instance holds a block
  // either exactly (from events) or softly (routed), never both: a confirming event clears
  // the soft bit. Block hashes are already uniform 64-bit values: the table places them with
  // one multiply by a per-process odd salt, which also keeps crafted prompts from aiming at one
  // probe sequence (our hash is public).
  BlockTable entries_;
  std::vector<InstanceState> instances_;
  // The queued record of each soft (block, instance) (every other record of it is dead): in
  // the block's entry (BlockTable::Entry::soft_record holds the record id) while the block has
  // a single soft holder, and here for blocks with several (the entry then holds kRecordInMap).
  absl::flat_hash_map<SoftKey, int64_t> soft_record_;
  SoftQueue predicted_queue_;
  SoftQueue approximate_queue_;
  CacheIndexStats stats_;
  std::vector<TokenId> scratch_;
};

}  // namespace kvf::policy
