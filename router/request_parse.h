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
  // What the engine folds into the prompt's block hashes besides its tokens: cache_salt,
  // multimodal items (the kvfabric_mm_items extension field) and, set by the router from its
  // lora_adapters list, the LoRA adapter's name (docs/vllm.md).
  protocol::ExtraKeyInputs extra_keys;
  // Whether the body has a top-level "kv_transfer_params" member, when the parse knows (the
  // single-pass path); nullopt: search the body.
  std::optional<bool> has_kv_transfer_params;
};

inline constexpr int64_t kBytesPerTokenEstimate = 4;
// The request extension field that names a prompt's multimodal items:
// [{"identifier": "<vLLM's item hash>", "offset": <first token>, "length": <tokens>}, ...].
inline constexpr std::string_view kMmItemsField = "kvfabric_mm_items";
inline constexpr size_t kMaxMmItems = 256;
inline constexpr size_t kMaxExtraKeyBytes = 1024;  // cache_salt, one identifier

// Token-id completions are read in one pass without a DOM (router/fast_parse.h); every other
// body, and every invalid one, goes through parseRequestDom, which names the field in errors.
// With `prefetch` (the body read while it arrived), its token ids are taken over.
absl::StatusOr<ParsedRequest> parseRequest(ApiKind kind, const http::Request& request,
                                           TokenPromptPrefetch* prefetch = nullptr);
// The general path alone (tests compare the two paths with it).
absl::StatusOr<ParsedRequest> parseRequestDom(ApiKind kind, const http::Request& request);

// The block hashes to match for a parsed request (token or text domain), keyed by its extra
// keys as the engine keys them.
std::vector<policy::BlockHash> requestHashes(const ParsedRequest& request, size_t block_size);

}  // namespace kvf::router
