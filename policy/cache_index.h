// The cache index: which instances hold which blocks, keyed by our chained BlockHash. Exact
// holders (from KV events: engine hash -> our hash through BlockStored token ids, so
// BlockRemoved resolves; no map for a simulator's engine that hashes as we do) are a holder set
// per block (up to kMaxInstances instances: a word below 63, a list past it) in a HolderTable. Soft
// holders are what the router routed: short-TTL predicted entries for instances with events, which
// the engine's BlockStored makes exact meanwhile, and approximate entries (with a longer expiry)
// for instances without events; they are claims on routed prompts' chains in a SoftTree. A match
// counts both. Pure and deterministic: time comes in as arguments. Single-threaded: the owner
// serialises every call.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "common/clock.h"
#include "common/flat_u64_map.h"
#include "policy/block_hash.h"
#include "policy/holder_set.h"
#include "policy/holder_table.h"
#include "policy/soft_tree.h"

namespace kvf::policy {

struct CacheIndexConfig {
  size_t block_size = kDefaultBlockSize;
  Nanos predicted_ttl = 30 * kNanosPerSecond;     // routed, awaiting the engine's event
  Nanos approximate_ttl = 300 * kNanosPerSecond;  // routed to an instance without events
  size_t max_blocks_per_instance = 8u << 20;      // exact entries; further stores are dropped
  // Distinct blocks with a soft holder (predicted or approximate); a routed chain past the bound
  // is recorded only as far as it fits.
  size_t max_soft_entries = 16u << 20;
  // The holder table (exact holders) doubles once more than this fraction of its 16-byte slots
  // would be used (rounded to eighths, 0.125-0.75): 64-128 bytes per block at 0.25, half that
  // at 0.5 (docs/policies.md; measured in docs/notes/2026-11-22-simulator-memory-bound.md).
  double table_max_load = 0.25;
};

// One decoded BlockStored event, engine hashes already reduced to 64 bits.
struct StoredBlocks {
  std::vector<uint64_t> engine_hashes;
  bool has_parent = false;
  uint64_t engine_parent = 0;
  std::vector<TokenId> token_ids;  // all tokens of the blocks, concatenated
  size_t block_size = 0;
  // Per block, the digest of what the engine folded into its hash besides the tokens (LoRA
  // name, salt, multimodal items; keyedParent()); 0 or past the end: none.
  std::vector<uint64_t> extras;
};

// An engine publishes one event stream per data-parallel rank, each with its own cache; a
// stream of an instance is its rank. Entries are counted per (instance, stream, engine hash)
// copy, so one stream's removal or reset never erases what another still holds.
inline constexpr int kMaxStreams = 64;

struct CacheIndexStats {
  uint64_t blocks = 0;                  // distinct block hashes with an exact holder
  uint64_t exact_entries = 0;           // (block, instance) pairs from events
  uint64_t soft_entries = 0;            // (block, instance) pairs routed, not expired
  uint64_t soft_blocks = 0;             // distinct blocks with a soft holder
  uint64_t stored_events_rejected = 0;  // unknown parent, size mismatch, over capacity
  uint64_t removed_unknown = 0;         // BlockRemoved for a hash never stored
  uint64_t over_capacity = 0;           // stores rejected by an instance's declared capacity
  uint64_t soft_expired = 0;            // (block, instance) pairs
};

class CacheIndex {
 public:
  explicit CacheIndex(CacheIndexConfig config = {});

  const CacheIndexConfig& config() const { return config_; }

  // Exact events for `instance`. storeBlocks returns false (and counts it) when the event
  // cannot be mapped to our hashes: parent never seen, block size or token count mismatch.
  // `stream` is the engine's data-parallel rank (0 when it has one). A hash stored twice (vLLM
  // can cache one hash in two blocks) needs two removals.
  bool storeBlocks(int instance, const StoredBlocks& event, int stream = 0);
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
  void removeBlocks(int instance, std::span<const uint64_t> engine_hashes, int stream = 0);
  // AllBlocksCleared, restart or removal of an instance: drops every entry it holds.
  void clearInstance(int instance);
  // The same for one stream (one data-parallel rank) of an instance; its other streams keep
  // theirs (a block they also hold stays held).
  void clearStream(int instance, int stream);
  // Drops the instance's soft (routed) entries only: its engine said it holds nothing
  // (AllBlocksCleared), so what was routed to it before cannot be there either.
  void clearSoft(int instance);
  // Bounds what one stream of `instance` may hold exactly: its engine's KV capacity in blocks
  // (0: only config().max_blocks_per_instance). A store past it is rejected and counted.
  void setCapacity(int instance, size_t blocks);
  // Declares that `instance`'s engine hashes token-free blocks with our hashBlockKey chained
  // from kRootBlockHash (a simulator's engine given it as its keyed hasher), so its engine
  // hashes are our hashes and no engine->ours map is kept: each stored block is checked
  // (hashBlockKey(parent, key) must equal the engine's hash, else the event is rejected) and
  // removals name our hashes. Entries and statistics are those of the mapped path. Live
  // engines never get this: they hash with their own function. Call while the instance holds
  // no exact entry (before its first event, or after clearInstance).
  void setEngineHashesAreOurs(int instance, bool value);

