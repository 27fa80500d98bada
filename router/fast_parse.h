// Single-pass read of the common request shape: a /v1/completions body whose "prompt" is a
// flat array of token ids. A strict JSON scanner collects model, stream, max_tokens, user and
// the token ids without building a DOM (a 100k-token prompt is 100k DOM values) and validates
// the rest of the document as it skips it. Anything else - text or batch prompts, unexpected types,
// duplicate fields, bad JSON - answers nullopt and parseRequest() takes the DOM path, which owns
// every error message, so both paths accept and reject the same bodies. TokenPromptPrefetch
// reads the token ids while the body is still arriving. Pure; one thread per object.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "router/request_parse.h"

namespace kvf::router {

namespace fast_parse_internal {
class TokenArrayReader;
class TokenCompletionScanner;
}  // namespace fast_parse_internal

// Reads the token ids of a body's top-level "prompt" array while the body arrives, so that
// the final parse (fastParseTokenCompletion with this object) only reads what came last. It
// only reads ahead: it never decides whether the body is valid (the final parse does), and it
// gives up quietly on anything unusual (the final parse then reads everything itself).
class TokenPromptPrefetch {
 public:
  explicit TokenPromptPrefetch(size_t body_bytes);
  ~TokenPromptPrefetch();
  TokenPromptPrefetch(const TokenPromptPrefetch&) = delete;
  TokenPromptPrefetch& operator=(const TokenPromptPrefetch&) = delete;

  // `received`: the body's first bytes so far (each call a longer prefix of the same bytes).
  void feed(std::string_view received);
  // The prompt's token ids read so far (until the final parse takes them).
  const std::vector<policy::TokenId>& ids() const { return ids_; }
  // True once a final parse accepted the body and took the ids read here.
  bool used() const { return used_; }

 private:
  friend class fast_parse_internal::TokenCompletionScanner;
  friend std::optional<ParsedRequest> fastParseTokenCompletion(std::string_view body,
                                                               TokenPromptPrefetch* prefetch);
  size_t body_bytes_;
  size_t array_begin_ = 0;
  bool gave_up_ = false;
  bool used_ = false;
  std::unique_ptr<fast_parse_internal::TokenArrayReader> reader_;
  std::vector<policy::TokenId> ids_;
};

// The body-derived fields of ParsedRequest (session = body "user" only; the caller applies the
// X-Session-Id header and the session length bound). nullopt: use the DOM path. With a
// prefetch that read this body while it arrived, its ids are taken over, not read again.
std::optional<ParsedRequest> fastParseTokenCompletion(std::string_view body,
                                                      TokenPromptPrefetch* prefetch = nullptr);

// The body observer of /v1/completions (HttpServer::route): reads a token-id prompt and hashes
// its full blocks while the body arrives, so the decision is ready soon after the last byte.
// Does nothing for a body that arrives whole with its header (the final parse reads it).
class PromptReadAhead final : public http::BodyObserver {
 public:
  explicit PromptReadAhead(size_t block_size) : block_size_(block_size) {}
  void onBody(std::string_view received, size_t total) override;
  // For fastParseTokenCompletion / parseRequest; null before any partial body was seen.
  TokenPromptPrefetch* prefetch() { return prefetch_ ? &*prefetch_ : nullptr; }
  // After a parse that used() the prefetch: the chained hashes of the prompt's first blocks.
  std::vector<policy::BlockHash> takeHashes() { return std::move(hashes_); }

 private:
  size_t block_size_;
  std::optional<TokenPromptPrefetch> prefetch_;
  std::vector<policy::BlockHash> hashes_;
};

}  // namespace kvf::router
