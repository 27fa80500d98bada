// Fuzz target: the router's request parse, differential between the single-pass scanner
// (router/fast_parse.h) and the DOM path (parseRequestDom). Input: byte 0 picks how the body
// arrives for the read-ahead (TokenPromptPrefetch), the rest is a /v1/completions body.
// Properties: whenever the scanner accepts, the DOM path accepts with the same fields, and the
// scanner's "client sent kv_transfer_params" matches the document's top level; reading ahead in
// pieces never changes the outcome; parseRequest (either path) never crashes on chat bodies.
#include <cstdint>
#include <string>
#include <string_view>

#include "common/json.h"
#include "router/fast_parse.h"
#include "router/request_parse.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace kvf::router;

kvf::http::Request post(std::string_view body) {
  kvf::http::Request r;
  r.method = "POST";
  r.body = std::string(body);
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto in = kvf::fuzz::splitInput(data, size);
  if (!in) return 0;
  size_t step = size_t{in->choice} % 61 + 1;
  std::string_view body = in->rest;

  auto fast = fastParseTokenCompletion(body);
  auto dom = parseRequestDom(ApiKind::kCompletions, post(body));
  if (fast.has_value()) {
    KVF_FUZZ_CHECK(dom.ok(), "the scanner accepted what the DOM path refuses");
    KVF_FUZZ_CHECK(fast->model == dom->model, "model");
    KVF_FUZZ_CHECK(fast->stream == dom->stream, "stream");
    KVF_FUZZ_CHECK(fast->max_tokens == dom->max_tokens, "max_tokens");
    KVF_FUZZ_CHECK(fast->session == dom->session, "user");
    KVF_FUZZ_CHECK(fast->token_ids == dom->token_ids, "prompt token ids");
    KVF_FUZZ_CHECK(fast->prompt_tokens == dom->prompt_tokens, "prompt_tokens");
    KVF_FUZZ_CHECK(dom->has_token_ids, "token prompt");
    auto object = kvf::json::parseObject(body);
    KVF_FUZZ_CHECK(object.ok(), "the scanner accepted invalid JSON");
    KVF_FUZZ_CHECK(
        fast->has_kv_transfer_params == std::optional<bool>(object->contains("kv_transfer_params")),
        "kv_transfer_params detection");
  }
  if (dom.ok()) {
    KVF_FUZZ_CHECK(dom->max_tokens >= 0 && dom->max_tokens <= kMaxClientTokens,
                   "max_tokens out of range");
    KVF_FUZZ_CHECK(dom->prompt_tokens >= 0, "prompt_tokens negative");
  }

  // The read-ahead of a body arriving in pieces: same outcome as reading it whole.
  TokenPromptPrefetch prefetch(body.size());
  for (size_t got = step; got < body.size(); got += step) prefetch.feed(body.substr(0, got));
  auto pieces = fastParseTokenCompletion(body, &prefetch);
  KVF_FUZZ_CHECK(pieces.has_value() == fast.has_value(), "read-ahead changed acceptance");
  if (pieces.has_value()) {
    KVF_FUZZ_CHECK(pieces->token_ids == fast->token_ids, "read-ahead changed the ids");
  }

  auto chat = parseRequest(ApiKind::kChat, post(body));
  if (chat.ok()) {
    KVF_FUZZ_CHECK(chat->max_tokens >= 0 && chat->max_tokens <= kMaxClientTokens,
                   "chat max_tokens out of range");
  }
  return 0;
}
