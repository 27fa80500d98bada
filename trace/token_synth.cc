#include "trace/token_synth.h"

#include "common/strings.h"

namespace kvf::trace {

namespace {

// SplitMix64's finaliser: a bijection on 64 bits with full avalanche. Changing it changes every
// synthesised prompt; tests pin a few values.
uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  x ^= x >> 31;
  return x;
}

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
constexpr uint64_t kTailDomain = 0x7A11'7A11'7A11'7A11ULL;

}  // namespace

absl::StatusOr<TokenSynthesizer> TokenSynthesizer::create(const TokenSynthOptions& options) {
  if (options.vocab_min < 0 || options.vocab_max < options.vocab_min + 2) {
    return absl::InvalidArgumentError(strCat("token range [", options.vocab_min, ", ",
                                             options.vocab_max,
                                             ") must be non-negative with at least 2 ids"));
  }
  return TokenSynthesizer(options);
}

TokenSynthesizer::TokenSynthesizer(const TokenSynthOptions& options)
    : options_(options),
      range_(static_cast<uint64_t>(options.vocab_max - options.vocab_min)),
      salt_key_(mix64(options.salt + kGolden)) {}

int32_t TokenSynthesizer::toToken(uint64_t x) const {
  return options_.vocab_min + static_cast<int32_t>(x % range_);
}

int32_t TokenSynthesizer::blockToken(HashId hash_id, int32_t block_size, int32_t position) const {
  uint64_t block_key = mix64(mix64(hash_id ^ salt_key_) + static_cast<uint64_t>(block_size));
  return toToken(mix64(block_key + kGolden * (static_cast<uint64_t>(position) + 1)));
}

void TokenSynthesizer::appendPrompt(const Request& r, uint64_t unique_key,
                                    std::vector<int32_t>* out) const {
  if (r.input_length <= 0) return;
  out->reserve(out->size() + static_cast<size_t>(r.input_length));
  int64_t pos = 0;
  const auto bs = static_cast<uint64_t>(r.block_size > 0 ? r.block_size : 1);
  for (size_t i = 0; i < r.hash_ids.size() && pos < r.input_length; ++i) {
    uint64_t block_key = mix64(mix64(r.hash_ids[i] ^ salt_key_) + bs);
    int64_t n = std::min<int64_t>(static_cast<int64_t>(bs), r.input_length - pos);
    for (int64_t p = 0; p < n; ++p) {
      out->push_back(toToken(mix64(block_key + kGolden * (static_cast<uint64_t>(p) + 1))));
    }
    pos += n;
  }
  uint64_t tail_key = mix64(mix64(unique_key ^ kTailDomain) ^ salt_key_);
  for (; pos < r.input_length; ++pos) {
    out->push_back(toToken(mix64(tail_key + kGolden * (static_cast<uint64_t>(pos) + 1))));
  }
}

std::vector<int32_t> TokenSynthesizer::prompt(const Request& r, uint64_t unique_key) const {
  std::vector<int32_t> out;
  appendPrompt(r, unique_key, &out);
  return out;
}

}  // namespace kvf::trace
