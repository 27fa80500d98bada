// `kvf-experiment sim EXP.yaml`: cuts the same trace slice as `run`, expands the sweep into arms,
// simulates every unfinished arm x repetition (in parallel child processes of this binary when
// jobs > 1: `kvf-experiment sim EXP.yaml --sim_arm NAME --sim_rep K`), and writes the `run`
// result layout, the report, and for a sweep the sweep table and one plot per swept parameter.
// Runs on the calling thread.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "experiments/harness/experiment_config.h"
#include "experiments/sim/cluster_sim.h"
#include "experiments/sim/sim_config.h"

namespace kvf::experiments::sim {

struct SimRunOptions {
  std::string output_dir;  // overrides the experiment's
  int jobs = -1;           // -1: the experiment's sim.jobs (0 there = hardware threads)
  bool plots = true;
  PathVariables path_variables;  // ${KVF_TRACES_DIR} in the experiment's paths
  // Child mode: run only this arm and repetition (the parent already cut the trace).
  std::string only_arm;
  int only_rep = -1;
};

absl::Status runSimExperiment(const std::string& experiment_path, const SimRunOptions& options);

// The ClusterSetup of one arm and repetition (engine config with the arm's overrides, router
// config with the arm's policy, replay and sim options). Exposed for tests.
absl::StatusOr<ClusterSetup> buildSetup(const ExperimentConfig& config, const SimArm& arm, int rep);

// Appends the sweep table to DIR/report.md, writes DIR/data/sweep.csv and (with plots) one PNG
// per sweep under DIR/plots/. No-op without sweep arms.
absl::Status writeSweepReport(const std::string& dir, const std::vector<SimArm>& arms,
                              const std::vector<Sweep>& sweeps, bool plots);

}  // namespace kvf::experiments::sim
