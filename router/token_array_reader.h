// Internal to router/fast_parse.cc: the resumable reader of a token-id array, shared by the
// single-pass scanner and the read-ahead (TokenPromptPrefetch). Pure; one thread per object.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "policy/block_hash.h"

namespace kvf::router::fast_parse_internal {

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

}  // namespace kvf::router::fast_parse_internal
