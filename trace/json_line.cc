#include "trace/json_line.h"

#include <charconv>
#include <cmath>
#include <limits>

namespace kvf::trace {

namespace {

constexpr int kMaxNesting = 64;

void appendUtf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool hex4(const char* p, const char* end, uint32_t* out) {
  if (end - p < 4) return false;
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) {
    char c = p[i];
    v <<= 4;
    if (c >= '0' && c <= '9')
      v |= static_cast<uint32_t>(c - '0');
    else if (c >= 'a' && c <= 'f')
      v |= static_cast<uint32_t>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      v |= static_cast<uint32_t>(c - 'A' + 10);
    else
      return false;
  }
  *out = v;
  return true;
}

}  // namespace

bool JsonLineScanner::fail(std::string message) {
  if (error_.empty()) error_ = std::move(message);
  return false;
}

bool JsonLineScanner::begin() {
  skipWs();
  if (p_ >= end_ || *p_ != '{') return fail("expected a JSON object ('{')");
  ++p_;
  skipWs();
  if (p_ < end_ && *p_ == '}') {
    ++p_;
    skipWs();
    if (p_ != end_) return fail("unexpected text after the object");
    done_ = true;
  }
  return true;
}

bool JsonLineScanner::afterValue() {
  skipWs();
  if (p_ < end_ && *p_ == ',') {
    ++p_;
    expect_more_ = true;
    return true;
  }
  if (p_ < end_ && *p_ == '}') {
    ++p_;
    skipWs();
    if (p_ != end_) return fail("unexpected text after the object");
    done_ = true;
    expect_more_ = false;
    return true;
  }
  return fail("expected ',' or '}' after a value");
}

bool JsonLineScanner::nextKey(std::string_view* key) {
  if (done_) return false;
  skipWs();
  if (p_ >= end_ || *p_ != '"') return fail("expected a quoted key");
  const char* start = ++p_;
  while (p_ < end_ && *p_ != '"') {
    if (*p_ == '\\') return fail("escaped characters in keys are not supported");
    ++p_;
  }
  if (p_ >= end_) return fail("unterminated key");
  *key = std::string_view(start, static_cast<size_t>(p_ - start));
  ++p_;
  skipWs();
  if (p_ >= end_ || *p_ != ':') return fail("expected ':' after a key");
  ++p_;
  skipWs();
  return true;
}

bool JsonLineScanner::parseUint(uint64_t* out) {
  const char* start = p_;
  uint64_t v = 0;
  while (p_ < end_ && *p_ >= '0' && *p_ <= '9') {
    uint64_t d = static_cast<uint64_t>(*p_ - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) return fail("integer out of range");
    v = v * 10 + d;
    ++p_;
  }
  if (p_ == start) return fail("expected a number");
  *out = v;
  return true;
}

bool JsonLineScanner::readInt(int64_t* out) {
  bool negative = p_ < end_ && *p_ == '-';
  if (negative) ++p_;
  uint64_t v = 0;
  if (!parseUint(&v)) return false;
  if (p_ < end_ && (*p_ == '.' || *p_ == 'e' || *p_ == 'E')) {
    // Accept integral values written as floats ("12.0"), reject real fractions.
    const char* frac = p_;
    if (*p_ == '.') {
      ++p_;
      while (p_ < end_ && *p_ == '0') ++p_;
      if (p_ < end_ && *p_ >= '1' && *p_ <= '9') return fail("expected an integer");
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    }
    if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
      p_ = frac;
      return fail("expected an integer without exponent");
    }
  }
  if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return fail("integer out of range");
  }
  *out = negative ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
  return afterValue();
}

bool JsonLineScanner::readScaled(int scale_digits, int64_t* out) {
  const char* start = p_;
  bool negative = p_ < end_ && *p_ == '-';
  if (negative) ++p_;
  uint64_t whole = 0;
  if (!parseUint(&whole)) return false;
  uint64_t v = whole;
  int digits_left = scale_digits;
  constexpr uint64_t kLimit = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  auto times10 = [&v, kLimit](uint64_t add) {
    if (v > (kLimit - add) / 10) return false;
    v = v * 10 + add;
    return true;
  };
  if (p_ < end_ && *p_ == '.') {
    ++p_;
    if (p_ >= end_ || *p_ < '0' || *p_ > '9') return fail("expected digits after '.'");
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9') {
      if (digits_left > 0) {
        if (!times10(static_cast<uint64_t>(*p_ - '0'))) return fail("number out of range");
        --digits_left;
      }
      ++p_;
    }
  }
  if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
    // Rare in traces: fall back to a correctly rounded double.
    const char* num_end = p_ + 1;
    while (num_end < end_ &&
           (*num_end == '+' || *num_end == '-' || (*num_end >= '0' && *num_end <= '9'))) {
      ++num_end;
    }
    double d = 0;
    auto [ptr, ec] = std::from_chars(start, num_end, d);
    if (ec != std::errc() || ptr != num_end || !std::isfinite(d)) return fail("bad number");
    double scaled = d * std::pow(10.0, scale_digits);
    if (std::fabs(scaled) > 9e18) return fail("number out of range");
    p_ = num_end;
    *out = static_cast<int64_t>(scaled);
    return afterValue();
  }
  while (digits_left-- > 0) {
    if (!times10(0)) return fail("number out of range");
  }
  if (v > kLimit) return fail("number out of range");
  *out = negative ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
  return afterValue();
}

