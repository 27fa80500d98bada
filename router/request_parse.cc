#include "router/request_parse.h"

#include <algorithm>

#include "common/json.h"
#include "common/status.h"
#include "common/strings.h"
#include "router/fast_parse.h"

namespace kvf::router {
namespace {

namespace bj = boost::json;
using absl::InvalidArgumentError;

constexpr size_t kMaxSessionBytes = 256;

absl::Status checkTokenCount(std::string_view field, int64_t value) {
  if (value < 0 || value > kMaxClientTokens) {
    return InvalidArgumentError(
        strCat("\"", field, "\" must be in [0, ", kMaxClientTokens, "], got ", value));
  }
  return absl::OkStatus();
}

// Prompt token counts add up within a body's size, but saturate rather than trust that.
void addTokens(int64_t* total, int64_t n) {
  *total = n > INT64_MAX - *total ? INT64_MAX : *total + n;
}

absl::Status readTokenArray(const bj::array& items, std::string_view field,
                            std::vector<policy::TokenId>* out) {
  out->reserve(out->size() + items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const bj::value& v = items[i];
    int64_t t = -1;
    if (v.is_int64()) t = v.as_int64();
    if (v.is_uint64() && v.as_uint64() <= UINT32_MAX) t = static_cast<int64_t>(v.as_uint64());
    if (t < 0 || t > UINT32_MAX) {
      return InvalidArgumentError(strCat(field, "[", i, "] must be a non-negative token id"));
    }
    out->push_back(static_cast<policy::TokenId>(t));
  }
  return absl::OkStatus();
}

// "prompt": string | [token ids] | [strings] | [[token ids]]. Batches route by their first
// prompt's content and count every prompt's tokens.
absl::Status readPrompt(const bj::object& body, ParsedRequest* out) {
  const bj::value* prompt = body.if_contains("prompt");
  if (prompt == nullptr || prompt->is_null())
    return InvalidArgumentError("missing field \"prompt\"");
  if (prompt->is_string()) {
    out->text = std::string(prompt->as_string());
    return absl::OkStatus();
  }
  if (!prompt->is_array() || prompt->as_array().empty()) {
    return InvalidArgumentError("\"prompt\" must be a string, an array of token ids or a batch");
  }
  const bj::array& items = prompt->as_array();
  if (items[0].is_number()) {
    out->has_token_ids = true;
    return readTokenArray(items, "prompt", &out->token_ids);
  }
  for (size_t i = 0; i < items.size(); ++i) {
    std::string field = strCat("prompt[", i, "]");
    if (items[i].is_string()) {
      if (out->has_token_ids) return InvalidArgumentError(strCat(field, " mixes text and tokens"));
      if (i == 0) {
        out->text = std::string(items[i].as_string());
      } else {
        addTokens(&out->prompt_tokens,
                  static_cast<int64_t>(items[i].as_string().size()) / kBytesPerTokenEstimate);
      }
    } else if (items[i].is_array()) {
      std::vector<policy::TokenId> tokens;
      KVF_RETURN_IF_ERROR(readTokenArray(items[i].as_array(), field, &tokens));
      if (i == 0) {
        out->has_token_ids = true;
        out->token_ids = std::move(tokens);
      } else if (!out->has_token_ids) {
        return InvalidArgumentError(strCat(field, " mixes text and tokens"));
      } else {
        addTokens(&out->prompt_tokens, static_cast<int64_t>(tokens.size()));
      }
    } else {
      return InvalidArgumentError(strCat(field, " must be a string or an array of token ids"));
    }
  }
  return absl::OkStatus();
}

absl::Status appendContent(const bj::value& content, std::string_view field, std::string* text) {
  if (content.is_null()) return absl::OkStatus();
  if (content.is_string()) {
    text->append(content.as_string());
    return absl::OkStatus();
  }
  if (!content.is_array())
    return InvalidArgumentError(strCat(field, " must be a string or an array"));
  for (const bj::value& part : content.as_array()) {
    if (!part.is_object()) return InvalidArgumentError(strCat(field, " parts must be objects"));
    if (const bj::value* t = part.as_object().if_contains("text"); t && t->is_string()) {
      text->append(t->as_string());
    }
  }
  return absl::OkStatus();
}

absl::Status readMessages(const bj::object& body, ParsedRequest* out) {
  const bj::value* messages = body.if_contains("messages");
  if (messages == nullptr || messages->is_null()) {
    return InvalidArgumentError("missing field \"messages\"");
  }
  if (!messages->is_array() || messages->as_array().empty()) {
    return InvalidArgumentError("\"messages\" must be a non-empty array");
  }
  const bj::array& items = messages->as_array();
  for (size_t i = 0; i < items.size(); ++i) {
    std::string field = strCat("messages[", i, "]");
    if (!items[i].is_object()) return InvalidArgumentError(strCat(field, " must be an object"));
    const bj::object& m = items[i].as_object();
    auto role = json::getString(m, "role");
    if (!role.ok()) return InvalidArgumentError(strCat(field, ".role must be a string"));
    // Role markers keep "user: x" and "system: x" apart in the approximate index.
    out->text.append("<|").append(*role).append("|>");
    if (const bj::value* c = m.if_contains("content")) {
      KVF_RETURN_IF_ERROR(appendContent(*c, strCat(field, ".content"), &out->text));
    }
  }
  return absl::OkStatus();
}

absl::Status applySession(const http::Request& request, std::string_view body_user,
                          ParsedRequest* out) {
  std::string_view session = request.header("x-session-id");
  if (session.empty()) session = body_user;
  if (session.size() > kMaxSessionBytes) {
    return InvalidArgumentError(strCat("session id longer than ", kMaxSessionBytes, " bytes"));
  }
  out->session = std::string(session);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ParsedRequest> parseRequest(ApiKind kind, const http::Request& request,
                                           TokenPromptPrefetch* prefetch) {
  if (kind == ApiKind::kCompletions) {
    // The common shape in one pass without a DOM; anything else (and every error) below.
    if (auto fast = fastParseTokenCompletion(request.body, prefetch)) {
      std::string body_user = std::move(fast->session);
      KVF_RETURN_IF_ERROR(applySession(request, body_user, &*fast));
      return std::move(*fast);
    }
  }
  return parseRequestDom(kind, request);
}

absl::StatusOr<ParsedRequest> parseRequestDom(ApiKind kind, const http::Request& request) {
  // The DOM dies with this call: one arena, no per-value frees (100k-token prompts are 100k
  // values). Declared before `body` so it outlives it.
  bj::monotonic_resource arena(std::min<size_t>(request.body.size() * 3 + 4096, 64u << 20));
  KVF_ASSIGN_OR_RETURN(bj::object body, json::parseObject(request.body, 64, &arena));
  ParsedRequest out;
  auto model = json::getString(body, "model");
  if (!model.ok()) {
    if (absl::IsNotFound(model.status())) return InvalidArgumentError("missing field \"model\"");
    return model.status();
  }
  out.model = std::string(*model);
  KVF_ASSIGN_OR_RETURN(out.stream, json::getBoolOr(body, "stream", false));
  int64_t default_max = kind == ApiKind::kCompletions ? 16 : 256;
  KVF_ASSIGN_OR_RETURN(out.max_tokens, json::getIntOr(body, "max_tokens", default_max));
  KVF_RETURN_IF_ERROR(checkTokenCount("max_tokens", out.max_tokens));
  if (kind == ApiKind::kChat) {
    KVF_ASSIGN_OR_RETURN(out.max_tokens,
                         json::getIntOr(body, "max_completion_tokens", out.max_tokens));
    KVF_RETURN_IF_ERROR(checkTokenCount("max_completion_tokens", out.max_tokens));
  }
  if (kind == ApiKind::kCompletions) {
    KVF_RETURN_IF_ERROR(readPrompt(body, &out));
  } else {
    KVF_RETURN_IF_ERROR(readMessages(body, &out));
  }
  if (out.has_token_ids) {
    addTokens(&out.prompt_tokens, static_cast<int64_t>(out.token_ids.size()));
  } else {
    addTokens(&out.prompt_tokens,
              (static_cast<int64_t>(out.text.size()) + kBytesPerTokenEstimate - 1) /
                  kBytesPerTokenEstimate);
  }
  std::string_view body_user;
  if (request.header("x-session-id").empty()) {
    auto user = json::getString(body, "user");
    if (user.ok()) {
      body_user = *user;
    } else if (!absl::IsNotFound(user.status())) {
      return user.status();
    }
  }
  KVF_RETURN_IF_ERROR(applySession(request, body_user, &out));
  return out;
}

std::vector<policy::BlockHash> requestHashes(const ParsedRequest& request, size_t block_size) {
  if (request.has_token_ids) return policy::hashTokenBlocks(request.token_ids, block_size);
  return policy::hashTextBlocks(request.text,
                                block_size * static_cast<size_t>(kBytesPerTokenEstimate));
}

}  // namespace kvf::router
