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

namespace kvf::engine {

using worker::TokenId;

struct SamplingParams {
  int64_t max_tokens = 16;
  int64_t min_tokens = 0;
  bool ignore_eos = false;
};

// What a front end submits.
struct RequestSpec {
  std::string id;
  std::vector<TokenId> prompt;
  SamplingParams sampling;
};

enum class RequestStatus {
  kWaiting,
  // Reserved for KV push: blocks reserved, waiting for a peer to fill them (later issue).
  kWaitingForRemoteKv,
  kRunning,
  kPreempted,
  kFinished,
};

enum class FinishReason { kStop, kLength, kAbort };
const char* finishReasonName(FinishReason r);

struct Request {
  std::string id;
  uint64_t arrival_seq = 0;
  std::vector<TokenId> prompt;
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

  Nanos arrival_time = 0;
  Nanos first_token_time = -1;

  int64_t numTokens() const { return static_cast<int64_t>(prompt.size() + output.size()); }
  TokenId tokenAt(int64_t i) const {
    auto p = static_cast<int64_t>(prompt.size());
    return i < p ? prompt[static_cast<size_t>(i)] : output[static_cast<size_t>(i - p)];
  }
};

}  // namespace kvf::engine
