// kvf-experiment: A/B experiments of routing policies on emulated engines.
//   kvf-experiment run EXP.yaml     start fresh engines + router per arm, replay, collect, report
//   kvf-experiment sim EXP.yaml     the same experiment in virtual time (experiments/sim/)
//   kvf-experiment report DIR       (re)write DIR/report.md and plots from collected results
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/flags/flag.h"
#include "common/cli.h"
#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "experiments/harness/harness.h"
#include "experiments/report/report.h"
#include "experiments/report/report_summary.h"
#include "experiments/sim/sim_runner.h"

ABSL_FLAG(std::string, bin_dir, "",
          "Folder with kvf-engine and kvf-router (default: the folder of this binary).");
ABSL_FLAG(std::string, output_dir, "",
          "Overrides the experiment's output_dir (default experiments/results/<name>).");
ABSL_FLAG(bool, plots, true,
          "Also write PNG plots with the report (needs /usr/bin/python3 + matplotlib).");
ABSL_FLAG(int, jobs, -1,
          "sim: arm processes at once (-1: the experiment's sim.jobs; 0: hardware threads).");
ABSL_FLAG(std::string, sim_arm, "",
          "sim (internal): simulate only this arm; the parent already wrote DIR/trace.jsonl.");
ABSL_FLAG(int, sim_rep, 0, "sim (internal): the repetition of --sim_arm to simulate.");

namespace {

using namespace kvf;

std::string binDir() {
  std::string flag = absl::GetFlag(FLAGS_bin_dir);
  if (!flag.empty()) return flag;
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : exe.parent_path().string();
}

// ${KVF_TRACES_DIR} in an experiment file's paths comes from the environment.
experiments::PathVariables pathVariables() {
  experiments::PathVariables variables;
  if (const char* dir = std::getenv(experiments::kTracesDirVariable); dir != nullptr && *dir) {
    variables[experiments::kTracesDirVariable] = dir;
  }
  return variables;
}

// Prints the top of DIR/report.md (setup, comparison table, why) and where the rest is.
void printSummary(const std::string& dir) {
  std::ifstream in(dir + "/report.md");
  std::stringstream text;
  text << in.rdbuf();
  std::printf("\n%s\nreport: %s/report.md\nplots:  %s/plots/\n",
              experiments::terminalSummary(text.str()).c_str(), dir.c_str(), dir.c_str());
}

absl::Status runExperiment(experiments::ExperimentConfig config) {
  if (!absl::GetFlag(FLAGS_output_dir).empty()) config.output_dir = absl::GetFlag(FLAGS_output_dir);
  std::string out = config.output_dir;
  experiments::Harness harness(std::move(config), binDir());
  KVF_RETURN_IF_ERROR(harness.run(absl::GetFlag(FLAGS_plots)));
  printSummary(out);
  return absl::OkStatus();
}

absl::Status simulate(const std::string& path, const experiments::ExperimentConfig& config) {
  experiments::sim::SimRunOptions options;
  options.output_dir = absl::GetFlag(FLAGS_output_dir);
  options.jobs = absl::GetFlag(FLAGS_jobs);
  options.plots = absl::GetFlag(FLAGS_plots);
  options.only_arm = absl::GetFlag(FLAGS_sim_arm);
  options.only_rep = absl::GetFlag(FLAGS_sim_rep);
  options.path_variables = pathVariables();
  KVF_RETURN_IF_ERROR(experiments::sim::runSimExperiment(path, options));
  if (options.only_arm.empty()) {
    printSummary(options.output_dir.empty() ? config.output_dir : options.output_dir);
  }
  return absl::OkStatus();
}

absl::Status report(const std::string& dir) {
  KVF_RETURN_IF_ERROR(experiments::writeReport(dir, absl::GetFlag(FLAGS_plots)).status());
  printSummary(dir);
  return absl::OkStatus();
}

constexpr char kUsage[] =
    R"(kvf-experiment: A/B experiments of routing policies on emulated engines.

Usage:
  kvf-experiment run EXP.yaml   fresh engines + router per arm and repetition, replay the trace
                                slice, collect metrics, write the report
  kvf-experiment sim EXP.yaml   the same experiment in virtual time: discrete-event simulation
                                with the engine core and policies, arms in parallel processes,
                                optional sweep:
  kvf-experiment report DIR     rewrite DIR/report.md and DIR/plots from its results

run and sim print the report's top when they finish: the setup (trace slice, engines, time
scale, offered load), the comparison table and a paragraph on why the arms differ; the rest is
in DIR/report.md (docs/experiments.md). An experiment file may name an optional trace set as
${KVF_TRACES_DIR}/<set> (data/traces/README.md); experiments/configs/ holds the bundled ones.

Exit status: 0 done, 1 the experiment failed, 2 a bad command line or experiment file.)";

}  // namespace

int main(int argc, char** argv) {
  auto args = kvf::cli::parseFlags(argc, argv, kUsage);
  if (args.size() != 2 || (args[0] != "run" && args[0] != "sim" && args[0] != "report")) {
    kvf::cli::failUsage("kvf-experiment", "expected run EXP.yaml, sim EXP.yaml or report DIR");
  }
  kvf::log::init("kvf-experiment");
  absl::Status status;
  if (args[0] == "report") {
    status = report(args[1]);
  } else {
    auto config = experiments::loadExperimentConfig(args[1], pathVariables());
    if (!config.ok()) {
      std::fprintf(stderr, "kvf-experiment: %s\n", std::string(config.status().message()).c_str());
      return kvf::cli::kExitUsage;
    }
    if (args[0] == "run" && config->sweep && !config->sweep.IsNull()) {
      kvf::cli::failUsage("kvf-experiment",
                          args[1] +
                              ": sweep: is only supported by `kvf-experiment sim` (a live "
                              "sweep takes hours); list the values as arms to run them live");
    }
    status = args[0] == "run" ? runExperiment(std::move(*config)) : simulate(args[1], *config);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "kvf-experiment: %s\n", std::string(status.message()).c_str());
    return kvf::cli::kExitFailure;
  }
  return 0;
}
