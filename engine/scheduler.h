// Continuous-batching scheduler with vLLM v1 semantics, clock-agnostic: step(now) picks the
// batch (running decodes first, then chunked prefill of running requests, then FCFS admission
// of waiting requests while the token budget, max_num_seqs and free blocks last; preemption by
// recompute when a running request cannot get a block), advances every scheduled request,
// caches newly full blocks (BlockStored via the sink) and returns what happened with the step
// duration from the timing model. Owned by one thread (the live loop or a simulator).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "engine/kv_pool.h"
#include "engine/queued_prefetch.h"
#include "engine/request.h"
#include "engine/timing_model.h"
#include "worker/kv_events.h"
#include "worker/lease_table.h"

namespace kvf::engine {

// How token-free blocks (PromptBlocks) are hashed: by default hashBlockKey(hash_seed, parent,
// key) chained from 0; a simulator may supply its router index's function and root instead, so
// the engine's hashes are the index's own (policy::CacheIndex::setEngineHashesAreOurs) and the
// index keeps no engine->ours map. Only the hash values change, not what is cached. The function
// works on raw 64-bit values; its results become the engine's BlockHash.
struct KeyedBlockHasher {
  uint64_t (*hash)(uint64_t parent, uint64_t key) = nullptr;
  uint64_t root = 0;
};

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 8192;
  int max_num_seqs = 256;
  bool enable_chunked_prefill = true;
  int64_t long_prefill_token_threshold = 0;  // per-request chunk cap; 0 = none
  int64_t vocab_size = 151936;
  int64_t eos_token_id = -1;               // -1: the profile's (set by finalizeEngineConfig)
  uint64_t hash_seed = 0x6b7666656e67ULL;  // engine-specific block-hash seed
  // When a request onboarding from the lower tiers may run (EngineCore applies it): after the
  // whole onboard (vLLM's OffloadingConnector) or once the first layer's share is in.
  OnboardMode onboard = OnboardMode::kWhole;
  // Not from YAML here: EngineCore takes it from `tiers.prefetch` (queued-time promotion).
  worker::TierPrefetchOptions prefetch{.mode = worker::PrefetchMode::kAdmission};
  KeyedBlockHasher keyed_hasher;  // not from YAML: set by a simulator
  // Not from YAML: false leaves RequestOutput::id empty, for a driver that finds its requests by
  // RequestSpec::tag (a simulator: a copy of the id string per output per step saved).
  bool output_ids = true;
};

// A KV event sink that also takes the stores of token-free requests (PromptBlocks): their
// BlockStored has no token_ids, so the content key of each block comes alongside (one per
// block hash, in order). Needed by whoever maps engine hashes to its own (a router index).
class KeyedKvEventSink : public worker::KvEventSink {
 public:
  virtual void onBlockStoredKeys(worker::BlockStored event, std::vector<uint64_t> block_keys) = 0;
  // False: this sink takes the block hashes alone (its reader trusts them, e.g. a simulator's
  // index whose engines hash as it does), and block_keys comes empty.
  virtual bool wantsBlockKeys() const { return true; }
};

// One request's progress in a step.
struct RequestOutput {
  // User-provided, so emplace_back() does not zero the whole object before constructing it
  // (a rep stos per output per step was a third of step()'s time in a simulator).
  RequestOutput() {}
  std::string id;
  uint64_t tag = 0;                            // RequestSpec::tag
  absl::InlinedVector<TokenId, 1> new_tokens;  // generated this step (0 or 1)
  std::optional<FinishReason> finish;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // prefix-cache hit at first admission
  int64_t output_tokens = 0;  // generated so far
  Nanos arrival_time = 0;
  Nanos first_token_time = -1;
  int num_preemptions = 0;
  int64_t remote_kv_tokens = 0;  // of cached_tokens, those pushed by a peer
  int64_t tier_tokens = 0;       // of cached_tokens, those onboarded from host memory or disk
  int64_t tier_disk_tokens = 0;  // of tier_tokens, those read from disk
  // Set on the finishing output of a remote-decode request: the pinned prompt blocks.
  std::optional<std::string> lease_id;
  std::vector<BlockHash> lease_block_hashes;
  std::vector<BlockIndex> lease_blocks;  // where they are (a NIXL reader's remote_block_ids)
};

// A request admitted with RemoteKvSpec whose peer must fill `blocks` (in order) with the KV of
// `hashes`; the driver then calls completeRemoteKv / failRemoteKv.
struct RemoteKvFetch {
  std::string id;
  std::string source;
  std::vector<BlockHash> hashes;
  std::vector<BlockIndex> blocks;  // landing blocks (KvPool indices), one per hash
  int64_t local_hit_tokens = 0;
  int64_t remaining_tokens = 0;  // prompt tokens left to compute if every block arrives
};

