// The in-memory trace model shared by every reader, writer, statistic, sampler, synthesiser,
// the replayer and the simulator: one Request per LLM call with its prefix-chained block hash
// ids and optional session structure. Plain value types; no synchronisation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/clock.h"

namespace kvf::trace {

// A trace block id. Ids are prefix-chained: two requests carrying the same id at block i have
// identical tokens in blocks 0..i (so equal ids imply an equal prefix).
using HashId = uint64_t;

struct Request {
  // Arrival time relative to the trace origin (nanoseconds; readers convert from ms or s).
  Nanos arrival = 0;
  int64_t input_length = 0;   // prompt tokens
  int64_t output_length = 0;  // generated tokens
  // Tokens per trace block (Mooncake 512, agentic coding 64, bailian 16).
  int32_t block_size = 0;
  // One id per block: either ceil(input_length / block_size) ids (the last block may be
  // partial, Mooncake/bailian) or floor(input_length / block_size) ids (only full blocks are
  // hashed, agentic coding; the unhashed tail is unique to this request).
  std::vector<HashId> hash_ids;

  // Optional structure; empty / 0 / -1 mean "not known".
  std::string id;          // request id, unique within the trace
  std::string session_id;  // requests of one conversation share it
  int32_t turn = 0;        // 1-based turn index within the session; 0 when unknown
  std::string parent_id;   // id of the request this one follows up (previous turn, spawner)
  Nanos think_time = -1;   // client-side pause before this request was sent; -1 when unknown
  std::string type;        // free-form request kind from the source (e.g. "text", "search")

  bool hasSession() const { return !session_id.empty(); }
  // Tokens of block `i` (the last block may be partial).
  int64_t blockTokens(size_t i) const {
    int64_t start = static_cast<int64_t>(i) * block_size;
    int64_t left = input_length - start;
    return left < block_size ? (left < 0 ? 0 : left) : block_size;
  }
};

// Whether `hash_ids.size()` is consistent with `input_length` and `block_size` (see above).
inline bool blockCountConsistent(const Request& r) {
  if (r.block_size <= 0 || r.input_length < 0) return false;
  int64_t n = static_cast<int64_t>(r.hash_ids.size());
  int64_t full = r.input_length / r.block_size;
  int64_t ceil = (r.input_length + r.block_size - 1) / r.block_size;
  return n == full || n == ceil;
}

}  // namespace kvf::trace
