#include "router/fast_parse.h"

#include <cstdint>
#include <string>

#include <boost/json/basic_parser_impl.hpp>

namespace kvf::router {
namespace {

namespace bj = boost::json;
using boost::system::error_code;

constexpr size_t kMaxDepth = 64;  // as json::parse's default, so the same bodies parse

// Collects the routing fields of a token-id completion from parser events. A handler that
// returns false stops the parse; `fallback` then says "not this shape" (the DOM path decides).
class TokenCompletionHandler {
 public:
  static constexpr std::size_t max_object_size = std::size_t(-1);
  static constexpr std::size_t max_array_size = std::size_t(-1);
  static constexpr std::size_t max_key_size = std::size_t(-1);
  static constexpr std::size_t max_string_size = std::size_t(-1);

  explicit TokenCompletionHandler(size_t body_bytes) {
    // A token id takes 2-7 bytes plus a comma in the body.
    out.token_ids.reserve(body_bytes / 4);
  }

  bool on_document_begin(error_code&) { return true; }
  bool on_document_end(error_code&) { return true; }

  bool on_object_begin(error_code&) {
    if (depth_ == 1 && field_ != Field::kOther) return false;  // our fields are not objects
    if (in_prompt_) return false;
    ++depth_;
    return true;
  }
  bool on_object_end(std::size_t, error_code&) {
    --depth_;
    return true;
  }
  bool on_array_begin(error_code&) {
    if (depth_ == 0 || in_prompt_) return false;  // root must be an object; flat prompts only
    if (depth_ == 1 && field_ == Field::kPrompt) {
      in_prompt_ = true;
    } else if (depth_ == 1 && field_ != Field::kOther) {
      return false;
    }
    ++depth_;
    return true;
  }
  bool on_array_end(std::size_t n, error_code&) {
    --depth_;
    if (in_prompt_ && depth_ == 1) {
      in_prompt_ = false;
      if (n == 0) return false;  // the DOM path names the error
      prompt_done_ = true;
    }
    return true;
  }

  bool on_key_part(bj::string_view s, std::size_t, error_code&) {
    if (depth_ == 1) key_.append(s.data(), s.size());
    return true;
  }
  bool on_key(bj::string_view s, std::size_t, error_code&) {
    if (depth_ != 1) return true;
    key_.append(s.data(), s.size());
    field_ = fieldOf(key_);
    key_.clear();
    if (field_ == Field::kOther) return true;
    unsigned bit = 1u << static_cast<unsigned>(field_);
    if (seen_ & bit) return false;  // duplicate: let the DOM path apply its rule
    seen_ |= bit;
    return true;
  }

  bool on_string_part(bj::string_view s, std::size_t, error_code&) {
    if (in_prompt_) return false;
    if (depth_ == 1 && (field_ == Field::kModel || field_ == Field::kUser)) {
      value_.append(s.data(), s.size());
    }
    return true;
  }
  bool on_string(bj::string_view s, std::size_t, error_code&) {
    if (in_prompt_) return false;
    if (depth_ != 1) return true;
    switch (field_) {
      case Field::kOther:
        return true;
      case Field::kModel:
      case Field::kUser:
        value_.append(s.data(), s.size());
        (field_ == Field::kModel ? out.model : out.session) = std::move(value_);
        value_.clear();
        if (field_ == Field::kModel) model_done_ = true;
        return true;
      default:
        return false;
    }
  }

  bool on_number_part(bj::string_view, error_code&) { return true; }
  bool on_int64(int64_t v, bj::string_view, error_code&) {
    if (in_prompt_) return pushToken(v >= 0 && v <= UINT32_MAX, static_cast<uint64_t>(v));
    if (depth_ != 1 || field_ == Field::kOther) return true;
    if (field_ != Field::kMaxTokens || v < 0) return false;
    out.max_tokens = v;
    return true;
  }
  bool on_uint64(uint64_t v, bj::string_view, error_code&) {
    if (in_prompt_) return pushToken(v <= UINT32_MAX, v);
    if (depth_ != 1 || field_ == Field::kOther) return true;
    if (field_ != Field::kMaxTokens || v > static_cast<uint64_t>(INT64_MAX)) return false;
    out.max_tokens = static_cast<int64_t>(v);
    return true;
  }
  bool on_double(double, bj::string_view, error_code&) { return scalarOfOtherField(); }
  bool on_bool(bool b, error_code&) {
    if (in_prompt_) return false;
    if (depth_ == 1 && field_ == Field::kStream) {
      out.stream = b;
      return true;
    }
    return scalarOfOtherField();
  }
  bool on_null(error_code&) {
    if (in_prompt_) return false;
    // As json::get*Or: null is "not given" for the optional fields.
    if (depth_ == 1 && (field_ == Field::kStream || field_ == Field::kMaxTokens ||
                        field_ == Field::kUser)) {
      return true;
    }
    return scalarOfOtherField();
  }
  bool on_comment_part(bj::string_view, error_code&) { return true; }
  bool on_comment(bj::string_view, error_code&) { return true; }

  // Whether the document had the shape this path handles.
  bool complete() const { return model_done_ && prompt_done_; }

  ParsedRequest out;

 private:
  enum class Field : unsigned { kModel, kStream, kMaxTokens, kUser, kPrompt, kOther };

  static Field fieldOf(std::string_view key) {
    if (key == "model") return Field::kModel;
    if (key == "stream") return Field::kStream;
    if (key == "max_tokens") return Field::kMaxTokens;
    if (key == "user") return Field::kUser;
    if (key == "prompt") return Field::kPrompt;
    return Field::kOther;
  }
  bool pushToken(bool in_range, uint64_t v) {
    if (!in_range) return false;
    out.token_ids.push_back(static_cast<policy::TokenId>(v));
    return true;
  }
  // A scalar (not a token) where one of our fields wants another type; others' values pass.
  bool scalarOfOtherField() const { return !in_prompt_ && (depth_ != 1 || field_ == Field::kOther); }

  size_t depth_ = 0;
  Field field_ = Field::kOther;
  unsigned seen_ = 0;
  bool in_prompt_ = false;
  bool prompt_done_ = false;
  bool model_done_ = false;
  std::string key_;
  std::string value_;
};

}  // namespace

std::optional<ParsedRequest> fastParseTokenCompletion(std::string_view body) {
  bj::parse_options options;
  options.max_depth = kMaxDepth;
  bj::basic_parser<TokenCompletionHandler> parser(options, body.size());
  error_code ec;
  size_t used = parser.write_some(false, body.data(), body.size(), ec);
  if (ec || used != body.size() || !parser.handler().complete()) return std::nullopt;
  ParsedRequest out = std::move(parser.handler().out);
  out.has_token_ids = true;
  out.prompt_tokens = static_cast<int64_t>(out.token_ids.size());
  return out;
}

}  // namespace kvf::router
