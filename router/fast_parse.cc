#include "router/fast_parse.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "router/token_array_reader.h"

namespace kvf::router {
namespace fast_parse_internal {

// A strict JSON scanner (RFC 8259: no comments, no trailing commas) specialised for one
// document shape. Every method returns false to decline: on invalid JSON, and on valid JSON it
// does not handle itself (non-ASCII or escaped text in fields it reads, numbers that are not
// plain integers, duplicate fields...). Declining is always safe: the DOM path then decides.
class TokenCompletionScanner {
 public:
  TokenCompletionScanner(std::string_view body, TokenPromptPrefetch* prefetch)
      : body_(body), p_(body.data()), end_(body.data() + body.size()), prefetch_(prefetch) {
    if (prefetch == nullptr) out.token_ids.reserve(body.size() / 4);  // 2-7 bytes per id
  }

  bool scan() {
    skipSpace();
    if (!consume('{')) return false;
    skipSpace();
    if (peek() == '}') return false;  // no model, no prompt
    for (;;) {
      skipSpace();
      std::string_view key;
      if (!readPlainString(&key)) return false;
      skipSpace();
      if (!consume(':')) return false;
      skipSpace();
      if (!readMember(key)) return false;
      skipSpace();
      if (consume(',')) continue;
      if (!consume('}')) return false;
      break;
    }
    skipSpace();
    return p_ == end_ && (seen_ & kModel) && (seen_ & kPrompt);
  }

  // Up to the '[' of a top-level "prompt" member: its offset, or nullopt (declined, or not in
  // view yet: `body` may be a prefix of the document).
  std::optional<size_t> locatePrompt() {
    skipSpace();
    if (!consume('{')) return std::nullopt;
    for (;;) {
      skipSpace();
      std::string_view key;
      if (!readPlainString(&key)) return std::nullopt;
      skipSpace();
      if (!consume(':')) return std::nullopt;
      skipSpace();
      if (key == "prompt") {
        if (peek() != '[') return std::nullopt;
        return offset();
      }
      if (!skipValue(1)) return std::nullopt;
      skipSpace();
      if (!consume(',')) return std::nullopt;
    }
  }

  ParsedRequest out;
  bool used_prefetch = false;

 private:
  static constexpr unsigned kModel = 1, kStream = 2, kMaxTokens = 4, kUser = 8, kPrompt = 16;

  char peek() const { return p_ < end_ ? *p_ : '\0'; }
  bool consume(char c) {
    if (peek() != c) return false;
    ++p_;
    return true;
  }
  void skipSpace() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  static bool isDigit(char c) { return c >= '0' && c <= '9'; }

  bool readMember(std::string_view key) {
    unsigned field = key == "model"        ? kModel
                     : key == "stream"     ? kStream
                     : key == "max_tokens" ? kMaxTokens
                     : key == "user"       ? kUser
                     : key == "prompt"     ? kPrompt
                                           : 0u;
    if (field == 0) {
      // Keys are plain text here (readPlainString declines escapes), so this is exact.
      if (key == protocol::kKvTransferParamsKey) out.has_kv_transfer_params = true;
      // Fields that change the prompt's hashes: the DOM path reads and validates them.
      if (key == "cache_salt" || key == kMmItemsField) return false;
      return skipValue(1);
    }
    if (seen_ & field) return false;  // duplicate: the DOM path applies its rule
    seen_ |= field;
    // null is "not given" for the optional fields (as json::get*Or); model and prompt need one.
    if (field != kModel && field != kPrompt && peek() == 'n') return literal("null");
    std::string_view text;
    switch (field) {
      case kModel:
      case kUser:
        if (!readPlainString(&text)) return false;
        (field == kModel ? out.model : out.session) = std::string(text);
        return true;
      case kStream:
        out.stream = peek() == 't';
        return literal(out.stream ? "true" : "false");
      case kMaxTokens: {
        uint64_t v = 0;
        // Out of range declines: the DOM path answers the error naming the field.
        if (!readPlainInteger(static_cast<uint64_t>(kMaxClientTokens), &v)) return false;
        out.max_tokens = static_cast<int64_t>(v);
        out.max_tokens_given = true;
        return true;
      }
      default:
        return readPrompt();
    }
  }

  size_t offset() const { return static_cast<size_t>(p_ - body_.data()); }

  // The token ids, resuming the prefetch's reading when it started on this very array.
  bool readPrompt() {
    TokenArrayReader local(offset());
    TokenArrayReader* reader = &local;
    std::vector<policy::TokenId>* ids = &out.token_ids;
    if (prefetch_ != nullptr && prefetch_->reader_ && prefetch_->array_begin_ == offset()) {
      reader = prefetch_->reader_.get();
      ids = &prefetch_->ids_;
    }
    if (reader->advance(body_, true, ids) != TokenArrayReader::State::kDone) return false;
    if (ids != &out.token_ids) {
      out.token_ids = std::move(*ids);
      used_prefetch = true;
    }
    p_ = body_.data() + reader->end();
    return true;
  }

  // Digits only (no sign, fraction or exponent), no leading zero, at most `max`.
  bool readPlainInteger(uint64_t max, uint64_t* out_value) {
    const char* start = p_;
    uint64_t v = 0;
    while (p_ < end_ && isDigit(*p_)) {
      if (p_ - start >= 19) return false;  // beyond any bound we take; cannot overflow below
      v = v * 10 + static_cast<uint64_t>(*p_ - '0');
      ++p_;
    }
    size_t digits = static_cast<size_t>(p_ - start);
    if (digits == 0 || (digits > 1 && *start == '0') || v > max) return false;
    char next = peek();
    if (next == '.' || next == 'e' || next == 'E') return false;  // a double in the DOM
    *out_value = v;
    return true;
  }

