#include "engine/openai_api.h"

#include <cmath>

#include <boost/json.hpp>

#include "common/error_body.h"
#include "common/json.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/tokenizer.h"

namespace kvf::engine {
namespace bj = boost::json;
namespace {

// `param` (OpenAI's and vLLM's error.param) is the top-level field: "prompt" for "prompt[3]".
absl::Status invalid(std::string_view field, std::string_view what) {
  return json::withParam(absl::InvalidArgumentError(strCat(field, ": ", what)),
                         field.substr(0, field.find_first_of("[.")));
}

absl::StatusOr<std::vector<TokenId>> tokenIds(const bj::array& arr, std::string_view field,
                                              const ApiLimits& limits) {
  std::vector<TokenId> out;
  out.reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    const bj::value& v = arr[i];
    int64_t id = 0;
    if (v.is_int64()) {
      id = v.as_int64();
    } else if (v.is_uint64() && v.as_uint64() <= static_cast<uint64_t>(INT64_MAX)) {
      id = static_cast<int64_t>(v.as_uint64());
    } else if (v.is_uint64()) {
      id = INT64_MAX;
    } else {
      return invalid(strCat(field, "[", i, "]"), "must be an integer token id");
    }
    if (id < 0 || id >= limits.vocab_size) {
      return invalid(
          strCat(field, "[", i, "]"),
          strCat("token id ", id, " is out of vocabulary (0..", limits.vocab_size - 1, ")"));
    }
    out.push_back(id);
  }
  return out;
}

absl::StatusOr<std::vector<TokenId>> parsePrompt(const bj::object& obj, const ApiLimits& limits) {
  const bj::value* p = obj.if_contains("prompt");
  if (p == nullptr || p->is_null()) return invalid("prompt", "is required");
  if (p->is_string()) {
    std::string_view text(p->as_string().data(), p->as_string().size());
    return tokenize(text, limits.vocab_size);
  }
  if (!p->is_array()) return invalid("prompt", "must be a string or an array of token ids");
  const bj::array& arr = p->as_array();
  if (arr.empty()) return invalid("prompt", "must not be empty");
  if (arr[0].is_string() || arr[0].is_array()) {
    if (arr.size() != 1) return invalid("prompt", "batched prompts are not supported");
    if (arr[0].is_string()) {
      std::string_view text(arr[0].as_string().data(), arr[0].as_string().size());
      return tokenize(text, limits.vocab_size);
    }
    return tokenIds(arr[0].as_array(), "prompt[0]", limits);
  }
  return tokenIds(arr, "prompt", limits);
}

absl::StatusOr<std::vector<TokenId>> parseMessages(const bj::object& obj, const ApiLimits& limits) {
  const bj::value* m = obj.if_contains("messages");
  if (m == nullptr || m->is_null()) return invalid("messages", "is required");
  if (!m->is_array() || m->as_array().empty()) {
    return invalid("messages", "must be a non-empty array");
  }
  std::vector<ChatMessage> messages;
  const bj::array& arr = m->as_array();
  for (size_t i = 0; i < arr.size(); ++i) {
    std::string field = strCat("messages[", i, "]");
    if (!arr[i].is_object()) return invalid(field, "must be an object");
    const bj::object& msg = arr[i].as_object();
    const bj::value* role = msg.if_contains("role");
    if (role == nullptr || !role->is_string()) return invalid(field + ".role", "must be a string");
    ChatMessage out;
    out.role = std::string(role->as_string());
    const bj::value* content = msg.if_contains("content");
    if (content == nullptr || content->is_null()) {
      // An assistant turn with only tool calls has no content.
    } else if (content->is_string()) {
      out.content = std::string(content->as_string());
    } else if (content->is_array()) {
      const bj::array& parts = content->as_array();
      for (size_t j = 0; j < parts.size(); ++j) {
        std::string pf = strCat(field, ".content[", j, "]");
        const bj::object* part = parts[j].if_object();
        const bj::value* text = part ? part->if_contains("text") : nullptr;
        if (text == nullptr || !text->is_string()) return invalid(pf, "must be a text part");
        out.content += std::string(text->as_string());
      }
    } else {
      return invalid(field + ".content", "must be a string or an array of text parts");
    }
    messages.push_back(std::move(out));
  }
  return tokenize(applyChatTemplate(messages), limits.vocab_size);
}

// An optional integer field: absent/null keeps `*out`; anything but an integer is an error.
absl::Status optionalInt(const bj::object& obj, std::string_view key, int64_t* out) {
  const bj::value* v = obj.if_contains(key);
  if (v == nullptr || v->is_null()) return absl::OkStatus();
  if (v->is_int64()) {
    *out = v->as_int64();
  } else if (v->is_uint64()) {
    *out = INT64_MAX;  // larger than any limit; rejected by the range checks
  } else if (v->is_double() && v->as_double() == std::floor(v->as_double())) {
    double d = v->as_double();  // 1e3 or 99999999999999999999: integral, maybe out of range
    *out = std::fabs(d) < 9e18 ? static_cast<int64_t>(d) : (d > 0 ? INT64_MAX : INT64_MIN);
  } else {
    return invalid(key, "must be an integer");
  }
  return absl::OkStatus();
}

absl::Status optionalBool(const bj::object& obj, std::string_view key, bool* out) {
  const bj::value* v = obj.if_contains(key);
  if (v == nullptr || v->is_null()) return absl::OkStatus();
  if (!v->is_bool()) return invalid(key, "must be a boolean");
  *out = v->as_bool();
  return absl::OkStatus();
}

absl::Status optionalNumber(const bj::object& obj, std::string_view key) {
  const bj::value* v = obj.if_contains(key);
  if (v == nullptr || v->is_null() || v->is_number()) return absl::OkStatus();
  return invalid(key, "must be a number");
}

absl::Status checkModel(const bj::object& obj, const ApiLimits& limits) {
  const bj::value* m = obj.if_contains("model");
  if (m == nullptr || m->is_null()) return absl::OkStatus();
  if (!m->is_string()) return invalid("model", "must be a string");
  if (m->as_string() != limits.served_model_name) {
    return absl::NotFoundError(
        strCat("The model `", std::string(m->as_string()), "` does not exist."));
  }
  return absl::OkStatus();
}

absl::Status parseSampling(const bj::object& obj, ApiKind kind, int64_t prompt_len,
                           const ApiLimits& limits, ParsedRequest* out) {
  SamplingParams& s = out->sampling;
  // Completions default to 16 tokens (OpenAI, vLLM); chat to the rest of the context.
  s.max_tokens = kind == ApiKind::kCompletions ? 16 : limits.max_model_len - prompt_len;
  // The error names the field the value came from (max_tokens wins when both are given).
  std::string_view field = "max_tokens";
  if (kind == ApiKind::kChat) {
    KVF_RETURN_IF_ERROR(optionalInt(obj, "max_completion_tokens", &s.max_tokens));
    const bj::value* v = obj.if_contains("max_tokens");
    if (v == nullptr || v->is_null()) field = "max_completion_tokens";
  }
  KVF_RETURN_IF_ERROR(optionalInt(obj, "max_tokens", &s.max_tokens));
  if (s.max_tokens < 1) return invalid(field, strCat("must be at least 1, got ", s.max_tokens));
  // Out-of-range integers arrive here clamped to INT64_MIN/MAX, and the subtraction is of two
  // in-range values: no overflow for any client number.
  if (s.max_tokens > limits.max_model_len - prompt_len) {
    return invalid(field, strCat("this model's maximum context length is ", limits.max_model_len,
                                 " tokens; the prompt has ", prompt_len, " tokens and ", field,
                                 " is ", s.max_tokens));
  }
  KVF_RETURN_IF_ERROR(optionalInt(obj, "min_tokens", &s.min_tokens));
  if (s.min_tokens < 0 || s.min_tokens > s.max_tokens) {
    return invalid("min_tokens", strCat("must be in [0, max_tokens], got ", s.min_tokens));
  }
  KVF_RETURN_IF_ERROR(optionalBool(obj, "ignore_eos", &s.ignore_eos));
  int64_t n = 1;
  KVF_RETURN_IF_ERROR(optionalInt(obj, "n", &n));
  if (n != 1) return invalid("n", "only n = 1 is supported");
  for (const char* key : {"temperature", "top_p", "top_k", "presence_penalty", "frequency_penalty",
                          "repetition_penalty"}) {
    KVF_RETURN_IF_ERROR(optionalNumber(obj, key));
  }
  return absl::OkStatus();
}

absl::Status parseStreaming(const bj::object& obj, const ApiLimits& limits, ParsedRequest* out) {
  KVF_RETURN_IF_ERROR(optionalBool(obj, "stream", &out->stream));
  const bj::value* so = obj.if_contains("stream_options");
  if (so != nullptr && !so->is_null()) {
    if (!so->is_object()) return invalid("stream_options", "must be an object");
    KVF_RETURN_IF_ERROR(optionalBool(so->as_object(), "include_usage", &out->include_usage));
  }
  const bj::value* kv = obj.if_contains("kv_transfer_params");
  if (kv != nullptr && !kv->is_null()) {
    out->kv_transfer_params = *kv;
    protocol::KvTransferLimits kl;
    kl.max_block_hashes = static_cast<size_t>(limits.max_model_len);
    KVF_ASSIGN_OR_RETURN(KvTransferParams p, protocol::parseKvTransferParams(*kv, kl));
    if (p.namesTransfer()) out->kv_transfer = std::move(p);
    out->nixl_decode_leg = protocol::isNixlDecodeLeg(*kv);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ParsedRequest> parseApiRequest(ApiKind kind, std::string_view body,
                                              const ApiLimits& limits) {
  auto obj = json::parseObject(body);
  if (!obj.ok())
    return absl::InvalidArgumentError(
        strCat("invalid JSON body: ", std::string(obj.status().message())));
  ParsedRequest out;
  out.kind = kind;
  KVF_RETURN_IF_ERROR(checkModel(*obj, limits));
  if (kind == ApiKind::kCompletions) {
    KVF_ASSIGN_OR_RETURN(out.prompt, parsePrompt(*obj, limits));
  } else {
    KVF_ASSIGN_OR_RETURN(out.prompt, parseMessages(*obj, limits));
  }
  if (out.prompt.empty()) return invalid("prompt", "must not be empty");
  auto prompt_len = static_cast<int64_t>(out.prompt.size());
  if (prompt_len >= limits.max_model_len) {
    return invalid("prompt", strCat("this model's maximum context length is ", limits.max_model_len,
                                    " tokens, but the prompt has ", prompt_len, " tokens"));
  }
  KVF_RETURN_IF_ERROR(parseSampling(*obj, kind, prompt_len, limits, &out));
  KVF_RETURN_IF_ERROR(parseStreaming(*obj, limits, &out));
  return out;
}

absl::StatusOr<std::vector<TokenId>> parseTokenizeRequest(std::string_view body,
                                                          const ApiLimits& limits) {
  auto obj = json::parseObject(body);
  if (!obj.ok())
    return absl::InvalidArgumentError(
        strCat("invalid JSON body: ", std::string(obj.status().message())));
  KVF_RETURN_IF_ERROR(checkModel(*obj, limits));
  if (obj->contains("messages")) return parseMessages(*obj, limits);
  return parsePrompt(*obj, limits);
}

std::string renderText(const std::vector<TokenId>& tokens) {
  std::string out;
  for (TokenId t : tokens) out += tokenText(t);
  return out;
}

bj::object usageJson(const CompletionSummary& s) {
  bj::object usage;
  auto completion = static_cast<int64_t>(s.output.size());
  usage["prompt_tokens"] = s.prompt_tokens;
  usage["completion_tokens"] = completion;
  usage["total_tokens"] = s.prompt_tokens + completion;
  bj::object details;
  details["cached_tokens"] = s.cached_tokens;
  if (s.tier_tokens > 0) {  // not in vLLM's usage: the engine's KV tiers (docs/tiers.md)
    details["kvf_cpu_cached_tokens"] = s.tier_tokens - s.tier_disk_tokens;
    details["kvf_disk_cached_tokens"] = s.tier_disk_tokens;
  }
  usage["prompt_tokens_details"] = std::move(details);
  return usage;
}

namespace {

bj::object envelope(ApiKind kind, const CompletionSummary& s, bool chunk) {
  bj::object o;
  o["id"] = s.id;
  if (kind == ApiKind::kCompletions) {
    o["object"] = "text_completion";
  } else {
    o["object"] = chunk ? "chat.completion.chunk" : "chat.completion";
  }
  o["created"] = s.created;
  o["model"] = s.model;
  return o;
}

}  // namespace

std::string completionBody(ApiKind kind, const CompletionSummary& s,
                           const std::optional<bj::value>& kv_transfer_params) {
  bj::object o = envelope(kind, s, false);
  bj::object choice;
  choice["index"] = 0;
  if (kind == ApiKind::kCompletions) {
    choice["text"] = renderText(s.output);
  } else {
    bj::object message;
    message["role"] = "assistant";
    message["content"] = renderText(s.output);
    choice["message"] = std::move(message);
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = s.finish_reason;
  o["choices"] = bj::array{std::move(choice)};
  o["usage"] = usageJson(s);
  if (kv_transfer_params) o["kv_transfer_params"] = *kv_transfer_params;
  if (s.kv_transfer_result) {
    o[protocol::kKvTransferResultKey] = protocol::kvTransferResultJson(*s.kv_transfer_result);
  }
  return bj::serialize(o);
}

std::string streamChunk(ApiKind kind, const CompletionSummary& s, std::string_view text, bool first,
                        const std::string* finish_reason,
                        const std::optional<bj::value>& kv_transfer_params) {
  bj::object o = envelope(kind, s, true);
  bj::object choice;
  choice["index"] = 0;
  if (kind == ApiKind::kCompletions) {
    choice["text"] = text;
  } else {
    bj::object delta;
    if (first) delta["role"] = "assistant";
    delta["content"] = text;
    choice["delta"] = std::move(delta);
  }
  choice["logprobs"] = nullptr;
  if (finish_reason != nullptr) {
    choice["finish_reason"] = *finish_reason;
  } else {
    choice["finish_reason"] = nullptr;
  }
  o["choices"] = bj::array{std::move(choice)};
  if (finish_reason != nullptr && kv_transfer_params) {
    o["kv_transfer_params"] = *kv_transfer_params;
  }
  if (finish_reason != nullptr && s.kv_transfer_result) {
    o[protocol::kKvTransferResultKey] = protocol::kvTransferResultJson(*s.kv_transfer_result);
  }
  return bj::serialize(o);
}

std::string usageChunk(ApiKind kind, const CompletionSummary& s) {
  bj::object o = envelope(kind, s, true);
  o["choices"] = bj::array{};
  o["usage"] = usageJson(s);
  return bj::serialize(o);
}

}  // namespace kvf::engine
