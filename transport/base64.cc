#include "transport/base64.h"

#include <array>
#include <cstdint>

#include "common/strings.h"

namespace kvf::transport {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<int8_t, 256> makeDecodeTable() {
  std::array<int8_t, 256> table{};
  for (auto& v : table) v = -1;
  for (int i = 0; i < 64; ++i) table[static_cast<uint8_t>(kAlphabet[i])] = static_cast<int8_t>(i);
  return table;
}

constexpr std::array<int8_t, 256> kDecode = makeDecodeTable();

}  // namespace

std::string base64Encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    uint32_t v = (uint32_t(uint8_t(bytes[i])) << 16) | (uint32_t(uint8_t(bytes[i + 1])) << 8) |
                 uint32_t(uint8_t(bytes[i + 2]));
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(kAlphabet[(v >> 6) & 63]);
    out.push_back(kAlphabet[v & 63]);
  }
  size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (rest == 2) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(rest == 2 ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

absl::StatusOr<std::string> base64Decode(std::string_view text, size_t max_decoded) {
  if (text.size() % 4 != 0) {
    return absl::InvalidArgumentError(
        strCat("base64: length ", text.size(), " is not a multiple of 4"));
  }
  size_t padding = 0;
  if (!text.empty() && text.back() == '=')
    padding = text.size() >= 2 && text[text.size() - 2] == '=' ? 2 : 1;
  size_t decoded = text.size() / 4 * 3 - padding;
  if (decoded > max_decoded) {
    return absl::InvalidArgumentError(
        strCat("base64: decoded size ", decoded, " exceeds the limit of ", max_decoded));
  }
  std::string out;
  out.reserve(decoded);
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t v = 0;
    for (size_t j = 0; j < 4; ++j) {
      char c = text[i + j];
      bool pad_ok = c == '=' && i + 4 == text.size() && j >= 4 - padding;
      int8_t d = pad_ok ? 0 : kDecode[static_cast<uint8_t>(c)];
      if (d < 0) {
        return absl::InvalidArgumentError(strCat("base64: invalid character at offset ", i + j));
      }
      v = (v << 6) | uint32_t(d);
    }
    out.push_back(static_cast<char>((v >> 16) & 0xff));
    out.push_back(static_cast<char>((v >> 8) & 0xff));
    out.push_back(static_cast<char>(v & 0xff));
  }
  out.resize(decoded);
  return out;
}

}  // namespace kvf::transport