  // A string of printable ASCII without escapes, returned as it stands in the body.
  bool readPlainString(std::string_view* text) {
    if (!consume('"')) return false;
    const char* start = p_;
    while (p_ < end_) {
      unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        *text = std::string_view(start, static_cast<size_t>(p_ - start));
        ++p_;
        return true;
      }
      if (c == '\\' || c < 0x20 || c >= 0x80) return false;
      ++p_;
    }
    return false;
  }

  bool literal(std::string_view word) {
    if (static_cast<size_t>(end_ - p_) < word.size() || std::string_view(p_, word.size()) != word)
      return false;
    p_ += word.size();
    return true;
  }

  // Validates one value that the router does not read. Non-ASCII text declines (UTF-8
  // validation is left to the DOM path).
  bool skipValue(int depth) {
    switch (peek()) {
      case '{':
      case '[':
        return skipContainer(depth + 1);
      case '"':
        return skipString();
      case 't':
        return literal("true");
      case 'f':
        return literal("false");
      case 'n':
        return literal("null");
      default:
        return skipNumber();
    }
  }

  bool skipContainer(int depth) {
    if (depth > kMaxDepth) return false;
    bool object = *p_ == '{';
    char close = object ? '}' : ']';
    ++p_;
    skipSpace();
    if (consume(close)) return true;
    for (;;) {
      skipSpace();
      if (object) {
        if (!skipString()) return false;
        skipSpace();
        if (!consume(':')) return false;
        skipSpace();
      }
      if (!skipValue(depth)) return false;
      skipSpace();
      if (consume(',')) continue;
      return consume(close);
    }
  }

  bool skipString() {
    if (!consume('"')) return false;
    while (p_ < end_) {
      unsigned char c = static_cast<unsigned char>(*p_++);
      if (c == '"') return true;
      if (c < 0x20 || c >= 0x80) return false;
      if (c != '\\') continue;
      if (p_ == end_) return false;
      char e = *p_++;
      if (e == 'u') {
        for (int i = 0; i < 4; ++i, ++p_) {
          if (p_ == end_ || !std::isxdigit(static_cast<unsigned char>(*p_))) return false;
        }
      } else if (std::string_view("\"\\/bfnrt").find(e) == std::string_view::npos) {
        return false;
      }
    }
    return false;
  }

  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  bool skipNumber() {
    consume('-');
    if (consume('0')) {
      if (isDigit(peek())) return false;
    } else if (!skipDigits()) {
      return false;
    }
    if (consume('.') && !skipDigits()) return false;
    if (peek() == 'e' || peek() == 'E') {
      ++p_;
      if (!consume('+')) consume('-');
      const char* digits = p_;
      if (!skipDigits()) return false;
      // The DOM parser refuses an exponent past a 32-bit int ("exponent overflow"); longer
      // ones are left to it (nullopt: the DOM path decides).
      if (p_ - digits > 9) return false;
    }
    return true;
  }
  bool skipDigits() {
    const char* start = p_;
    while (p_ < end_ && isDigit(*p_)) ++p_;
    return p_ != start;
  }

  std::string_view body_;
  const char* p_;
  const char* end_;
  TokenPromptPrefetch* prefetch_;
  unsigned seen_ = 0;
};

}  // namespace fast_parse_internal

using fast_parse_internal::TokenArrayReader;
using fast_parse_internal::TokenCompletionScanner;

TokenPromptPrefetch::TokenPromptPrefetch(size_t body_bytes) : body_bytes_(body_bytes) {}
TokenPromptPrefetch::~TokenPromptPrefetch() = default;

void TokenPromptPrefetch::feed(std::string_view received) {
  if (gave_up_) return;
  if (!reader_) {
    TokenCompletionScanner scanner(received, nullptr);
    std::optional<size_t> at = scanner.locatePrompt();
    if (!at) {
      // What precedes the prompt is short in practice; past this it is not worth waiting for.
      constexpr size_t kLocateWithinBytes = 64 * 1024;
      gave_up_ = received.size() >= std::min(body_bytes_, kLocateWithinBytes);
      return;
    }
    array_begin_ = *at;
    reader_ = std::make_unique<TokenArrayReader>(*at);
    // A token id takes 2-7 bytes plus a comma. Reserve for what has arrived, not for the
    // announced length: a peer that announces 32 MiB and sends a few bytes costs little.
    ids_.reserve(std::min(body_bytes_, 2 * received.size()) / 4);
  }
  bool complete = received.size() >= body_bytes_;
  if (reader_->advance(received, complete, &ids_) == TokenArrayReader::State::kFailed) {
    gave_up_ = true;
  }
}

void PromptReadAhead::onBody(std::string_view received, size_t total) {
  if (received.size() >= total) return;  // the final parse reads the rest in one go
  if (!prefetch_) prefetch_.emplace(total);
  prefetch_->feed(received);
  policy::completeBlockHashes(prefetch_->ids(), block_size_, &hashes_);
}

std::optional<ParsedRequest> fastParseTokenCompletion(std::string_view body,
                                                      TokenPromptPrefetch* prefetch) {
  TokenCompletionScanner scanner(body, prefetch);
  if (!scanner.scan()) return std::nullopt;
  if (prefetch != nullptr) prefetch->used_ = scanner.used_prefetch;
  ParsedRequest out = std::move(scanner.out);
  out.has_token_ids = true;
  out.prompt_tokens = static_cast<int64_t>(out.token_ids.size());
  return out;
}

}  // namespace kvf::router
