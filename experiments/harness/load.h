// Load in units that mean the same on every trace, and the held-out split.
//
// Offered utilisation: the modelled work a trace slice offers per second against the cluster's
// modelled capacity. The work of one request is the engine timing model's time for its prefill
// with no cache hit (the whole prompt alone, in chunks of the scheduler's token budget) plus its
// decode at a reference batch (each output token costs one decode step of `decode_batch`
// sequences at the request's mean context, divided by `decode_batch`). Capacity is one second of
// work per engine per second. utilisation = sum(work) / span / engines, with span the trace
// seconds from the first to the last arrival, converted to the engines' modelled clock by the
// replay and engine time scales. Prefix-cache hits lower the real work, so a slice offered at
// more than 1 may still be servable; reports give the achieved throughput beside it.
//
// Sessions for the split: a request's session id where the trace has one; otherwise (the
// Mooncake traces) the first two blocks of its prefix chain, so requests that share their
// opening (beyond a system prompt common to all) stay together. Pure functions, except the
// load record's writer and reader.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/timing_model.h"
#include "trace/request.h"

namespace kvf::experiments {

struct LoadConfig {
  // Target offered utilisation; nullopt keeps the trace's own arrivals (and the time scales),
  // whose utilisation is still computed and reported.
  std::optional<double> utilisation;
  int decode_batch = 32;  // reference decode batch of the work model
};

struct SplitConfig {
  bool enabled = false;            // `split:` present
  double validate_fraction = 0.5;  // of the sessions
  uint64_t seed = 1;
  enum class Half { kValidate, kTune };
  Half half = Half::kValidate;  // which half the experiment replays
};

// The modelled seconds of work of one request (see the file comment).
double requestWorkSeconds(const engine::TimingModel& model, const trace::Request& request,
                          int64_t chunk_tokens, int decode_batch);

struct OfferedLoad {
  int64_t requests = 0;
  double work_s = 0;       // modelled seconds of work, summed over the requests
  double span_s = 0;       // trace seconds from the first to the last arrival
  double utilisation = 0;  // work per modelled second over the engines; 0 when span_s == 0
};

struct WorkModel {
  const engine::TimingModel* model = nullptr;
  int64_t chunk_tokens = 8192;
  int decode_batch = 32;
  int engines = 8;
  // Trace seconds per modelled second: replay.time_scale / engine.time_scale (both 1 = 1).
  double trace_per_modelled = 1.0;
};

OfferedLoad offeredLoad(const std::vector<trace::Request>& requests, const WorkModel& work);

// The session key of a request (see the file comment); empty when it has neither a session id
// nor hash ids (such a request is a session of its own, keyed by its id).
std::string sessionKey(const trace::Request& request);

// Splits by session: sessions are ordered by a seeded hash of their key and the first
// round(validate_fraction x sessions) go to the validate half. Deterministic in (requests'
// keys, seed), disjoint, and a session is never cut. Order within each half is kept.
struct SplitHalves {
  std::vector<trace::Request> tune, validate;
  int64_t tune_sessions = 0, validate_sessions = 0;
};
SplitHalves splitBySession(std::vector<trace::Request> requests, const SplitConfig& split);

// Moves session starts (requests without a session: their arrivals) so the slice's offered
// utilisation is `target`: each session keeps its internal offsets and starts at
// first + f x (its start - first), f found by bisection. Returns the factor f applied.
absl::StatusOr<double> scaleToUtilisation(std::vector<trace::Request>* requests, double target,
                                          const WorkModel& work);

// DIR/load.yaml: what the harness did to the slice and the load it offers; read by the report.
struct LoadRecord {
  OfferedLoad load;                // of the slice as replayed
  double natural_utilisation = 0;  // of the same requests at their own arrivals
  std::optional<double> target;    // load.utilisation, when set
  double arrival_factor = 1;       // session starts were spread by this factor
  int decode_batch = 0;
  int64_t chunk_tokens = 0;
  std::string profile;
  std::string split;  // "validate", "tune" or empty (no split)
  int64_t split_sessions = 0, split_total_sessions = 0;
};
absl::Status writeLoadRecord(const std::string& path, const LoadRecord& record);
// NotFound when the file is absent (results of older experiments).
absl::StatusOr<LoadRecord> readLoadRecord(const std::string& path);

}  // namespace kvf::experiments
