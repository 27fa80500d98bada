// Reads what routing needs from an OpenAI-style request body (/v1/completions or
// /v1/chat/completions) and validates the fields the router relies on, naming the field in
// every error. The body itself is forwarded unchanged. Pure; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/http.h"
#include "policy/block_hash.h"
#include "protocol/openai.h"

namespace kvf::router {

class TokenPromptPrefetch;

using protocol::ApiKind;

struct ParsedRequest {
  std::string model;
  bool stream = false;
  std::string session;  // X-Session-Id header, else body "user"
  // Token-id prompts (exact hashing) or text (approximate byte-block hashing).
  bool has_token_ids = false;
  std::vector<policy::TokenId> token_ids;
  std::string text;
  int64_t prompt_tokens = 0;  // exact for token ids, estimated (bytes / 4) for text
  int64_t max_tokens = 16;
  // Whether the body has a top-level "kv_transfer_params" member, when the parse knows (the
  // single-pass path); nullopt: search the body.
  std::optional<bool> has_kv_transfer_params;
};

inline constexpr int64_t kBytesPerTokenEstimate = 4;
// The largest max_tokens (max_completion_tokens) a client may ask for: above every context
// length served today (10M tokens), and small enough that the router's per-instance sums of
// prompt and output tokens cannot overflow (a prompt is bounded by the body size).
inline constexpr int64_t kMaxClientTokens = int64_t{1} << 24;

// Client numbers are range-checked here (a 400 naming the field), so that sums of them
// downstream (e.g. Instance::ongoing_tokens) stay far from overflow.
// Token-id completions are read in one pass without a DOM (router/fast_parse.h); every other
// body, and every invalid one, goes through parseRequestDom, which names the field in errors.
// With `prefetch` (the body read while it arrived), its token ids are taken over.
absl::StatusOr<ParsedRequest> parseRequest(ApiKind kind, const http::Request& request,
                                           TokenPromptPrefetch* prefetch = nullptr);
// The general path alone (tests compare the two paths with it).
absl::StatusOr<ParsedRequest> parseRequestDom(ApiKind kind, const http::Request& request);

// The block hashes to match for a parsed request (token or text domain).
std::vector<policy::BlockHash> requestHashes(const ParsedRequest& request, size_t block_size);

}  // namespace kvf::router
