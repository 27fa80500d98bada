// kvf-experiment: A/B experiments of routing policies on emulated engines.
//   kvf-experiment run EXP.yaml     start fresh engines + router per arm, replay, collect, report
//   kvf-experiment sim EXP.yaml     the same experiment in virtual time (experiments/sim/)
//   kvf-experiment report DIR       (re)write DIR/report.md and plots from collected results
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/flags/flag.h"
#include "common/cli.h"
#include "common/log.h"
#include "common/strings.h"
#include "experiments/harness/harness.h"
#include "experiments/report/report.h"
#include "experiments/sim/sim_runner.h"

ABSL_FLAG(std::string, bin_dir, "",
          "Folder with kvf-engine and kvf-router (default: the folder of this binary).");
ABSL_FLAG(std::string, output_dir, "", "Overrides the experiment's output_dir.");
ABSL_FLAG(bool, plots, true,
          "report and sim: also write PNG plots (needs /usr/bin/python3 + matplotlib).");
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

absl::Status runExperiment(const std::string& path) {
  auto config = experiments::loadExperimentConfig(path, pathVariables());
  if (!config.ok()) return config.status();
  if (!absl::GetFlag(FLAGS_output_dir).empty())
    config->output_dir = absl::GetFlag(FLAGS_output_dir);
  if (config->sweep && !config->sweep.IsNull()) {
    return absl::InvalidArgumentError(
        strCat(path,
               ": sweep: is only supported by `kvf-experiment sim` (a live sweep takes hours); "
               "list the values as arms to run them live"));
  }
  std::string out = config->output_dir;
  experiments::Harness harness(std::move(*config), binDir());
  absl::Status s = harness.run();
  if (!s.ok()) return s;
  std::printf("report: %s/report.md\nplots:  %s/plots/\n", out.c_str(), out.c_str());
  return absl::OkStatus();
}

absl::Status simulate(const std::string& path) {
  experiments::sim::SimRunOptions options;
  options.output_dir = absl::GetFlag(FLAGS_output_dir);
  options.jobs = absl::GetFlag(FLAGS_jobs);
  options.plots = absl::GetFlag(FLAGS_plots);
  options.only_arm = absl::GetFlag(FLAGS_sim_arm);
  options.only_rep = absl::GetFlag(FLAGS_sim_rep);
  options.path_variables = pathVariables();
  absl::Status s = experiments::sim::runSimExperiment(path, options);
  if (!s.ok() || !options.only_arm.empty()) return s;
  auto config = experiments::loadExperimentConfig(path, options.path_variables);
  std::string out =
      options.output_dir.empty() && config.ok() ? config->output_dir : options.output_dir;
  std::printf("report: %s/report.md\nplots:  %s/plots/\n", out.c_str(), out.c_str());
  return absl::OkStatus();
}

absl::Status report(const std::string& dir) {
  auto md = experiments::writeReport(dir, absl::GetFlag(FLAGS_plots));
  if (!md.ok()) return md.status();
  std::printf("%s\nreport: %s/report.md\n", md->c_str(), dir.c_str());
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  auto args = kvf::cli::parseFlags(
      argc, argv,
      "A/B experiments of routing policies on emulated engines.\n"
      "  kvf-experiment run EXP.yaml   fresh engines + router per arm and repetition, replay the\n"
      "                                trace slice, collect metrics, write the report\n"
      "  kvf-experiment sim EXP.yaml   the same experiment in virtual time: discrete-event\n"
      "                                simulation with the engine core and policies, arms in\n"
      "                                parallel processes, optional sweep: (docs/experiments.md)\n"
      "  kvf-experiment report DIR     rewrite DIR/report.md and DIR/plots from results");
  kvf::log::init("kvf-experiment");
  absl::Status status;
  if (args.size() == 2 && args[0] == "run") {
    status = runExperiment(args[1]);
  } else if (args.size() == 2 && args[0] == "sim") {
    status = simulate(args[1]);
  } else if (args.size() == 2 && args[0] == "report") {
    status = report(args[1]);
  } else {
    std::fprintf(stderr,
                 "usage: kvf-experiment run EXP.yaml | sim EXP.yaml | report DIR (see --help)\n");
    return 2;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "kvf-experiment: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
