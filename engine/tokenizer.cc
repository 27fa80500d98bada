#include "engine/tokenizer.h"

#include <xxhash.h>

#include <array>

namespace kvf::engine {
namespace {

bool isWordChar(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c >= 0x80;
}

}  // namespace

std::vector<worker::TokenId> tokenize(std::string_view text, int64_t vocab_size) {
  std::vector<worker::TokenId> out;
  const auto span = static_cast<uint64_t>(vocab_size - kReservedTokenIds);
  size_t i = 0;
  while (i < text.size()) {
    size_t start = i;
    if (text[i] == ' ' && i + 1 < text.size() && isWordChar(text[i + 1])) ++i;
    if (isWordChar(static_cast<unsigned char>(text[i]))) {
      while (i < text.size() && isWordChar(static_cast<unsigned char>(text[i]))) ++i;
    } else {
      ++i;
    }
    uint64_t h = XXH3_64bits(text.data() + start, i - start);
    out.push_back(static_cast<worker::TokenId>(kReservedTokenIds + h % span));
  }
  return out;
}

std::string tokenText(worker::TokenId id) {
  static constexpr std::array<const char*, 16> kSyllables = {"ka", "lo", "mi", "ne", "ru", "ta",
                                                             "vo", "zi", "be", "do", "fu", "ga",
                                                             "hi", "jo", "pe", "so"};
  std::string out = " ";
  auto v = static_cast<uint64_t>(id);
  do {
    out += kSyllables[v % kSyllables.size()];
    v /= kSyllables.size();
  } while (v > 0);
  return out;
}

std::string applyChatTemplate(const std::vector<ChatMessage>& messages) {
  std::string out;
  for (const auto& m : messages) {
    out += "<|" + m.role + "|>\n" + m.content + "\n";
  }
  out += "<|assistant|>\n";
  return out;
}

}  // namespace kvf::engine
