// The discrete-event cluster simulator of one arm and repetition: a client replaying trace
// requests by the experiment's dispatch mode, the router (the policy and cache index of
// policy/, with the live router's load accounting, health checks, retries and circuit breaker)
// and N engines (engine::EngineCore driven by a virtual clock), connected by configurable
// latencies. Events are ordered by (time, insertion sequence), so the same inputs and seed give
// byte-identical results. Writes the `kvf-experiment run` layout of one repetition directory.
// Single-threaded; one instance per arm process.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/engine_config.h"
#include "experiments/replay/replayer.h"
#include "experiments/sim/sim_config.h"
#include "router/core/config.h"
#include "trace/request.h"
#include "trace/token_synth.h"

namespace kvf::experiments::sim {

struct ClusterSetup {
  int engines = 8;
  bool workers = false;         // cluster.workers: instances can push KV and prefill for peers
  engine::EngineConfig engine;  // finalized
  double engine_time_scale = 1;
  router::RouterConfig router;  // instances "0".."N-1"; policy of the arm
  ReplayOptions replay;
  trace::TokenSynthOptions synth;
  SimOptions sim;
  uint64_t seed = 1;  // jitter seed of this repetition
  std::string label;  // names the arm in progress lines (stderr)
};

// Counters of one run (for the log and tests; not part of the result layout).
struct SimStats {
  uint64_t events = 0;
  uint64_t steps = 0;
  uint64_t requests = 0;
  uint64_t errors = 0;
  uint64_t retries = 0;
  double virtual_seconds = 0;  // when the last request finished
};

// Runs the whole slice (`requests` sorted by arrival, ids assigned) and writes
// rep_dir/results.jsonl, decisions.jsonl, engine_<i>.metrics and DONE.
absl::StatusOr<SimStats> simulate(const ClusterSetup& setup,
                                  const std::vector<trace::Request>& requests,
                                  const std::string& rep_dir);

}  // namespace kvf::experiments::sim
