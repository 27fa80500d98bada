// The experiment file of `kvf-experiment run` (and later `sim`): which trace slice to replay,
// how to replay it, the cluster to start for every arm, the arms (router policies) and the
// number of repetitions. Parsed once into a plain struct; see docs/experiments.md.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/status/statusor.h"
#include "experiments/harness/load.h"
#include "experiments/replay/replayer.h"

namespace kvf::experiments {

struct TraceSlice {
  std::string path;  // resolved against the experiment file's folder
  std::string format = "auto";
  double start_s = 0;            // window start (trace time, from the first request)
  double duration_s = 0;         // window length; 0 = to the end
  int64_t limit = 0;             // at most this many requests of the window (0 = all)
  int64_t max_input_tokens = 0;  // drop longer requests (0 = keep all)
  // Agentic directories: conversations per second (before `load.utilisation` rescales the
  // conversation starts, when it is set).
  double conversation_rate = 1.0 / 60.0;
  uint64_t seed = 1;
};

struct ClusterConfig {
  int engines = 8;
  std::string engine_config;       // resolved; a kvf-engine YAML used for every engine
  double engine_time_scale = 1.0;  // written into each engine's config copy
  double startup_timeout_s = 60;
  // Start every engine with a worker control server (--worker_port) and give the router its
  // worker_url, so push-migrate and prefill offload can happen (policies unified, elastic).
  bool workers = false;
};

struct ArmConfig {
  std::string name;
  YAML::Node policy;  // written verbatim as the router's `policy:` section
  // Optional `router:` settings of this arm only (e.g. overload control on for one arm),
  // merged key by key over the experiment's `router:` section; see armRouter().
  YAML::Node router;
  // The dialect KV moves in on this arm (cluster.workers only): "kvfabric" (the holder pushes)
  // or "nixl" (vLLM's NixlConnector: the holder's first leg, then the target reads). Written
  // into every engine's worker config and every router instance. `run` only.
  std::string kv_connector = "kvfabric";
  // kvf-router replicas in front of the engines (`run` only). Above 1, each gets a `replicas:`
  // block (id r<k>, its own publish port, the others as peers; settings such as
  // sync_interval_ms from the arm's router.replicas) and the replay deals requests to them in
  // turn (client-side round robin).
  int routers = 1;
};

struct ExperimentConfig {
  std::string name;
  std::string source;      // the experiment file
  std::string output_dir;  // default experiments/results/<name>
  TraceSlice trace;
  LoadConfig load;    // `load:` offered utilisation (experiments/harness/load.h)
  SplitConfig split;  // `split:` the held-out half the experiment replays
  ReplayOptions replay;
  uint64_t salt = 0;
  ClusterConfig cluster;
  YAML::Node router;            // extra router settings (index, health, upstream), written verbatim
  std::vector<ArmConfig> arms;  // the first is the baseline
  int repetitions = 1;
  // Read by `kvf-experiment sim` only (experiments/sim/sim_config.h validates them); `run`
  // ignores `sim:` and refuses a file with `sweep:`.
  YAML::Node sim;
  YAML::Node sweep;
};

// Values of the variables an experiment file may use in its paths as `${NAME}`. Only
// KVF_TRACES_DIR (the folder of the optional, larger trace sets; data/traces/README.md) is
// known; main() fills it from the environment. A path naming a variable without a value, or
// an unknown one, is an error that names the field and the variable.
using PathVariables = std::map<std::string, std::string>;
inline constexpr char kTracesDirVariable[] = "KVF_TRACES_DIR";

// Overrides `base` with every leaf of `over`: maps merge key by key, anything else replaces.
void mergeYaml(YAML::Node base, const YAML::Node& over);

// The router settings an arm runs with: the experiment's `router:` section with the arm's own
// `router:` merged over it (maps merged key by key, any other value replaced). A fresh node.
YAML::Node armRouter(const ExperimentConfig& config, const ArmConfig& arm);

absl::StatusOr<ExperimentConfig> loadExperimentConfig(const std::string& path,
                                                      const PathVariables& variables = {});

// Replaces every `${NAME}` in `text` by its value; InvalidArgument naming NAME when it has
// none or is not a known variable. Exposed for tests.
absl::StatusOr<std::string> expandPathVariables(const std::string& text,
                                                const PathVariables& variables);

}  // namespace kvf::experiments
