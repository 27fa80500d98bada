// Request state inside the engine core: prompt and generated tokens, sampling limits, progress
// (computed tokens, blocks held, block hashes) and timestamps on the core's clock. Owned by the
// Scheduler; read-only to others through RequestOutput. Engine loop thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "worker/block_table.h"
#include "worker/kv_events.h"
#include "worker/tiers/tier_types.h"

namespace kvf::engine {

using worker::TokenId;

struct SamplingParams {
  int64_t max_tokens = 16;
  int64_t min_tokens = 0;
  bool ignore_eos = false;
};

// KV push (receiver side): fetch the leading blocks a peer holds instead of computing them.
struct RemoteKvSpec {
  std::string source;  // opaque to the core (the live engine: the holder's worker URL)
  // The holder's run of block hashes, in prompt order; empty: the prompt's own block hashes
  // (every engine of a cluster hashes alike). Only the part equal to the prompt's own hashes
  // and beyond the local prefix-cache hit is fetched.
  std::vector<worker::BlockHash> block_hashes;
};

// A token-free prompt (a simulator replaying a trace of block ids): one content key per full
// block instead of token ids. Equal keys stand for equal tokens, so the block hashes chain as
// hashBlockKey(seed, parent, key) and the prefix cache behaves as with the tokens; only full
// blocks are cached and the last prompt token is always computed, as with tokens. Generated
// tokens are seeded by content_seed, which must identify the whole prompt (partial last block
// included), as outputSeed() of the tokens does.
struct PromptBlocks {
  int64_t num_tokens = 0;
  std::vector<uint64_t> block_keys;  // num_tokens / block_size keys, in prompt order
  uint64_t content_seed = 0;
  // Optional: the hashes of those blocks as this core chains them (its scheduler's
  // keyed_hasher, from the hasher's root), from a caller that already computed them with that
  // function (a simulator's router hashes every prompt for its index). The core takes them as
  // its own instead of hashing every block again. Empty: the core hashes. Only their number is
  // checked: hashes that do not follow from the keys only mislabel the caller's own blocks.
  std::vector<worker::BlockHash> block_hashes;
};

// What a front end submits.
struct RequestSpec {
  std::string id;
  // The caller's own handle for the request, copied into every RequestOutput (a driver that
  // keeps requests in an array finds it without parsing `id`).
  uint64_t tag = 0;
  std::vector<TokenId> prompt;
  // Instead of `prompt` (which must then be empty): a token-free prompt. Its BlockStored
  // events carry no token_ids; the core needs a KeyedKvEventSink (or none) to accept it.
  std::optional<PromptBlocks> prompt_blocks;
  SamplingParams sampling;
  std::optional<RemoteKvSpec> remote_kv;
  // Prefill offload (do_remote_decode): when the request finishes, the prompt's cached full
  // blocks stay pinned under a lease (id = request id) for this long, or until released.
  std::optional<Nanos> remote_decode_lease;
  // The most the lease may live, heartbeats included (worker.max_lease_ms); 0: its duration.
  Nanos remote_decode_lease_cap = 0;
};

enum class RequestStatus {
  kWaiting,
  // KV push: local hits held and landing blocks allocated; the driver fetches the rest.
  kWaitingForRemoteKv,  // landing blocks allocated, waiting for the driver's complete / fail
  kRunning,
  kPreempted,
  kFinished,
};

enum class FinishReason { kStop, kLength, kAbort };
const char* finishReasonName(FinishReason r);

struct Request {
  std::string id;
  uint64_t tag = 0;  // RequestSpec::tag
  uint64_t arrival_seq = 0;
  std::vector<TokenId> prompt;        // empty for a token-free prompt
  int64_t prompt_len = 0;             // prompt tokens (prompt.size() or PromptBlocks::num_tokens)
  std::vector<uint64_t> prompt_keys;  // token-free: content key per full prompt block
  bool token_free = false;
  std::vector<TokenId> output;
  SamplingParams sampling;
  uint64_t output_seed = 0;  // generated tokens are a function of this and their position

  RequestStatus status = RequestStatus::kWaiting;
  std::optional<FinishReason> finish_reason;
  int64_t num_computed_tokens = 0;
  int64_t num_cached_tokens = -1;  // prefix-cache hit at first admission; -1 until then
  int num_preemptions = 0;

  std::vector<worker::BlockIndex> blocks;       // KV blocks held, in token order
  std::vector<worker::BlockHash> block_hashes;  // hashes of full blocks of prompt + output
  size_t num_cached_blocks = 0;                 // leading blocks registered in the prefix cache
  // While waiting at the head of the queue: the blocks its last prefix lookup found (a hint
  // for the next lookup, re-checked block by block; no references held).
  std::vector<worker::BlockIndex> prefix_hint;
  uint64_t prefix_hint_watch = 0;  // KvPool::watchCachedPrefix id of prefix_hint, 0: none

  // KV push (receiver): the spec until the fetch is resolved; landing blocks while waiting.
  std::optional<RemoteKvSpec> remote_kv;
  std::vector<worker::BlockIndex> landing_blocks;
  std::vector<worker::BlockHash> landing_hashes;
  int64_t local_hit_tokens = 0;  // prefix-cache hit when the fetch started
  int64_t remote_kv_tokens = 0;  // tokens filled by the peer
  // The landing blocks wait for the lower tiers (an onboard), not for a peer.
  bool onboarding = false;
  bool tiers_failed = false;  // an onboard delivered nothing: compute instead of asking again
  std::vector<worker::TierId> onboard_tiers;  // per landing block, where the lookup found it
  std::vector<worker::BlockHash> promoted;    // blocks promoted (or being) for it while it waits
  int64_t tier_tokens = 0;                    // tokens onboarded from the lower tiers
  int64_t tier_disk_tokens = 0;               // of tier_tokens, those read from disk
  // Layer-wise push or onboard: the KV landing layer by layer is complete at this engine time
  // (-1: already there); the first step computing this request cannot end before it plus one
  // layer's share of the step (TimingModel::layeredStepDuration).
  Nanos kv_ready_at = -1;
  std::optional<Nanos> remote_decode_lease;
  Nanos remote_decode_lease_cap = 0;
  std::vector<worker::BlockHash> lease_hashes;  // pinned at finish (remote decode)

  Nanos arrival_time = 0;
  Nanos first_token_time = -1;

  int64_t numTokens() const { return prompt_len + static_cast<int64_t>(output.size()); }
  // Token mode only (token_free == false).
  TokenId tokenAt(int64_t i) const {
    auto p = static_cast<int64_t>(prompt.size());
    return i < p ? prompt[static_cast<size_t>(i)] : output[static_cast<size_t>(i - p)];
  }
};

}  // namespace kvf::engine
