#include "router/fast_parse.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace kvf::router {
namespace fast_parse_internal {

// Reads "[" id ("," id)* "]" with every id a plain integer in [0, 2^32), resumably: advance()
// may be called on a longer prefix of the same body each time (a body still arriving) and
// stops before an id it cannot see the end of. The bulk runs 64 bytes at a time where a window
// holds only digits, commas and spaces (the usual `1234,` and `1234, `); everything else, the
// last id and every error go through the byte-at-a-time step.
class TokenArrayReader {
 public:
  enum class State { kReading, kDone, kFailed };

  // `begin`: the offset of '['.
  explicit TokenArrayReader(size_t begin) : pos_(begin) {}

  // Reads on over `body` (the body's first bytes; `complete`: all of them).
  State advance(std::string_view body, bool complete, std::vector<policy::TokenId>* ids) {
    if (state_ != State::kReading) return state_;
    const char* const base = body.data();
    const char* const end = base + body.size();
    const char* p = base + pos_;
    if (!opened_) {
      if (p == end) return complete ? fail() : state_;
      if (*p != '[') return fail();
      opened_ = true;
      pos_ = static_cast<size_t>(++p - base);
    }
    int bulk_misses = 0;  // bodies whose windows never qualify stop trying the bulk
    for (;;) {
      if (bulk_misses < 4) {
        const char* q = bulkIds(p, end, ids);
        bulk_misses = q == p ? bulk_misses + 1 : 0;
        p = q;
      }
      Step step = oneId(&p, end, complete, ids);
      pos_ = static_cast<size_t>(p - base);
      if (step == Step::kMore) continue;
      if (step == Step::kWait) return state_;
      if (step == Step::kEnd) return state_ = State::kDone;
      return fail();
    }
  }

  // After kDone: the offset just past ']'.
  size_t end() const { return pos_; }

 private:
  enum class Step { kMore, kWait, kEnd, kBad };

  State fail() { return state_ = State::kFailed; }
  static bool isSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

  // One id and what follows it, at *p (after '[' or ','); *p moves past the ',' or ']' only
  // when the whole id and its delimiter are in view.
  static Step oneId(const char** at, const char* end, bool complete,
                    std::vector<policy::TokenId>* ids) {
    const char* p = *at;
    while (p < end && isSpace(*p)) ++p;
    const char* start = p;
    uint64_t v = 0;
    while (p < end && *p >= '0' && *p <= '9' && p - start <= 10) {
      v = v * 10 + static_cast<uint64_t>(*p++ - '0');
    }
    size_t digits = static_cast<size_t>(p - start);
    if (p == end && !complete && digits <= 10) return Step::kWait;
    if (digits == 0 || digits > 10 || (digits > 1 && *start == '0') || v > UINT32_MAX) {
      return Step::kBad;
    }
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E')) return Step::kBad;  // a double
    while (p < end && isSpace(*p)) ++p;
    if (p == end) return complete ? Step::kBad : Step::kWait;
    if (*p != ',' && *p != ']') return Step::kBad;
    ids->push_back(static_cast<policy::TokenId>(v));
    *at = p + 1;
    return *p == ',' ? Step::kMore : Step::kEnd;
  }