bool JsonLineScanner::readDouble(double* out) {
  const char* start = p_;
  while (p_ < end_ && (*p_ == '-' || *p_ == '+' || *p_ == '.' || *p_ == 'e' || *p_ == 'E' ||
                       (*p_ >= '0' && *p_ <= '9'))) {
    ++p_;
  }
  auto [ptr, ec] = std::from_chars(start, p_, *out);
  if (ec != std::errc() || ptr != p_ || p_ == start || !std::isfinite(*out)) {
    return fail("expected a number");
  }
  return afterValue();
}

bool JsonLineScanner::readString(std::string* out) {
  out->clear();
  if (p_ >= end_ || *p_ != '"') return fail("expected a string");
  ++p_;
  while (p_ < end_ && *p_ != '"') {
    char c = *p_++;
    if (static_cast<unsigned char>(c) < 0x20) return fail("control character in a string");
    if (c != '\\') {
      out->push_back(c);
      continue;
    }
    if (p_ >= end_) break;
    char e = *p_++;
    switch (e) {
      case '"':
        out->push_back('"');
        break;
      case '\\':
        out->push_back('\\');
        break;
      case '/':
        out->push_back('/');
        break;
      case 'b':
        out->push_back('\b');
        break;
      case 'f':
        out->push_back('\f');
        break;
      case 'n':
        out->push_back('\n');
        break;
      case 'r':
        out->push_back('\r');
        break;
      case 't':
        out->push_back('\t');
        break;
      case 'u': {
        uint32_t cp = 0;
        if (!hex4(p_, end_, &cp)) return fail("bad \\u escape");
        p_ += 4;
        if (cp >= 0xD800 && cp < 0xDC00) {
          uint32_t lo = 0;
          if (end_ - p_ < 6 || p_[0] != '\\' || p_[1] != 'u' || !hex4(p_ + 2, end_, &lo) ||
              lo < 0xDC00 || lo > 0xDFFF) {
            return fail("unpaired surrogate in \\u escape");
          }
          p_ += 6;
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        appendUtf8(out, cp);
        break;
      }
      default:
        return fail("bad escape in a string");
    }
  }
  if (p_ >= end_) return fail("unterminated string");
  ++p_;
  return afterValue();
}

bool JsonLineScanner::readIdText(std::string* out) {
  if (p_ < end_ && *p_ == '"') return readString(out);
  int64_t v = 0;
  if (!readInt(&v)) return fail("expected a string or an integer");
  *out = std::to_string(v);
  return true;
}

bool JsonLineScanner::readUintArray(std::vector<uint64_t>* out) {
  out->clear();
  if (p_ >= end_ || *p_ != '[') return fail("expected an array");
  ++p_;
  skipWs();
  if (p_ < end_ && *p_ == ']') {
    ++p_;
    return afterValue();
  }
  while (true) {
    skipWs();
    uint64_t v = 0;
    if (p_ < end_ && *p_ == '-') return fail("negative value in an id array");
    if (p_ >= end_ || *p_ < '0' || *p_ > '9') {
      return fail("expected a non-negative integer in the array");
    }
    if (!parseUint(&v)) return false;
    out->push_back(v);
    skipWs();
    if (p_ < end_ && *p_ == ',') {
      ++p_;
      continue;
    }
    if (p_ < end_ && *p_ == ']') {
      ++p_;
      return afterValue();
    }
    return fail("expected ',' or ']' in an array (integers only)");
  }
}

bool JsonLineScanner::isNull() {
  if (end_ - p_ >= 4 && std::string_view(p_, 4) == "null") {
    p_ += 4;
    return afterValue();
  }
  return false;
}

bool JsonLineScanner::skipNested(int depth) {
  if (depth > kMaxNesting) return fail("nesting too deep");
  skipWs();
  if (p_ >= end_) return fail("truncated value");
  char c = *p_;
  if (c == '"') {
    ++p_;
    while (p_ < end_ && *p_ != '"') p_ += (*p_ == '\\') ? 2 : 1;
    if (p_ >= end_) return fail("unterminated string");
    ++p_;
    return true;
  }
  if (c == '{' || c == '[') {
    char close = c == '{' ? '}' : ']';
    ++p_;
    skipWs();
    if (p_ < end_ && *p_ == close) {
      ++p_;
      return true;
    }
    while (true) {
      if (c == '{') {
        if (!skipNested(depth + 1)) return false;  // key
        skipWs();
        if (p_ >= end_ || *p_ != ':') return fail("expected ':'");
        ++p_;
      }
      if (!skipNested(depth + 1)) return false;
      skipWs();
      if (p_ < end_ && *p_ == ',') {
        ++p_;
        continue;
      }
      if (p_ < end_ && *p_ == close) {
        ++p_;
        return true;
      }
      return fail("malformed nested value");
    }
  }
  const char* start = p_;
  while (p_ < end_ && *p_ != ',' && *p_ != '}' && *p_ != ']' && *p_ != ' ') ++p_;
  std::string_view lit(start, static_cast<size_t>(p_ - start));
  if (lit == "true" || lit == "false" || lit == "null") return true;
  double d = 0;
  auto [ptr, ec] = std::from_chars(start, p_, d);
  if (ec != std::errc() || ptr != p_ || lit.empty()) return fail("malformed value");
  return true;
}

bool JsonLineScanner::skipValue() {
  if (!skipNested(0)) return false;
  return afterValue();
}

void appendJsonString(std::string* out, std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (char c : text) {
    auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (u < 0x20) {
      out->append("\\u00");
      out->push_back(kHex[u >> 4]);
      out->push_back(kHex[u & 0xF]);
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}

}  // namespace kvf::trace
