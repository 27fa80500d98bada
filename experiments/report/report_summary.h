// The parts of an experiment report that let it stand on its own: what was run (trace slice,
// engines, time scale, offered load), per-arm figures that explain a latency difference
// (cache hit ratio, the prefill queued ahead of a request on its instance, and how evenly
// requests and prompt tokens spread over the instances), and a generated
// paragraph that names the figures separating the arms. Pure functions over loaded data, except
// readSetup() which reads files. Single-threaded.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "experiments/replay/summary.h"
#include "experiments/report/report.h"

namespace kvf::experiments {

// What the experiment ran, from DIR/experiment.yaml and the slice in DIR/trace.jsonl.
struct ExperimentSetup {
  bool recorded = false;   // DIR/experiment.yaml was there (the rest is defaults otherwise)
  std::string trace_path;  // as written in the experiment file (the report shows its file name)
  double start_s = 0, duration_s = 0;
  int64_t limit = 0;
  std::string dispatch = "timestamp";
  int engines = 0;
  std::string engine_config;  // file name only
  double time_scale = 1, engine_time_scale = 1;
  int repetitions = 1;     // of the baseline arm, as found in the result directory
  bool simulated = false;  // `kvf-experiment sim` (virtual time) rather than `run`
  // The slice every arm replayed.
  int64_t requests = 0;
  double span_s = 0;  // trace seconds from the first to the last arrival
  double mean_input_tokens = 0, mean_output_tokens = 0;
  // Offered load in trace time (modelled time when time_scale == engine_time_scale).
  double offered_requests_per_s = 0;
  double offered_prompt_tokens_per_s_per_engine = 0;
  // Offered utilisation of the cluster's modelled capacity. nullopt until the harness computes
  // it from the engines' profile; the report then says the offered load is all it knows.
  std::optional<double> offered_utilisation;
};

// Reads DIR/experiment.yaml (leniently: the report must open results of older files too) and
// DIR/trace.jsonl. Missing pieces stay at their defaults; only an unreadable slice fails.
absl::StatusOr<ExperimentSetup> readSetup(const std::string& dir);

// "**Setup.** ..." : the paragraph at the top of report.md.
std::string setupParagraph(const ExperimentSetup& setup);

// Per arm (pooled over repetitions): queueing and load balance.
struct ArmBalance {
  // Queueing seen from the client: mean over requests of the uncached prompt tokens of the
  // requests sent earlier to the same instance that had not produced their first token yet
  // when this one was sent (the prefill it waits behind).
  double prefill_ahead_tokens = 0;
  // Busiest instance against the mean over all `instances` (idle ones count as 0).
  double max_over_mean_requests = 0;
  double max_over_mean_tokens = 0;  // prompt tokens routed to each instance
  std::string busiest;              // the instance with the most requests
  int64_t busiest_requests = 0, least_requests = 0;
};

// `instances`: the cluster size (instances that served nothing still count).
ArmBalance balanceOf(const ArmData& arm, int instances);

// The cluster prefix-cache hit ratio of an arm: the engines' hits over queries, or the replay's
// cached-token ratio when no engine metrics were kept.
double clusterHitRatio(const ArmData& arm, const ReplaySummary& summary);

// "**Why.** ..." : which arm has the lowest and highest mean TTFT and the figures that differ
// between them (hit ratio, prefill queued ahead, imbalance), in the order they matter.
std::string whyParagraph(const std::vector<ArmData>& arms, const std::vector<ReplaySummary>& sums,
                         const std::vector<ArmBalance>& balances);

// The part of report.md a terminal shows after a run: from the top to the first section after
// the result table and the "why" paragraph.
std::string terminalSummary(const std::string& report_markdown);

}  // namespace kvf::experiments
