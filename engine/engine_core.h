// The clock-agnostic engine core: KV pool, timing model and scheduler wired together from an
// EngineConfig, plus request validation (vocabulary, max_model_len). The live server drives it
// with Asio timers; a discrete-event simulator can drive it in virtual time and capture KV
// events with any KvEventSink. No I/O; owned and called by one thread.
//
// KV push, receiver side (the live server and a simulator drive it alike):
//   1. add() a RequestSpec with remote_kv = {source, block_hashes} (block_hashes empty: the
//      prompt's own). At admission the core counts local prefix hits first; the part of the
//      source's run beyond them (equal to the prompt's own hashes, at most (prompt-1)/block_size
//      blocks in all) gets landing blocks, and the request waits aside in kWaitingForRemoteKv:
//      it holds its blocks but does not block admission of later requests, does not count in
//      hasWork(), and appears in that step's StepResult::remote_kv_fetches (id, source, hashes,
//      landing block indices; payload address = pool().payload(block)). With nothing to fetch
//      (all local, or nothing matching) it is admitted as usual.
//   2. The driver moves the blocks (or, in a simulator, lets transferDuration(tokens) pass) and
//      calls exactly one of:
//      completeRemoteKv(id, n, now): the first n landing blocks hold verified KV and nothing
//        can be written into the others any more; the n blocks become cached (BlockStored is
//        emitted), the rest go back to the pool, and the request re-enters the head of the
//        waiting queue with prefill covering only what is still missing. cached_tokens counts
//        local hits + pushed tokens; RequestOutput::remote_kv_tokens the pushed part.
//        Layer-wise push (optional kv_ready_at > now): the driver completes as soon as the
//        data is usable layer by layer; the blocks' KV is fully there at kv_ready_at, so the
//        first step computing the request ends no earlier than kv_ready_at + step / num_layers
//        (the last layer's compute after the last layer's KV). Without it (the default, -1)
//        call complete only once the whole transfer is over, e.g. at start + transferDuration.
//      failRemoteKv(id, now, writes_may_arrive): fallback to local prefill (local hits are
//        looked up again). If writes_may_arrive, the landing blocks stay quarantined (held,
//        never reused) until releaseRemoteKvLanding(id).
//   3. Once the transport says no write can land any more (notice, sender dead), the driver
//      calls releaseRemoteKvLanding(id) (a no-op when nothing is quarantined). abort() of a
//      waiting request quarantines its landing blocks the same way.
//   Call hasWork()/step() again after complete/fail: the request is runnable again.
//
// Remote decode (prefill offload, P side): RequestSpec::remote_decode_lease. When such a request
// finishes, the leading cached run of its prompt's full blocks is pinned under a lease (id = the
// request id, reported in the finishing RequestOutput with the hashes) until releaseLease(id) or
// expiry (step() expires due leases; so does expireLeases(now); nextLeaseExpiry() says when), or
// until detachLease(id) hands it, pins and all, to its new keeper (the live engine's worker
// agent, right after the step that finished the request).
//
// KV tiers (optional, EngineCore::create's `tiers`): the pool offloads every cached block it
// evicts; admission looks up the prefix past the G1 hit below and the request waits aside
// (kWaitingForRemoteKv, not in hasWork()) while the core onboards it. The onboard is ready at its
// start + TimingModel::onboardReadyDuration of the config's scheduler.onboard mode (kWhole: the
// whole onboard, swap-in finishes before the step that needs it; kLayerwise: its first layer,
// and the first step computing the request then ends no earlier than the whole onboard plus one
// layer's share of the step) and once the tiers' copies are done; step() then completes it with
// the leading blocks that arrived intact (a block that failed its check and everything after it
// is recomputed). A driver with no other work steps again at nextOnboardReady().
//
// KV push, holder side: pinLeadingRun() / unpin() keep blocks from eviction during a push
// without involving the scheduler.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/engine_config.h"
#include "engine/kv_pool.h"
#include "engine/lower_tiers.h"
#include "engine/scheduler.h"
#include "engine/timing_model.h"
#include "worker/kv_events.h"

namespace kvf::engine {

class EngineCore {
 public:
  // `sink` (may be null) receives BlockStored / BlockRemoved; it must outlive the core.
  // `tiers` (may be null: no tiers below the pool) is owned by the core. `memory` (may be null:
  // host memory) holds the pool's payloads (cache.payload_memory: device).
  static absl::StatusOr<std::unique_ptr<EngineCore>> create(
      const EngineConfig& config, worker::KvEventSink* sink,
      std::unique_ptr<LowerTiers> tiers = nullptr, std::shared_ptr<PayloadMemory> memory = nullptr);
  ~EngineCore();

