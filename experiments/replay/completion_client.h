// One measured OpenAI completion call: sends a token-id prompt to /v1/completions with
// streaming, and measures when the response headers, the first token and every later token
// arrive. Used by the replayer; the caller owns the HttpClient (one executor).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/http_client.h"

namespace kvf::experiments {

struct CompletionCall {
  std::string request_id;
  std::string session_id;  // sent as X-Session-Id when not empty
  std::string model = "kvf-model";
  std::vector<int32_t> prompt;  // token ids
  int64_t max_tokens = 1;       // also min_tokens, with ignore_eos: the output length is exact
  std::chrono::milliseconds timeout{600'000};  // whole request
};

// What happened to one call. Times are seconds; -1 when not reached.
struct CompletionOutcome {
  bool ok = false;
  std::string error;  // empty when ok
  int http_status = 0;
  double ttft_s = -1;         // send -> first generated token
  double e2e_s = -1;          // send -> end of stream
  double tpot_s = -1;         // (e2e - ttft) / (output_tokens - 1); -1 with fewer than 2 tokens
  std::vector<double> itl_s;  // gaps between consecutive token-carrying events
  int64_t prompt_tokens = -1;
  int64_t output_tokens = 0;   // tokens received
  int64_t cached_tokens = -1;  // usage.prompt_tokens_details.cached_tokens
  // Of cached_tokens, those the engine onboarded from its host-memory (CPU) or disk tier
  // (kvf-engine's kvf_cpu_cached_tokens / kvf_disk_cached_tokens; 0 when not reported).
  int64_t cpu_cached_tokens = 0;
  int64_t disk_cached_tokens = 0;
  std::string instance;                  // x-kvf-instance response header (router), if any
  std::string decision;                  // x-kvf-decision
  std::string reason;                    // x-kvf-reason
  int64_t predicted_cached_tokens = -1;  // x-kvf-predicted-cached-tokens
};

// The first model id the endpoint lists at GET /v1/models.
asio::awaitable<absl::StatusOr<std::string>> discoverModel(http::HttpClient& client);

// The JSON body sent for `call` (exposed for tests).
std::string completionBody(const CompletionCall& call);

// Runs `call` against `client`; never throws, never hangs past call.timeout.
asio::awaitable<CompletionOutcome> runCompletion(http::HttpClient& client,
                                                 const CompletionCall& call);

}  // namespace kvf::experiments
