// The decision log: one JSON line per routing attempt (see docs/router.md for the fields), for
// the A/B harness and offline analysis, plus the most recent records in memory for the admin
// API. The routing core fills a record's routing fields (RoutingCore::fillRecord), its driver
// the rest. Owned by the router or the simulator; used from its single thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvf::router {

struct DecisionRecord {
  // Wall-clock seconds since the epoch when the request arrived (the simulator: virtual
  // seconds when the attempt was decided).
  double ts = 0;
  std::string request_id;
  std::string session;
  std::string policy;
  std::string instance;  // empty when no instance was available
  std::string mode;
  std::string reason;
  std::string request_class;
  int attempt = 1;
  // Instances excluded from this attempt because an earlier attempt of the request failed on
  // them (ids, in slot order).
  std::vector<std::string> excluded;
  int64_t prompt_tokens = 0;
  int64_t predicted_cached_tokens = 0;
  std::optional<int64_t> actual_cached_tokens;  // from the engine's usage, when reported
  int status = 0;                               // HTTP status returned to the client
  double duration_s = 0;
  // Arrival to the first response bytes (streams: first chunk; otherwise the whole body), for
  // comparison with predicted_costs.chosen; nullopt when no body arrived.
  std::optional<double> ttft_s;
  // Instance id -> score (NaN: unhealthy). Past kMaxScores instances: the chosen one and the
  // best others, scores_omitted counting the rest.
  static constexpr size_t kMaxScores = 16;
  std::vector<std::pair<std::string, double>> scores;
  int64_t scores_omitted = 0;
  // KV movement: the peer (push source or prefill instance; "" for none), the policy's
  // predicted seconds per mode (NaN: not considered), P's outcome for an offload ("" for none)
  // and the decode instance's kv_transfer_result ("" status: none reported).
  std::string source;
  std::vector<std::pair<std::string, double>> predicted_costs;
  std::string offload_prefill;
  // Wall seconds of that first leg (P's prefill, or a NIXL holder's leg) from its send to its
  // answer; NaN without one.
  double peer_leg_s = std::numeric_limits<double>::quiet_NaN();
  std::string kv_connector;  // the dialect KV moved in ("kvfabric", "nixl"; "" for none)
  std::string transfer_status;
  int64_t pushed_tokens = 0;
  int64_t pushed_bytes = 0;
  // A move's time: the cost model's, with the measured correction, and as measured (NaN:
  // none). Gains against local follow: predicted local - chosen, and that less the move's
  // error (measured - predicted).
  double move_model_s = std::numeric_limits<double>::quiet_NaN();
  double move_s = std::numeric_limits<double>::quiet_NaN();
  double move_measured_s = std::numeric_limits<double>::quiet_NaN();
};

std::string decisionToJson(const DecisionRecord& record);

class DecisionLog {
 public:
  // `path` empty: records are only kept in memory.
  static absl::StatusOr<std::unique_ptr<DecisionLog>> open(const std::string& path,
                                                           size_t keep_recent = 256);
  ~DecisionLog();

  // Appends one line and flushes it, so a crash loses at most the line being written.
  void write(DecisionRecord record);
  // The most recent records as JSON, oldest first. Serialised here, on demand: a router
  // without a log file spends nothing on JSON per request.
  std::vector<std::string> recent() const;
  uint64_t written() const { return written_; }

 private:
  DecisionLog(std::FILE* file, size_t keep_recent) : file_(file), keep_recent_(keep_recent) {}

  std::FILE* file_;
  size_t keep_recent_;
  std::deque<DecisionRecord> recent_;
  uint64_t written_ = 0;
};

}  // namespace kvf::router