  // Routing-time entries for `instance` covering `hashes` (a prompt's block chain from its first
  // block), expiring at now + ttl (predicted when `approximate` is false, else approximate).
  // Refreshes existing soft entries (the later expiry wins). A predicted entry stays until its
  // TTL even where an event has made the block exact meanwhile (a match counts the instance
  // once either way): the soft entries are kept per routed chain, not per block, so a
  // BlockRemoved within the TTL does not withdraw the routed claim.
  void addSoft(int instance, std::span<const BlockHash> hashes, Nanos now, bool approximate);
  // Drops soft entries whose time has come. Call before matching.
  void expire(Nanos now);

  // For each instance i < out.size() (at most kMaxInstances count): the number of leading
  // blocks of `hashes` it holds (exact or soft). Cost: one lookup per block until no instance
  // continues the run, plus, past 63 instances, the listed holders still running.
  void matchLengths(std::span<const BlockHash> hashes, std::span<uint32_t> out) const;
  // The same for a token-id prompt whose hashes are not known yet: hashes its blocks (chained
  // from kRootBlockHash, `config().block_size` tokens each) only as far as the match needs,
  // a few blocks ahead of the lookups. `hashes` is cleared and receives a prefix of the
  // prompt's block hashes; finish them with hashTokenBlocks(..., parent = hashes->back()), or
  // completeBlockHashes(), before writing soft entries.
  void hashAndMatch(std::span<const TokenId> tokens, std::vector<BlockHash>* hashes,
                    std::span<uint32_t> out) const;
  // Holders (exact | soft) of the last block of `chain`, a prompt's hashes from its first
  // block (soft entries are placed by their chain); empty for an empty chain.
  HolderSet holders(std::span<const BlockHash> chain) const;
  HolderSet exactHolders(BlockHash hash) const;

  // Our hash of a block `instance`'s stream holds exactly under `engine_hash` (the engine's
  // hash itself for an instance declared with setEngineHashesAreOurs, held or not); nullopt
  // when the stream holds none.
  std::optional<BlockHash> ourHash(int instance, int stream, uint64_t engine_hash) const;

  size_t instanceBlocks(int instance) const;
  CacheIndexStats stats() const;

 private:
  struct StreamState {
    FlatU64Map<BlockHash> engine_to_ours;
    // Engine hashes cached more than once: the copies beyond the first (sparse).
    FlatU64Map<uint32_t> extra_copies;
  };
  struct InstanceState {
    std::vector<StreamState> streams = std::vector<StreamState>(1);
    // Our hashes that more than one (stream, engine hash) maps to: references beyond the first
    // (sparse). The holder bit stays until the last reference goes.
    FlatU64Map<uint32_t> extra_refs;
    size_t capacity = 0;
    bool hashes_are_ours = false;
    size_t own_blocks = 0;  // exact entries while hashes_are_ours (no map to count)
    StreamState& stream(int s) {
      if (static_cast<size_t>(s) >= streams.size()) streams.resize(static_cast<size_t>(s) + 1);
      return streams[static_cast<size_t>(s)];
    }
  };

  void clearExact(BlockHash hash, int instance);
  // One more (stream, engine hash) now maps to `ours` on `instance` / one fewer.
  void acquire(BlockHash ours, int instance);
  void release(BlockHash ours, int instance);
  size_t streamCapacity(const InstanceState& state) const;
  template <class NextHash>
  bool storeOwnChain(int instance, std::span<const uint64_t> hashes, bool has_parent,
                     BlockHash parent, NextHash next);
  void removeOwnBlocks(int instance, std::span<const uint64_t> hashes);
  template <class NextHash>
  bool storeChain(int instance, int stream, std::span<const uint64_t> engine_hashes,
                  bool has_parent, uint64_t engine_parent, NextHash next);

  CacheIndexConfig config_;
  // Exact holders per block. Block hashes are already uniform 64-bit values: the table places
  // them with one multiply by a per-process odd salt, which also keeps crafted prompts from
  // aiming at one probe sequence (our hash is public).
  HolderTable entries_;
  std::vector<InstanceState> instances_;
  SoftTree soft_;
  CacheIndexStats stats_;
  // Listed instances still running during a match (past 63 instances); reserved once, so a
  // match allocates nothing.
  mutable std::vector<ListedInstance> run_scratch_;
};

}  // namespace kvf::policy
