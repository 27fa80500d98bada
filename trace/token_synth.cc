#include "trace/token_synth.h"

#include <algorithm>
#include <array>

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

// A block's key chains the identities of the runs of tokens it covers: (trace block key, offset,
// length) inside a hashed trace block, (tail key, position, length) past the hashed blocks.
// These determine the tokens appendPrompt() writes there, and vice versa.
uint64_t TokenSynthesizer::appendBlockKeys(const Request& r, uint64_t unique_key,
                                           int64_t block_size, std::vector<uint64_t>* keys) const {
  constexpr uint64_t kKeyStart = 0x6b65792d73746172ULL;
  const int64_t len = std::max<int64_t>(r.input_length, 0);
  const auto tbs = static_cast<int64_t>(r.block_size > 0 ? r.block_size : 1);
  const int64_t hashed_end = std::min(len, static_cast<int64_t>(r.hash_ids.size()) * tbs);
  const uint64_t tail_key = mix64(mix64(unique_key ^ kTailDomain) ^ salt_key_);
  if (block_size < 1) return 0;
  keys->reserve(keys->size() + static_cast<size_t>(len / block_size));
  uint64_t acc = kKeyStart, whole = kKeyStart;
  int64_t pos = 0;
  int64_t block_end = block_size;  // end of the engine block holding pos
  int64_t key_j = -1;              // the trace block whose key is in block_key
  uint64_t block_key = 0;
  // The trace block holding pos and where it ends, followed as pos moves (no division per run).
  int64_t j = 0;
  int64_t j_end = tbs;
  // When engine blocks tile trace blocks (the trace block size a multiple of block_size), every
  // trace block holds whole engine blocks at the same offsets: the mix of each (offset, length)
  // pair is computed once here, and a trace block's whole engine blocks take one mix each for
  // their run and one for the chain below instead of three.
  constexpr int64_t kMaxTiles = 256;
  std::array<uint64_t, kMaxTiles> tile_mix;
  const bool tiled = tbs % block_size == 0 && tbs / block_size <= kMaxTiles;
  if (tiled) {
    for (int64_t k = 0; k < tbs / block_size; ++k) {
      tile_mix[static_cast<size_t>(k)] =
          mix64((static_cast<uint64_t>(k * block_size) << 32) ^ static_cast<uint64_t>(block_size));
    }
  }
  while (pos < len) {
    int64_t end = std::min(block_end, len);
    uint64_t run;
    if (pos < hashed_end) {
      while (pos >= j_end) {
        ++j;
        j_end += tbs;
      }
      if (j != key_j) {  // one key per trace block, shared by the engine blocks inside it
        key_j = j;
        block_key = mix64(mix64(r.hash_ids[static_cast<size_t>(j)] ^ salt_key_) +
                          static_cast<uint64_t>(tbs));
      }
      const int64_t stop = std::min(j_end, hashed_end);
      if (tiled && pos + block_size == block_end && block_end <= stop) {
        // Whole engine blocks inside this trace block: each is a single run, so its key is
        // mix64(kKeyStart + kGolden * run), as the general step below computes it.
        auto k = static_cast<size_t>((pos - (j_end - tbs)) / block_size);
        for (; block_end <= stop; block_end += block_size) {
          uint64_t key = mix64(kKeyStart + kGolden * (block_key ^ tile_mix[k++]));
          keys->push_back(key);
          whole = mix64(whole ^ key);
        }
        pos = block_end - block_size;
        continue;
      }
      end = std::min(end, stop);
      run = block_key ^ mix64((static_cast<uint64_t>(pos - (j_end - tbs)) << 32) ^
                              static_cast<uint64_t>(end - pos));
    } else {
      run = tail_key ^ mix64((static_cast<uint64_t>(pos) << 32) ^ static_cast<uint64_t>(end - pos) ^
                             kTailDomain);
    }
    acc = mix64(acc + kGolden * run);
    pos = end;
    if (pos == block_end) {
      keys->push_back(acc);
      whole = mix64(whole ^ acc);
      acc = kKeyStart;
      block_end += block_size;
    }
  }
  if (acc != kKeyStart) whole = mix64(whole ^ acc);
  return mix64(whole + static_cast<uint64_t>(len));
}

std::vector<int32_t> TokenSynthesizer::prompt(const Request& r, uint64_t unique_key) const {
  std::vector<int32_t> out;
  appendPrompt(r, unique_key, &out);
  return out;
}

}  // namespace kvf::trace
