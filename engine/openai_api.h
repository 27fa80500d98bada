// OpenAI-compatible request parsing and response formatting for the emulated engine
// (/v1/completions, /v1/chat/completions, /tokenize): validates every field with a message that
// names it, turns prompts into token ids, and renders non-streaming bodies and SSE chunks.
// Pure functions on Boost.JSON values; no I/O; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/value.hpp>

#include "absl/status/statusor.h"
#include "engine/request.h"
#include "protocol/openai.h"

namespace kvf::engine {

using protocol::ApiKind;
using protocol::KvTransferParams;
using protocol::KvTransferResult;

struct ApiLimits {
  std::string served_model_name;
  int64_t vocab_size = 0;
  int64_t max_model_len = 0;
};

struct ParsedRequest {
  ApiKind kind = ApiKind::kCompletions;
  std::vector<TokenId> prompt;
  SamplingParams sampling;
  bool stream = false;
  bool include_usage = false;
  std::optional<boost::json::value> kv_transfer_params;  // as given
  std::optional<KvTransferParams> kv_transfer;           // parsed when it names a push or lease
  bool nixl_decode_leg = false;  // kv_transfer_params.do_remote_prefill is true (NIXL dialect)
};

// InvalidArgument naming the field for malformed input, NotFound for an unknown model.
absl::StatusOr<ParsedRequest> parseApiRequest(ApiKind kind, std::string_view body,
                                              const ApiLimits& limits);
// /tokenize body: {"prompt": "..."} or {"messages": [...]}; returns the token ids.
absl::StatusOr<std::vector<TokenId>> parseTokenizeRequest(std::string_view body,
                                                          const ApiLimits& limits);

// What the server knows when a request finishes.
struct CompletionSummary {
  std::string id;
  std::string model;
  int64_t created = 0;  // Unix seconds
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  // Of cached_tokens, those onboarded from host memory or disk (reported only when non-zero).
  int64_t tier_tokens = 0;
  int64_t tier_disk_tokens = 0;
  std::vector<TokenId> output;
  std::string finish_reason;
  std::optional<KvTransferResult> kv_transfer_result;  // receiver side of a KV push
};

std::string renderText(const std::vector<TokenId>& tokens);
boost::json::object usageJson(const CompletionSummary& s);
// The non-streaming response body (kv_transfer_params: what to answer with, e.g. a lease).
std::string completionBody(ApiKind kind, const CompletionSummary& s,
                           const std::optional<boost::json::value>& kv_transfer_params);
// One streaming chunk: `text` (with the assistant role on the first chat chunk) and an
// optional finish reason.
std::string streamChunk(ApiKind kind, const CompletionSummary& s, std::string_view text, bool first,
                        const std::string* finish_reason,
                        const std::optional<boost::json::value>& kv_transfer_params);
// The final usage-only chunk (stream_options.include_usage).
std::string usageChunk(ApiKind kind, const CompletionSummary& s);

}  // namespace kvf::engine
