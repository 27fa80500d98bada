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
#include "protocol/kv_events.h"
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
  // Whether the body set max_tokens (chat: or max_completion_tokens); unset, vLLM decides
  // (completions: 16, chat: the rest of the context) and so does effectiveMaxTokens().
  bool max_tokens_given = false;
  // What the engine folds into the prompt's block hashes besides its tokens: cache_salt,
  // multimodal items (the kvfabric_mm_items extension field) and, set by the router from its
  // lora_adapters list, the LoRA adapter's name (docs/vllm.md).
  protocol::ExtraKeyInputs extra_keys;
  // Whether the body has a top-level "kv_transfer_params" member, as a JSON parser reads the
  // key (escapes decoded: "kv_transfer\u005fparams" is the same key). Clients never reach the
  // KV plane: the router strips the member whenever this is set (docs/security.md).
  bool has_kv_transfer_params = false;
};

inline constexpr int64_t kBytesPerTokenEstimate = 4;
inline constexpr int64_t kMaxOutputTokens = int64_t{1} << 40;
// The request extension field that names a prompt's multimodal items:
// [{"identifier": "<vLLM's item hash>", "offset": <first token>, "length": <tokens>}, ...].
inline constexpr std::string_view kMmItemsField = "kvfabric_mm_items";
inline constexpr size_t kMaxMmItems = 256;
inline constexpr size_t kMaxExtraKeyBytes = 1024;  // cache_salt, one identifier
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

// The output tokens a request may generate, as its engine will see them: the body's value, else
// `default_max_tokens` (0: vLLM's own default: 16 for completions, the rest of the context,
// max_model_len - prompt, for chat; 16 where max_model_len is unknown (0)), capped by
// `max_tokens_limit` (0: none). Within [0, kMaxOutputTokens]: a body may ask for 2^63 - 1
// tokens, and the load accounting adds this to prompt lengths and other requests' values.
int64_t effectiveMaxTokens(const ParsedRequest& request, ApiKind kind, int64_t default_max_tokens,
                           int64_t max_tokens_limit, int64_t max_model_len);

// The body with "max_tokens" set to `max_tokens` (and, for chat, "max_completion_tokens" too
// where the body has it); nullopt when the body is not a JSON object.
std::optional<std::string> withMaxTokens(std::string_view body, int64_t max_tokens);

// The block hashes to match for a parsed request (token or text domain), keyed by its extra
// keys as the engine keys them.
std::vector<policy::BlockHash> requestHashes(const ParsedRequest& request, size_t block_size);

}  // namespace kvf::router