  // Bit i of the three masks: byte i of the 64 at p is a comma / a space / a digit.
  static void classify64(const char* p, uint64_t* commas, uint64_t* spaces, uint64_t* digits) {
    *commas = *spaces = *digits = 0;
#if defined(__SSE2__)
    const __m128i comma = _mm_set1_epi8(','), space = _mm_set1_epi8(' ');
    const __m128i zero = _mm_set1_epi8('0'), nine = _mm_set1_epi8(9);
    for (int i = 0; i < 4; ++i) {
      __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * i));
      __m128i d = _mm_sub_epi8(v, zero);
      auto bits = [](__m128i m) { return static_cast<uint64_t>(_mm_movemask_epi8(m) & 0xFFFF); };
      *commas |= bits(_mm_cmpeq_epi8(v, comma)) << (16 * i);
      *spaces |= bits(_mm_cmpeq_epi8(v, space)) << (16 * i);
      *digits |= bits(_mm_cmpeq_epi8(_mm_min_epu8(d, nine), d)) << (16 * i);
    }
#else
    for (int i = 0; i < 64; ++i) {
      char c = p[i];
      *commas |= static_cast<uint64_t>(c == ',') << i;
      *spaces |= static_cast<uint64_t>(c == ' ') << i;
      *digits |= static_cast<uint64_t>(c >= '0' && c <= '9') << i;
    }
#endif
  }

  // Value of the `len` (1..8) decimal digits at the low end of `chunk` (the simdjson method:
  // digit values moved to the high bytes, then three multiplies).
  static uint64_t digitsValue(uint64_t chunk, size_t len) {
    uint64_t d = (chunk & 0x0F0F0F0F0F0F0F0FULL) << (8 * (8 - len));
    d = ((d * 2561) >> 8) & 0x00FF00FF00FF00FFULL;
    d = ((d * 6553601) >> 16) & 0x0000FFFF0000FFFFULL;
    return ((d * 42949672960001ULL) >> 32) & 0xFFFFFFFFULL;
  }

  // Ids of the form spaces? d{1,8} "," while whole 64-byte windows hold only digits, commas and
  // spaces; returns where it stopped (the start of an id; anything unusual is left to oneId).
  // Reads up to 8 bytes past a window, so it needs 72 bytes in view.
  static const char* bulkIds(const char* p, const char* end, std::vector<policy::TokenId>* ids) {
    // Ids collect here and go to the vector in batches; a window adds at most 32 (an id takes
    // at least two of its bytes).
    constexpr size_t kBatch = 256;
    policy::TokenId out[kBatch];
    size_t n = 0;
    while (end - p >= 72) {
      uint64_t commas, spaces, digits;
      classify64(p, &commas, &spaces, &digits);
      if ((commas | spaces | digits) != ~0ULL || commas == 0) break;
      if (n > kBatch - 32) {
        ids->insert(ids->end(), out, out + n);
        n = 0;
      }
      size_t start = 0;
      bool stopped = false;
      if (spaces == 0) {
        // Compact arrays: every byte between two commas is a digit.
        for (uint64_t m = commas; m != 0; m &= m - 1) {
          size_t c = static_cast<size_t>(std::countr_zero(m));
          size_t len = c - start;
          uint64_t chunk;
          std::memcpy(&chunk, p + start, sizeof chunk);
          if (len - 1 >= 8 || (len > 1 && (chunk & 0xFF) == '0')) {
            stopped = true;  // empty, over 8 digits or a leading zero: oneId decides
            break;
          }
          out[n++] = static_cast<policy::TokenId>(digitsValue(chunk, len));
          start = c + 1;
        }
        p += start;
        if (stopped) break;
        continue;
      }
      for (uint64_t m = commas; m != 0; m &= m - 1) {
        size_t c = static_cast<size_t>(std::countr_zero(m));
        uint64_t seg_digits = digits & ((1ULL << c) - 1) & ~((1ULL << start) - 1);
        if (seg_digits == 0) {
          stopped = true;
          break;
        }
        size_t first = static_cast<size_t>(std::countr_zero(seg_digits));
        size_t len = c - first;
        // Digits must run from `first` right up to the comma (spaces only before them).
        if (len > 8 || seg_digits + (1ULL << first) != (1ULL << c)) {
          stopped = true;
          break;
        }
        uint64_t chunk;
        std::memcpy(&chunk, p + first, sizeof chunk);
        if (len > 1 && (chunk & 0xFF) == '0') {
          stopped = true;
          break;
        }
        out[n++] = static_cast<policy::TokenId>(digitsValue(chunk, len));
        start = c + 1;
      }
      p += start;
      if (stopped) break;
    }
    ids->insert(ids->end(), out, out + n);
    return p;
  }

  size_t pos_;
  bool opened_ = false;
  State state_ = State::kReading;
};

// Nesting this scanner follows before it declines (json::parse allows 64).
constexpr int kMaxDepth = 32;

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
      if (key == "kv_transfer_params") out.has_kv_transfer_params = true;
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
        if (!readPlainInteger(static_cast<uint64_t>(INT64_MAX), &v)) return false;
        out.max_tokens = static_cast<int64_t>(v);
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
      if (!skipDigits()) return false;
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
    ids_.reserve(body_bytes_ / 4);  // a token id takes 2-7 bytes plus a comma
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
  if (!out.has_kv_transfer_params) out.has_kv_transfer_params = false;
  out.prompt_tokens = static_cast<int64_t>(out.token_ids.size());
  return out;
}

}  // namespace kvf::router
