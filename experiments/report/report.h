// `kvf-experiment report DIR`: reads an experiment's result directory (per arm and repetition:
// results.jsonl from the replayer, engine_<i>.metrics scrapes, decisions), and writes report.md
// with the seed's tables (TTFT/TPOT/E2E percentiles, cluster and per-instance prefix-cache hit
// ratio, errors, routing mix, per-class breakdown), deltas against the baseline arm with 95%
// bootstrap confidence intervals, CSV data and PNG plots. Single-threaded.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "experiments/replay/result_log.h"

namespace kvf::experiments {

// Directory layout written by `kvf-experiment run` (and `sim`):
//   DIR/arms.txt                        arm names, one per line, the baseline first
//   DIR/arms/<arm>/rep<k>/results.jsonl replayer output
//   DIR/arms/<arm>/rep<k>/engine_<i>.metrics  /metrics of engine i after the replay
//   DIR/arms/<arm>/rep<k>/DONE          written when the repetition completed
struct ArmData {
  std::string name;
  std::vector<std::vector<RequestResult>> reps;  // results per repetition
  // Per instance (engine index as named in the file): prefix-cache hits and queries in tokens.
  std::map<std::string, std::pair<double, double>> instance_cache;  // name -> (hits, queries)
};

absl::StatusOr<std::vector<ArmData>> loadExperiment(const std::string& dir);

// A relative change of a statistic against the baseline with its 95% bootstrap interval.
struct Delta {
  double value = 0;  // (arm - baseline) / baseline
  double low = 0, high = 0;
};

// Two-level bootstrap (repetitions, then requests within each drawn repetition) of
// stat(arm) / stat(baseline) - 1. `stat` maps a sample of values to a number. Deterministic
// for a given seed.
Delta bootstrapDelta(const std::vector<std::vector<double>>& baseline,
                     const std::vector<std::vector<double>>& arm,
                     double (*stat)(std::vector<double>&), int resamples = 1000,
                     uint64_t seed = 42);

// The path of a script the build installs into build/bin (kvf-plot-report.py, ...): beside this
// binary, or in ../bin for binaries that live elsewhere in the build (tests).
std::string installedScript(const std::string& name);

// Writes DIR/report.md, DIR/data/*.csv and (when /usr/bin/python3 with matplotlib is present)
// DIR/plots/*.png. Returns the markdown text.
absl::StatusOr<std::string> writeReport(const std::string& dir, bool plots = true);

}  // namespace kvf::experiments