// A request admitted with a prefix beyond its G1 hit held in the lower tiers: `blocks` (pool
// indices, one per hash, in order) wait for the tiers' copies; the driver (EngineCore) then calls
// completeRemoteKv / failRemoteKv as for a peer's fetch.
struct TierOnboardStart {
  std::string id;
  std::vector<BlockHash> hashes;
  std::vector<BlockIndex> blocks;
  size_t host_blocks = 0;  // of them, held in host memory (the rest on disk)
  size_t disk_blocks = 0;
};

struct StepResult {
  Nanos start = 0;
  Nanos duration = 0;  // from the timing model; the step's outputs exist at start + duration
  int64_t num_scheduled_tokens = 0;
  int num_prefill_requests = 0;  // requests that computed prompt (or recompute) tokens
  int num_decode_requests = 0;
  int num_preempted = 0;
  std::vector<RequestOutput> outputs;  // every scheduled request plus preempted/finished ones
  // Fetches started by this step's admission (also when nothing was scheduled: check this
  // before treating an empty() step as idle).
  std::vector<RemoteKvFetch> remote_kv_fetches;
  // Onboards from the lower tiers started by this step's admission (EngineCore runs them).
  std::vector<TierOnboardStart> tier_onboards;
  bool empty() const { return num_scheduled_tokens == 0; }
};

struct SchedulerStats {
  int num_running = 0;
  int num_waiting = 0;
  uint64_t prefix_cache_queries = 0;  // tokens looked up at admission
  uint64_t prefix_cache_hits = 0;     // tokens found
  uint64_t num_preemptions = 0;
  uint64_t prompt_tokens = 0;      // prompt tokens of admitted requests (first admission)
  uint64_t generation_tokens = 0;  // tokens generated
  int num_waiting_for_remote_kv = 0;
  uint64_t remote_kv_fetches = 0;             // fetches started
  uint64_t remote_kv_failures = 0;            // fetches failed (fallback to local prefill)
  uint64_t remote_kv_tokens = 0;              // tokens filled by peers
  uint64_t remote_kv_blocks_quarantined = 0;  // landing blocks held now until no write can land
  int num_leases = 0;
  uint64_t leases_expired = 0;
  uint64_t tier_onboards = 0;          // onboards from the lower tiers started
  uint64_t tier_onboard_failures = 0;  // ... that delivered no block (recomputed)
  uint64_t tier_host_tokens = 0;       // prompt tokens onboarded from host memory
  uint64_t tier_disk_tokens = 0;       // ... from disk
  PrefetchStats prefetch;              // queued-time promotions (statsNow() only)
};

class Scheduler {
 public:
  // `pool` and `timing` must outlive the scheduler; `sink` (may be null) gets BlockStored
  // (a KeyedKvEventSink also gets those of token-free requests with their keys).
  Scheduler(SchedulerConfig config, KvPool* pool, const TimingModel* timing,
            worker::KvEventSink* sink);
  ~Scheduler();

  // Queues a request (id must be unique among live requests, prompt non-empty).
  absl::Status add(RequestSpec spec, Nanos now);
  // Removes a live request and frees its blocks; false if unknown (already finished).
  bool abort(const std::string& id);
  // Runs one step at time `now`; an empty result (no work schedulable) has duration 0.
  StepResult step(Nanos now);
  // The same, overwriting `*result` (its vectors keep their capacity).
  void step(Nanos now, StepResult* result);

  // Requests waiting for remote KV do not count: they need the driver, not a step.
  bool hasWork() const { return !running_.empty() || !waiting_.empty(); }
  int numWaiting() const { return static_cast<int>(waiting_.size()); }

  // KV push, receiver side (see engine_core.h for the protocol).
  absl::Status completeRemoteKv(const std::string& id, size_t blocks_filled, Nanos now,
                                Nanos kv_ready_at = -1);
  absl::Status failRemoteKv(const std::string& id, Nanos now, bool writes_may_arrive);
  bool releaseRemoteKvLanding(const std::string& id);
  // Remote decode leases.
  bool releaseLease(const std::string& lease_id);
  // Hands lease `lease_id` over with its pins (the caller unpins them later); nullopt if none.
  std::optional<worker::Lease> detachLease(const std::string& lease_id);
  int expireLeases(Nanos now);
  std::optional<Nanos> nextLeaseExpiry() const;
  const SchedulerStats& stats() const { return stats_; }
  SchedulerStats statsNow() const;
  const SchedulerConfig& config() const { return config_; }

