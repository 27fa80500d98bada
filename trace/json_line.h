// A fast scanner for flat one-object-per-line JSON records (Mooncake, bailian and our session
// JSONL): keys, integers, exact decimal timestamps, strings and integer arrays, without building
// a DOM. Used by the JSONL readers on their hot path; one scanner per line, single-threaded.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvf::trace {

class JsonLineScanner {
 public:
  explicit JsonLineScanner(std::string_view text)
      : p_(text.data()), end_(text.data() + text.size()) {}

  // Consumes the opening '{'. False on anything else.
  bool begin();
  // Reads the next key and its ':'; false at the closing '}' (then done() is true) or on a
  // syntax error (then error() is set).
  bool nextKey(std::string_view* key);
  // Value readers: each consumes one value and the ',' after it. False on error (see error()).
  bool readInt(int64_t* out);
  // A JSON number scaled by 10^scale_digits and truncated to an integer exactly (no binary
  // floating point), e.g. "61.114" with scale 9 -> 61114000000. Exponents are accepted.
  bool readScaled(int scale_digits, int64_t* out);
  bool readDouble(double* out);
  bool readString(std::string* out);
  // A string or an integer, as text (ids may be either).
  bool readIdText(std::string* out);
  bool readUintArray(std::vector<uint64_t>* out);
  bool isNull();  // consumes `null` (and ',') when it is next
  bool skipValue();
  // True once the closing '}' was consumed and only whitespace follows.
  bool done() const { return done_; }
  const std::string& error() const { return error_; }

 private:
  void skipWs() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\r' || *p_ == '\n')) ++p_;
  }
  bool afterValue();
  bool fail(std::string message);
  bool parseUint(uint64_t* out);
  bool skipNested(int depth);

  const char* p_;
  const char* end_;
  bool done_ = false;
  bool expect_more_ = false;  // a ',' was consumed, another key must follow
  std::string error_;
};

// Appends `text` as a JSON string literal (quoted, escaped) to `out`.
void appendJsonString(std::string* out, std::string_view text);

}  // namespace kvf::trace
