// `kvf-experiment run`: for every arm and repetition, starts fresh kvf-engine processes and a
// kvf-router on loopback, refuses to go on unless every engine starts cold (prefix-cache
// counters at zero), replays the experiment's trace slice through the router, scrapes /metrics
// and keeps the router's decision log, stops everything and moves on. A repetition with a DONE
// marker is skipped, so an interrupted experiment resumes at the next unfinished one. Runs on
// the calling thread.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "experiments/harness/experiment_config.h"
#include "trace/request.h"

namespace kvf::experiments {

class Harness {
 public:
  // `bin_dir` holds kvf-engine and kvf-router.
  Harness(ExperimentConfig config, std::string bin_dir);

  // Runs every unfinished arm x repetition, then writes the report (with PNG plots if `plots`).
  absl::Status run(bool plots = true);

  // Cuts the trace slice (window, limit) and writes it to DIR/trace.jsonl (exposed for tests).
  absl::Status prepareTrace();
  const std::vector<trace::Request>& requests() const { return requests_; }

 private:
  absl::Status runRepetition(const ArmConfig& arm, int rep, const std::string& rep_dir);

  ExperimentConfig config_;
  std::string bin_dir_;
  std::vector<trace::Request> requests_;
};

// GET http://127.0.0.1:<port><path> with a short timeout (the harness is synchronous).
absl::StatusOr<std::string> httpGet(uint16_t port, const std::string& path,
                                    std::chrono::milliseconds timeout);

// Fails unless the scraped /metrics text shows no prefix-cache activity (a cold engine).
absl::Status checkCold(const std::string& metrics_text, const std::string& who);

}  // namespace kvf::experiments