  // InvalidArgument naming the field for a request the engine can never serve. Reads only
  // immutable configuration, so it may run on another thread than the one stepping the core;
  // a request that passes is accepted by add() (given a unique id). A token-free prompt
  // (spec.prompt_blocks, see request.h) needs one key per full block and a sink that is a
  // KeyedKvEventSink (or no sink).
  absl::Status validate(const RequestSpec& spec) const;
  // validate() then queue.
  absl::Status add(RequestSpec spec, Nanos now);
  bool abort(const std::string& id);
  StepResult step(Nanos now) {
    StepResult result;
    step(now, &result);
    return result;
  }
  // The same into `result`, reusing its vectors' capacity (a simulator steps millions of times).
  void step(Nanos now, StepResult* result);
  bool hasWork() const { return scheduler_->hasWork(); }
  // When the earliest onboard from the lower tiers may complete (then step()); nullopt: none.
  std::optional<Nanos> nextOnboardReady() const;
  // True when every pending onboard's copy is done (thread-safe to poll from the core's thread):
  // a driver in virtual time over a live store (a benchmark) waits for it before stepping at
  // nextOnboardReady(), so the modelled time is not stretched by polling.
  bool onboardsCopied() const;
  LowerTiers* lowerTiers() const { return tiers_.get(); }
  // Onboarded blocks whose bytes were not their hash's content (never served: recomputed).
  uint64_t onboardPayloadMismatches() const { return onboard_payload_mismatches_; }

  // KV push, receiver side (see above).
  absl::Status completeRemoteKv(const std::string& id, size_t blocks_filled, Nanos now,
                                Nanos kv_ready_at = -1) {
    return scheduler_->completeRemoteKv(id, blocks_filled, now, kv_ready_at);
  }
  absl::Status failRemoteKv(const std::string& id, Nanos now, bool writes_may_arrive) {
    return scheduler_->failRemoteKv(id, now, writes_may_arrive);
  }
  bool releaseRemoteKvLanding(const std::string& id) {
    return scheduler_->releaseRemoteKvLanding(id);
  }
  // Remote-decode leases.
  bool releaseLease(const std::string& lease_id) { return scheduler_->releaseLease(lease_id); }
  // Hands a lease over with its pins (the live engine's worker agent then keeps it).
  std::optional<worker::Lease> detachLease(const std::string& lease_id) {
    return scheduler_->detachLease(lease_id);
  }
  int expireLeases(Nanos now) { return scheduler_->expireLeases(now); }
  std::optional<Nanos> nextLeaseExpiry() const { return scheduler_->nextLeaseExpiry(); }

  // KV push, holder side: pins the leading run of `hashes` that is cached (each pin keeps the
  // block from eviction) and returns its blocks, in order; unpin() undoes one pin per hash.
  std::vector<BlockIndex> pinLeadingRun(std::span<const BlockHash> hashes);
  void unpin(std::span<const BlockHash> hashes);

  SchedulerStats stats() const { return scheduler_->statsNow(); }
  int numWaiting() const { return scheduler_->numWaiting(); }  // stats().num_waiting
  KvPool& pool() { return *pool_; }
  const TimingModel& timing() const { return *timing_; }
  const Scheduler& scheduler() const { return *scheduler_; }
  int64_t maxModelLen() const { return max_model_len_; }
  int64_t vocabSize() const { return timing_->profile().model.vocab_size; }

 private:
  EngineCore() = default;
  absl::Status validatePromptBlocks(const RequestSpec& spec) const;
  struct PendingOnboard {
    std::string id;
    std::vector<BlockHash> hashes;
    std::vector<BlockIndex> blocks;
    std::unique_ptr<TierOnboard> copy;
    Nanos ready_at = 0;      // when the request may run
    Nanos kv_ready_at = -1;  // layer-wise: when its KV is complete (-1: at ready_at)
    bool aborted = false;    // its landing blocks are quarantined until the copy is done
  };
  void startOnboards(const StepResult& result, Nanos now);
  void finishOnboards(Nanos now);
  // Blocks the copy delivered intact: its ready prefix, cut at the first that fails the
  // payload check (the emulator's bytes are a function of the hash).
  size_t verifiedPrefix(const PendingOnboard& p);
  std::unique_ptr<LowerTiers> tiers_;  // declared first: the pool refers to it until destroyed
  std::vector<PendingOnboard> onboards_;
  uint64_t onboard_payload_mismatches_ = 0;
  OnboardMode onboard_mode_ = OnboardMode::kWhole;
  std::unique_ptr<TimingModel> timing_;
  std::unique_ptr<KvPool> pool_;
  std::unique_ptr<Scheduler> scheduler_;
  int64_t max_model_len_ = 0;
  bool keyed_events_ = true;  // the sink takes token-free stores (or there is none)
};

}  // namespace kvf::engine
