#include "router/fast_parse.h"

#include <bit>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <string>

namespace kvf::router {
namespace {

// Nesting this scanner follows before it declines (json::parse allows 64).
constexpr int kMaxDepth = 32;

// A strict JSON scanner (RFC 8259: no comments, no trailing commas) specialised for one
// document shape. Every method returns false to decline: on invalid JSON, and on valid JSON it
// does not handle itself (non-ASCII or escaped text in fields it reads, numbers that are not
// plain integers, duplicate fields...). Declining is always safe: the DOM path then decides.
class TokenCompletionScanner {
 public:
  explicit TokenCompletionScanner(std::string_view body)
      : p_(body.data()), end_(body.data() + body.size()) {
    out.token_ids.reserve(body.size() / 4);  // a token id takes 2-7 bytes plus a comma
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

  ParsedRequest out;

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
    if (field == 0) return skipValue(1);
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
        if (!readPlainInteger(static_cast<uint64_t>(INT64_MAX), &v)) return false;
        out.max_tokens = static_cast<int64_t>(v);
        return true;
      }
      default:
        return readTokenArray();
    }
  }

  // "[" id ("," id)* "]" with every id a plain integer in [0, 2^32). The bulk of the body: it
  // runs on a local cursor (a member would be reloaded after every store into the vector), and
  // the usual "1234," is read eight bytes at a time.
  bool readTokenArray() {
    if (!consume('[')) return false;
    const char* p = p_;
    const char* const end = end_;
    auto space = [&] {
      while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) ++p;
    };
    std::vector<policy::TokenId>& ids = out.token_ids;
    for (;;) {
      if (end - p >= 8) {
        uint64_t id = 0;
        size_t used = idThenComma(p, &id);
        if (used > 0) {
          ids.push_back(static_cast<policy::TokenId>(id));
          p += used;
          continue;
        }
      }
      // Everything else: spaces, the last id, long ids, and the errors.
      space();
      const char* start = p;
      uint64_t v = 0;
      while (p < end && isDigit(*p) && p - start <= 10) {
        v = v * 10 + static_cast<uint64_t>(*p++ - '0');
      }
      size_t digits = static_cast<size_t>(p - start);
      if (digits == 0 || digits > 10 || (digits > 1 && *start == '0') || v > UINT32_MAX) {
        return false;
      }
      if (p < end && (*p == '.' || *p == 'e' || *p == 'E')) return false;  // a double
      ids.push_back(static_cast<policy::TokenId>(v));
      space();
      if (p < end && *p == ',') {
        ++p;
        continue;
      }
      if (p < end && *p == ']') {
        p_ = p + 1;
        return true;
      }
      return false;
    }
  }

  // "d{1,7}," at p (8 readable bytes): the id's value and the bytes taken, or 0 for anything
  // else. Finds the first non-digit byte with nibble tests and converts the digits with three
  // multiplies (the simdjson method).
  static size_t idThenComma(const char* p, uint64_t* id) {
    uint64_t chunk;
    std::memcpy(&chunk, p, sizeof chunk);
    constexpr uint64_t kHigh = 0xF0F0F0F0F0F0F0F0ULL, kThrees = 0x3030303030303030ULL;
    // A byte is a digit iff its high nibble is 3 before and after adding 6 (a carry out of a
    // byte >= 0xFA only disturbs bytes after the first non-digit).
    uint64_t non_digit =
        ((chunk & kHigh) ^ kThrees) | (((chunk + 0x0606060606060606ULL) & kHigh) ^ kThrees);
    if (non_digit == 0) return 0;
    size_t digits = static_cast<size_t>(std::countr_zero(non_digit)) / 8;
    bool leading_zero = digits > 1 && (chunk & 0xFF) == '0';
    if (digits == 0 || leading_zero || static_cast<char>(chunk >> (8 * digits)) != ',') return 0;
    // Digit values in the high bytes, zeros (leading '0's) below, most significant first.
    uint64_t d = (chunk & 0x0F0F0F0F0F0F0F0FULL) << (8 * (8 - digits));
    d = ((d * 2561) >> 8) & 0x00FF00FF00FF00FFULL;
    d = ((d * 6553601) >> 16) & 0x0000FFFF0000FFFFULL;
    *id = ((d * 42949672960001ULL) >> 32) & 0xFFFFFFFFULL;
    return digits + 1;
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
      if (!skipDigits()) return false;
    }
    return true;
  }
  bool skipDigits() {
    const char* start = p_;
    while (p_ < end_ && isDigit(*p_)) ++p_;
    return p_ != start;
  }

  const char* p_;
  const char* end_;
  unsigned seen_ = 0;
};

}  // namespace

std::optional<ParsedRequest> fastParseTokenCompletion(std::string_view body) {
  TokenCompletionScanner scanner(body);
  if (!scanner.scan()) return std::nullopt;
  ParsedRequest out = std::move(scanner.out);
  out.has_token_ids = true;
  out.prompt_tokens = static_cast<int64_t>(out.token_ids.size());
  return out;
}

}  // namespace kvf::router
