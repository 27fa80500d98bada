// Trace statistics: sizes, session structure, arrival rates, length distributions and the
// theoretical prefix-cache figures (unlimited single cache, intra/cross-session reuse, N
// instances under round-robin). One pass over requests in arrival order; memory is one entry
// per unique block plus a few bytes per request and per session. Single-threaded.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "trace/reader.h"
#include "trace/request.h"

namespace kvf::trace {

struct StatsOptions {
  // Instance counts for the round-robin hit ratio; their sum must be <= 64.
  std::vector<int> round_robin_instances = {2, 4, 8, 16};
  // Peak QPS is the most requests in one aligned window of this length, divided by it.
  double qps_window_s = 60.0;
};

struct LengthSummary {
  double mean = 0;
  int64_t p50 = 0, p90 = 0, p99 = 0, max = 0;
};

// Prefix-cache hit ratio: block-level (hit blocks / blocks) and token-level (hit tokens / input
// tokens). A request hits the longest run of its leading blocks already in the cache.
struct HitRatio {
  double block = 0;
  double token = 0;
};

struct RoundRobinHit {
  int instances = 0;
  HitRatio hit;
};

struct TraceStats {
  int64_t requests = 0;
  bool has_sessions = false;     // any request carries a session id
  int64_t sessions = 0;          // distinct session ids (requests without one are not counted)
  double multi_turn_share = 0;   // sessions with >= 2 requests / sessions
  double turns_per_session = 0;  // requests with a session / sessions
  double turns_per_multi_turn_session = 0;
  double span_s = 0;  // last arrival - first arrival
  double mean_qps = 0;
  double peak_qps = 0;
  double qps_window_s = 0;
  int64_t out_of_order = 0;  // requests arriving before their predecessor in the file
  LengthSummary input, output;
  int64_t input_tokens = 0, output_tokens = 0;
  double io_ratio = 0;               // input tokens / output tokens
  double prefill_token_share = 0;    // input tokens / (input + output tokens)
  std::vector<int32_t> block_sizes;  // distinct block sizes seen
  int64_t total_blocks = 0, unique_blocks = 0;
  HitRatio hit_all, hit_last_half;  // last half: requests with index >= requests / 2
  // Of the hit tokens: the share whose block was first stored by the same session (intra) or
  // by another session (cross). Only meaningful with has_sessions.
  double intra_session_reuse = 0, cross_session_reuse = 0;
  // Unique blocks that appear in requests of more than one session / unique blocks.
  double blocks_shared_across_sessions = 0;
  std::vector<RoundRobinHit> round_robin;
};

class StatsAccumulator {
 public:
  // Fails when the round-robin instance counts are invalid.
  static absl::StatusOr<StatsAccumulator> create(StatsOptions options);

  // Adds the next request (requests should come in arrival order; others are counted in
  // out_of_order and processed where they are).
  void add(const Request& r);
  TraceStats finish() const;

 private:
  explicit StatsAccumulator(StatsOptions options);

  struct BlockInfo {
    uint64_t instance_bits = 0;  // bit (offset_k + i) set: instance i of config k holds it
    uint32_t owner = 0;          // session index that first stored it (0: none)
    uint32_t shared = 0;         // seen in a second session
  };
  struct PerRequest {
    int32_t blocks = 0;
    int32_t hit_blocks = 0;
    int64_t hit_tokens = 0;
  };

  uint32_t sessionIndex(const Request& r);

  StatsOptions options_;
  std::vector<int> rr_offset_;
  absl::flat_hash_map<HashId, BlockInfo> blocks_;
  absl::flat_hash_map<std::string, uint32_t> session_ids_;
  std::vector<uint32_t> session_requests_;  // index 0 unused
  std::vector<int64_t> inputs_, outputs_;
  std::vector<PerRequest> per_request_;
  std::vector<int64_t> rr_hit_blocks_, rr_hit_tokens_;
  std::vector<int64_t> window_counts_;
  std::vector<int32_t> block_sizes_;
  int64_t intra_tokens_ = 0, cross_tokens_ = 0;
  int64_t requests_with_session_ = 0;
  int64_t out_of_order_ = 0;
  Nanos first_ = 0, last_ = 0, max_arrival_ = 0;
  std::vector<uint8_t> match_;  // scratch
};

// Reads `reader` to the end and computes its statistics. `progress` (optional) is called about
// every 2^16 requests with (bytes read, bytes total).
absl::StatusOr<TraceStats> computeStats(RequestReader& reader, const StatsOptions& options,
                                        const std::function<void(int64_t, int64_t)>& progress = {});

// Human-readable table (one figure per line) and a JSON object with every field.
std::string formatStatsTable(const TraceStats& stats);
std::string formatStatsJson(const TraceStats& stats);

}  // namespace kvf::trace
