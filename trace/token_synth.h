// Token synthesis: turns a trace request (block hash ids + input length) into prompt token ids
// that an engine will hash into the same prefix structure. Token i of trace block h depends only
// on (h, trace block size, i, salt), so equal hash-id prefixes give equal token prefixes and an
// engine with any block size (dividing the trace block size or not) sees shared blocks exactly
// where the trace has them. Immutable after create(); safe to share across threads.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "trace/request.h"

namespace kvf::trace {

struct TokenSynthOptions {
  // Token ids are drawn uniformly from [vocab_min, vocab_max). The default fits any vocabulary of
  // 32k or more and stays clear of the special tokens that tokenizers put at the low end
  // (Llama's 0-2, byte-fallback tokens). Qwen/Llama-3 vocabularies keep specials at the top.
  int32_t vocab_min = 1000;
  int32_t vocab_max = 32000;
  // Different salts give unrelated token ids for the same trace (e.g. to defeat a warm cache
  // between runs); replays that must hit each other's cache use the same salt.
  uint64_t salt = 0;
};

class TokenSynthesizer {
 public:
  // Fails unless 0 <= vocab_min and vocab_min + 2 <= vocab_max.
  static absl::StatusOr<TokenSynthesizer> create(const TokenSynthOptions& options = {});

  // Token at `position` (0-based, < block_size) of trace block `hash_id`. A partial last block
  // of n tokens is positions 0..n-1 of the same sequence, so it is a prefix of the full block.
  int32_t blockToken(HashId hash_id, int32_t block_size, int32_t position) const;

  // Appends the prompt of `r`: input_length tokens. Tokens covered by hash ids come from
  // blockToken(); tokens past the last hashed block (traces that hash only full blocks) are
  // derived from `unique_key` and must not be shared, so pass a key unique to this request
  // (e.g. its index in the trace).
  void appendPrompt(const Request& r, uint64_t unique_key, std::vector<int32_t>* out) const;
  std::vector<int32_t> prompt(const Request& r, uint64_t unique_key) const;

  // Token-free form of the same prompt (simulators): one content key per full block of
  // `block_size` tokens (input_length / block_size keys, appended to `keys`), equal exactly
  // where the tokens appendPrompt() gives are equal (up to 64-bit collisions), for any
  // block_size. Returns a key of the whole prompt (partial last block included), equal for
  // equal prompts. No token is materialised.
  uint64_t appendBlockKeys(const Request& r, uint64_t unique_key, int64_t block_size,
                           std::vector<uint64_t>* keys) const;

  const TokenSynthOptions& options() const { return options_; }

 private:
  explicit TokenSynthesizer(const TokenSynthOptions& options);
  int32_t toToken(uint64_t x) const;

  TokenSynthOptions options_;
  uint64_t range_;
  uint64_t salt_key_;
};

}  // namespace kvf::trace
