// Summary statistics over replay results: mean and percentiles of TTFT, TPOT and E2E, error
// counts and the split by request class (WARM / MEDIUM / HEAVY), rendered as a text table.
// Pure functions over values.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "experiments/replay/result_log.h"

namespace kvf::experiments {

struct Distribution {
  size_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};

// Percentiles by the nearest-rank method on the sorted values (p in [0, 1]).
Distribution distributionOf(std::vector<double> values);

struct ReplaySummary {
  size_t requests = 0;
  size_t errors = 0;
  Distribution ttft, tpot, e2e;
  double cached_token_ratio = 0;  // sum(cached) / sum(prompt) over successful requests
  double cpu_cached_ratio = 0;    // of it, onboarded from host memory (same denominator)
  double disk_cached_ratio = 0;   // of it, read from disk
  struct ClassRow {
    size_t requests = 0, errors = 0;
    Distribution ttft, tpot, e2e;
  };
  std::map<std::string, ClassRow> by_class;  // "WARM", "MEDIUM", "HEAVY"
  struct EndpointRow {
    size_t requests = 0, errors = 0;
  };
  std::map<std::string, EndpointRow> by_endpoint;  // replays over several endpoints only
};

// Summarises results; requests whose trace arrival is before `warmup_s` are left out.
ReplaySummary summarize(const std::vector<RequestResult>& results, double warmup_s = 0);

// A fixed-width text table of the summary (seconds with 3 decimals).
std::string formatSummary(const ReplaySummary& summary);

}  // namespace kvf::experiments