 private:
  struct Scheduled {
    Request* request;
    int64_t num_tokens;
  };
  // x / the pool's block size, for x >= 0: a shift when the block size is a power of two (the
  // usual case). Every scheduled request divides by it each step, and a 64-bit division is tens
  // of cycles of latency on the step's critical path.
  int64_t divBlocks(int64_t x) const {
    return block_shift_ >= 0 ? (x >> block_shift_) : x / pool_->blockSize();
  }
  void prefetchRunning() const;
  void ensureHashes(Request& r);
  // Token-free requests: the content key of full block i (prompt or generated).
  uint64_t blockKey(const Request& r, size_t i) const;
  int64_t chunkLimit(int64_t budget) const;
  // Reserves blocks so `r` can hold num_computed + cached + n tokens; false if not enough free.
  // The first `watched` blocks of `cached` are r's intact prefix watch (KvPool counts them).
  bool allocateSlots(Request& r, int64_t n, std::span<const BlockIndex> cached, size_t watched = 0);
  void preempt(Request& r, std::vector<Scheduled>& scheduled, int64_t& budget);
  void scheduleRunning(std::vector<Scheduled>& scheduled, int64_t& budget, int& preempted,
                       StepResult& result);
  void admitWaiting(std::vector<Scheduled>& scheduled, int64_t& budget, StepResult& result);
  // Requests back from an onboard or a remote-KV fetch wait in the queue holding their blocks.
  // With nothing running nothing else frees a block, so a head that cannot get its blocks
  // would wait forever: the requests behind it give theirs back (counted as preemptions) and
  // the head tries again. Returns whether any did.
  bool releaseWaitingHolds();
  // Gives r's blocks back to the pool (tail first, so it is evicted first) and forgets what was
  // computed in them: preemption, a failed fetch, a hold released.
  void releaseBlocks(Request& r);
  // The part of the remote spec worth fetching after `local` cached blocks (scheduler_remote.cc).
  std::vector<BlockHash> remoteRun(const Request& r, size_t local, size_t max_blocks) const;
  // Holds `cached`, allocates landing blocks for `run` and sets r aside waiting for them; false
  // (no change) if blocks are short.
  bool holdLanding(Request& r, std::span<const BlockIndex> cached, std::vector<BlockHash> run);
  bool startRemoteKv(Request& r, std::span<const BlockIndex> cached, std::vector<BlockHash> run,
                     StepResult& result);
  // The lower tiers' run past `cached` (of `lookup`): landing blocks and an onboard in `result`.
  // nullopt: nothing held below; false: held, but blocks are short (r waits).
  std::optional<bool> startOnboard(Request& r, std::span<const BlockIndex> cached,
                                   std::span<const BlockHash> lookup, StepResult& result);
  // The lower tiers' run of `hashes` at `now`: a block whose queued promotion is not done yet
  // counts as on disk.
  TierRun tierRun(LowerTiers& tiers, std::span<const BlockHash> hashes, Nanos now);
  // Queued-time prefetch of r's prefix past its G1 hit (r just joined the queue behind others).
  void prefetchQueued(Request& r, Nanos now);
  // r leaves the queue: the blocks promoted for it no longer wait on it.
  void releasePrefetch(Request& r) {
    if (prefetch_ != nullptr && !r.promoted.empty()) prefetch_->release(&r.promoted);
  }
  // Counts an onboard's landed blocks per tier (stats, the request's tier_tokens).
  void countOnboarded(Request& r, size_t blocks_filled);
  void takeLease(Request& r, Nanos now);
  void cacheFullBlocks(Request& r);
  // The token generated at `end` (appended to r.output; finishes r when due).
  TokenId sampleToken(Request& r, Nanos end);
  void finish(Request& r, FinishReason reason, Nanos now);
  void fillOutput(const Request& r, RequestOutput& out) const;
  // The waiting head's lookup result for its next lookup (watched in the pool), or none; the
  // first `watched` blocks are still under r's watch.
  void keepPrefixHint(Request& r, std::vector<BlockIndex> blocks, size_t watched);

  SchedulerConfig config_;
  KvPool* pool_;
  int block_shift_ = -1;  // log2 of the pool's block size when a power of two, else -1
  const TimingModel* timing_;
  worker::KvEventSink* sink_;
  KeyedKvEventSink* keyed_sink_;  // sink_ when it takes keys, else null
  absl::flat_hash_map<std::string, std::unique_ptr<Request>> requests_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;  // admission order; the last is preempted first
  absl::flat_hash_map<std::string, Request*> remote_waiting_;
  // Landing blocks of fetches that gave up while a peer may still write into them.
  absl::flat_hash_map<std::string, std::vector<BlockIndex>> quarantine_;
  worker::LeaseTable leases_;
  std::unique_ptr<QueuedPrefetch> prefetch_;  // tiers.prefetch.mode: queued, with tiers only
  uint64_t next_arrival_seq_ = 0;
  // Per-step scratch (capacity kept across steps).
  std::vector<Scheduled> scheduled_;
  std::vector<Request*> order_;
  std::vector<BatchEntry> batch_;
  std::vector<Request*> done_;
  SchedulerStats stats_;
};

}  // namespace kvf::engine
