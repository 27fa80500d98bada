// Window+thin trace sampling (seed 003 §2.3): keep whole sessions whose first request falls in a
// contiguous time window, thin them to a share of sessions, cap the share of single-turn
// sessions. Unlike random sampling over the whole trace, this keeps sessions that run at the same
// time together, so cross-session prefix sharing survives. Two streaming passes over the input;
// memory is one entry per session. Single-threaded.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "trace/reader.h"
#include "trace/stats.h"
#include "trace/writer.h"

namespace kvf::trace {

struct SampleOptions {
  double window_start_s = 0;  // offset from the first arrival of the trace
  double window_s = 600;      // <= 0: the whole trace
  // Each session in the window is kept with this probability (decided by a hash of the seed and
  // the session id, so the choice does not depend on file order).
  double sample_ratio = 1.0;
  // After thinning, single-turn sessions are dropped (lowest hash first) until they are at most
  // this share of the kept sessions; 1 disables the cap.
  double max_single_turn_ratio = 1.0;
  uint64_t seed = 42;
  // Shift arrivals so the window start becomes time 0.
  bool rebase_time = true;
};

struct SampleReport {
  TraceStats input;   // the whole input trace
  TraceStats window;  // every session starting in the window (before thinning)
  TraceStats sample;  // what was written
  int64_t sessions_in_window = 0;
  int64_t sessions_kept = 0;
};

// Requests without a session id count as single-turn sessions of their own.
absl::StatusOr<SampleReport> sampleTrace(const std::string& path, const ReaderOptions& reader,
                                         const SampleOptions& options,
                                         const StatsOptions& stats_options, SessionWriter* out);

// The before/after table printed by `kvf-trace sample`.
std::string formatSampleReport(const SampleReport& report);

}  // namespace kvf::trace
