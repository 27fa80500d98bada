// Settings of `kvf-experiment sim`: the experiment file's `sim:` section (modelled HTTP and
// KV-event latencies, engine failures, parallel jobs) and its `sweep:` section, which expands
// arms into one derived arm per swept value. Parsed from the raw YAML nodes that
// loadExperimentConfig() keeps; plain values, see docs/experiments.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "experiments/harness/experiment_config.h"

namespace kvf::experiments::sim {

// What goes wrong with an engine instance from `at` (virtual time since the first request) for
// `down_for` (0: to the end of the run).
enum class FailureKind {
  kDown,        // the process is gone: in-flight streams fail, connections are refused; it
                // comes back cold
  kError,       // it answers every request with HTTP `status` at once
  kStall,       // it accepts requests and never answers (the router's read timeout ends them)
  kRefusePush,  // its worker refuses KV pushes (a decoder pulling from it prefills locally)
  kDrain,       // an operator drains it: no new requests routed to it, it still pushes
};

struct Failure {
  int instance = 0;
  FailureKind kind = FailureKind::kDown;
  Nanos at = 0;
  Nanos down_for = 0;
  int status = 503;  // kError
};

// Wall-clock latencies of the live path that the engine core does not model. Defaults are the
// calibration against the live cluster (docs/results.md, "Simulator vs live cluster").
struct Overheads {
  double request_ms = 4.0;             // client send -> router decision (HTTP, parse, hashing)
  double request_per_ktoken_ms = 0.3;  // + per 1,000 prompt tokens (body build, send, parse)
  double forward_ms = 4.0;             // router decision -> request queued in the engine core
  double forward_per_ktoken_ms = 0.0;  // + per 1,000 prompt tokens
  double response_ms = 5.0;            // engine step end -> token at the router and client
  double kv_event_delay_ms = 2.0;      // engine step end -> event applied to the cache index
  double step_overhead_ms = 0.0;       // added to every engine step (loop lateness)
  double jitter_ms = 0.0;              // uniform [0, jitter) added to request_ms, seeded
};

// Router replicas (docs/router.md "Replicas"): `count` routing cores, each with its own ledger
// and routed (soft) entries, behind client-side round robin; each indexes every engine's KV
// events. With `sync`, each replica publishes its load every sync_interval (a snapshot every
// snapshot_interval) and its peers apply it link_ms later (router/core/peer_load.h).
struct ReplicaSim {
  int count = 1;
  bool sync = true;
  double sync_interval_ms = 1.0;
  double snapshot_interval_ms = 100.0;
  double link_ms = 0.5;
  double peer_timeout_ms = 500.0;
};

struct SimOptions {
  Overheads overheads;
  ReplicaSim replicas;
  uint64_t seed = 1;  // jitter draws; repetition k uses seed + k
  int jobs = 0;       // arm processes at once; 0 = hardware threads
  // Repetitions simulated per arm; 0 = the experiment's `repetitions` (what `run` does). With
  // jitter_ms > 0 each repetition draws different overheads, so several of them show the
  // spread a live run's timing noise gives (a live run is one draw).
  int repetitions = 0;
  bool decision_log = true;
  // Prompts go to the engines and the cache index as per-block content keys derived from the
  // trace's hash ids (no token synthesised or hashed); false: synthesised token ids, as the
  // live replay sends them. Both give the same results up to 64-bit hash collisions.
  bool token_free = true;
  std::vector<Failure> failures;
  // Overrides merged over the cluster's engine config file, for the simulator only (e.g.
  // `engine: {cache: {block_size: 64}}`; set router.index.block_size to match).
  YAML::Node engine;
};

// One swept parameter: `param` is a dotted path into an arm's `policy`, `sim` or `router`
// section, or into the engine config (`engine.`), e.g. policy.hybrid.gate_fraction.
struct Sweep {
  std::string param;
  std::vector<YAML::Node> values;  // scalars
  std::vector<std::string> arms;   // arms it applies to; empty = every arm
};

// An arm as the simulator runs it: the experiment's arm plus per-arm overrides.
struct SimArm {
  std::string name;
  YAML::Node policy;
  YAML::Node sim;     // the experiment's `sim:` with this arm's overrides applied
  YAML::Node router;  // the experiment's `router:` with overrides
  YAML::Node engine;  // overrides of the engine config file (merged over it)
  // Sweep origin (empty for a plain arm).
  int sweep_index = -1;
  std::string base_arm;
  std::string value;
};

absl::StatusOr<SimOptions> parseSimOptions(const YAML::Node& node, const std::string& source);
absl::StatusOr<std::vector<Sweep>> parseSweeps(const YAML::Node& node,
                                               const std::vector<ArmConfig>& arms,
                                               const std::string& source);

// The plain arms followed by, for each sweep, each target arm and each value, an arm named
// "<arm>@<last path element>=<value>". Deterministic.
absl::StatusOr<std::vector<SimArm>> expandArms(const ExperimentConfig& config,
                                               const std::vector<Sweep>& sweeps);

// Sets `value` at dotted `path` inside `root` (creating maps on the way).
void setPath(YAML::Node& root, const std::string& path, const YAML::Node& value);

}  // namespace kvf::experiments::sim
