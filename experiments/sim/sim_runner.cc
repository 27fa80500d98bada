#include "experiments/sim/sim_runner.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/log.h"
#include "common/process.h"
#include "common/status.h"
#include "common/strings.h"
#include "experiments/harness/harness.h"
#include "experiments/report/report.h"
#include "trace/reader.h"

namespace kvf::experiments::sim {

namespace fs = std::filesystem;

namespace {

absl::StatusOr<engine::EngineConfig> engineConfigFor(const ExperimentConfig& config,
                                                     const SimArm& arm) {
  const std::string& path = config.cluster.engine_config;
  YAML::Node node;
  try {
    node = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(strCat(path, ": ", e.what()));
  }
  if (arm.engine.IsMap()) mergeYaml(node, arm.engine);
  YAML::Emitter out;
  out << node;
  std::string source = arm.engine.IsMap() && arm.engine.size() > 0
                           ? strCat(path, " (with arm ", arm.name, "'s overrides)")
                           : path;
  return engine::parseEngineConfig(out.c_str(), source, fs::path(path).parent_path().string());
}

absl::StatusOr<router::RouterConfig> routerConfigFor(const ExperimentConfig& config,
                                                     const SimArm& arm) {
  YAML::Node root = arm.router.IsMap() ? YAML::Clone(arm.router) : YAML::Node();
  for (const char* reserved : {"listen", "instances", "policy", "decision_log"}) {
    if (root[reserved]) {
      return absl::InvalidArgumentError(strCat(config.source, ": router: '", reserved,
                                               "' is set by the simulator, not the experiment"));
    }
  }
  for (int i = 0; i < config.cluster.engines; ++i) {
    YAML::Node instance;
    instance["id"] = std::to_string(i);
    instance["url"] = strCat("http://127.0.0.1:", 20000 + i);  // never connected to
    instance["kv_events"]["endpoint"] = strCat("inproc://sim-", i);
    root["instances"].push_back(instance);
  }
  root["policy"] = YAML::Clone(arm.policy);
  YAML::Emitter out;
  out << root;
  return router::parseRouterConfig(out.c_str(), strCat(config.source, ": arm ", arm.name));
}

absl::StatusOr<std::vector<trace::Request>> loadSlice(const std::string& dir) {
  trace::ReaderOptions reader;
  reader.format = trace::TraceFormat::kSession;
  return trace::readAll(dir + "/trace.jsonl", reader);
}

absl::Status writeText(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  return out ? absl::OkStatus() : absl::InternalError(strCat("cannot write ", path));
}

std::string tail(const std::string& path, size_t bytes = 2000) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.size() > bytes ? text.substr(text.size() - bytes) : text;
}

// User + system CPU of this process (the arm's cost on a shared machine).
double cpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& tv) {
    return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) * 1e-6;
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

absl::Status runOne(const ExperimentConfig& config, const SimArm& arm, int rep,
                    const std::vector<trace::Request>& requests) {
  std::string rep_dir = strCat(config.output_dir, "/arms/", arm.name, "/rep", rep);
  fs::remove_all(rep_dir);  // an unfinished repetition starts again from scratch
  fs::create_directories(rep_dir);
  KVF_ASSIGN_OR_RETURN(ClusterSetup setup, buildSetup(config, arm, rep));
  auto start = std::chrono::steady_clock::now();
  double cpu_start = cpuSeconds();
  KVF_ASSIGN_OR_RETURN(SimStats stats, simulate(setup, requests, rep_dir));
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log::info("simulated", "arm", arm.name, "rep", rep, "requests", stats.requests, "errors",
            stats.errors, "steps", stats.steps, "events", stats.events, "virtual_s",
            stats.virtual_seconds, "wall_s", wall, "cpu_s", cpuSeconds() - cpu_start);
  return writeText(rep_dir + "/DONE", "");
}

std::string selfExe() {
  std::error_code ec;
  auto exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.string();
}

struct Job {
  size_t arm;
  int rep;
};

absl::Status runParallel(const ExperimentConfig& config, const std::string& experiment_path,
                         const std::vector<SimArm>& arms, const std::vector<Job>& jobs,
                         int parallel) {
  std::string exe = selfExe();
  if (exe.empty()) return absl::InternalError("cannot find this binary (/proc/self/exe)");
  struct Running {
    std::unique_ptr<Process> child;
    Job job;
    std::string log;
  };
  std::vector<Running> running;
  size_t next = 0, done = 0;
  while (done < jobs.size()) {
    while (next < jobs.size() && static_cast<int>(running.size()) < parallel) {
      const Job& job = jobs[next++];
      std::string arm_dir = strCat(config.output_dir, "/arms/", arms[job.arm].name);
      fs::create_directories(arm_dir);
      std::string log_path = strCat(arm_dir, "/sim_rep", job.rep, ".log");
      fs::remove(log_path);
      std::vector<std::string> argv = {exe,
                                       "sim",
                                       experiment_path,
                                       "--output_dir",
                                       config.output_dir,
                                       "--sim_arm",
                                       arms[job.arm].name,
                                       "--sim_rep",
                                       std::to_string(job.rep)};
      ProcessOptions options;
      options.log_path = log_path;
      KVF_ASSIGN_OR_RETURN(auto child, Process::spawn(argv, options));
      running.push_back({std::move(child), job, log_path});
    }
    bool progressed = false;
    for (auto it = running.begin(); it != running.end();) {
      if (it->child->running()) {
        ++it;
        continue;
      }
      ExitStatus status = it->child->stop();
      const std::string& name = arms[it->job.arm].name;
      if (!status.success()) {
        return absl::InternalError(strCat("arm ", name, " rep ", it->job.rep, " failed (",
                                          status.toString(), "); log tail:\n", tail(it->log)));
      }
      ++done;
      log::info("arm finished", "arm", name, "rep", it->job.rep, "done",
                strCat(done, "/", jobs.size()));
      it = running.erase(it);
      progressed = true;
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ClusterSetup> buildSetup(const ExperimentConfig& config, const SimArm& arm,
                                        int rep) {
  ClusterSetup setup;
  setup.engines = config.cluster.engines;
  setup.workers = config.cluster.workers;
  KVF_ASSIGN_OR_RETURN(setup.engine, engineConfigFor(config, arm));
  // Payload bytes only matter to KV transfers; the simulator skips writing them.
  setup.engine.cache.payload_bytes_per_block = 0;
  setup.engine_time_scale = config.cluster.engine_time_scale;
  KVF_ASSIGN_OR_RETURN(setup.router, routerConfigFor(config, arm));
  setup.replay = config.replay;
  setup.synth.salt = config.salt;
  KVF_ASSIGN_OR_RETURN(setup.sim, parseSimOptions(arm.sim, config.source));
  setup.seed = setup.sim.seed + static_cast<uint64_t>(rep);
  setup.label = strCat(arm.name, "/rep", rep);
  return setup;
}

absl::Status runSimExperiment(const std::string& experiment_path, const SimRunOptions& options) {
  KVF_ASSIGN_OR_RETURN(ExperimentConfig config,
                       loadExperimentConfig(experiment_path, options.path_variables));
  if (!options.output_dir.empty()) config.output_dir = options.output_dir;
  if (options.utilisation) config.load.utilisation = options.utilisation;
  KVF_ASSIGN_OR_RETURN(SimOptions sim, parseSimOptions(config.sim, config.source));
  KVF_ASSIGN_OR_RETURN(std::vector<Sweep> sweeps,
                       parseSweeps(config.sweep, config.arms, config.source));
  KVF_ASSIGN_OR_RETURN(std::vector<SimArm> arms, expandArms(config, sweeps));
  const std::string& dir = config.output_dir;

  if (!options.only_arm.empty()) {  // child: one arm, one repetition
    for (const SimArm& arm : arms) {
      if (arm.name != options.only_arm) continue;
      KVF_ASSIGN_OR_RETURN(std::vector<trace::Request> requests, loadSlice(dir));
      return runOne(config, arm, options.only_rep, requests);
    }
    return absl::NotFoundError(strCat("no arm named '", options.only_arm, "'"));
  }
  for (const SimArm& arm : arms) KVF_RETURN_IF_ERROR(buildSetup(config, arm, 0).status());
  {
    Harness harness(config, "");  // the exact slice `run` replays, written to DIR/trace.jsonl
    KVF_RETURN_IF_ERROR(harness.prepareTrace());
  }
  std::string names;
  for (const auto& arm : arms) names += arm.name + "\n";
  KVF_RETURN_IF_ERROR(writeText(dir + "/arms.txt", names));
  std::error_code ec;
  fs::copy_file(config.source, dir + "/experiment.yaml", fs::copy_options::overwrite_existing, ec);

  const int repetitions = sim.repetitions > 0 ? sim.repetitions : config.repetitions;
  std::vector<Job> jobs;
  for (size_t a = 0; a < arms.size(); ++a) {
    for (int rep = 0; rep < repetitions; ++rep) {
      if (fs::exists(strCat(dir, "/arms/", arms[a].name, "/rep", rep, "/DONE"))) continue;
      jobs.push_back({a, rep});
    }
  }
  int parallel = options.jobs >= 0 ? options.jobs : sim.jobs;
  if (parallel <= 0) parallel = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  log::info("simulating", "arms", arms.size(), "repetitions", repetitions, "to_run", jobs.size(),
            "parallel", parallel);
  if (parallel == 1 || jobs.size() <= 1) {
    if (!jobs.empty()) {
      KVF_ASSIGN_OR_RETURN(std::vector<trace::Request> requests, loadSlice(dir));
      for (const Job& job : jobs) {
        KVF_RETURN_IF_ERROR(runOne(config, arms[job.arm], job.rep, requests));
      }
    }
  } else {
    KVF_RETURN_IF_ERROR(runParallel(config, experiment_path, arms, jobs, parallel));
  }
  if (!options.report) return absl::OkStatus();
  auto report = writeReport(dir, options.plots);
  if (!report.ok()) return report.status();
  return writeSweepReport(dir, arms, sweeps, options.plots);
}

}  // namespace kvf::experiments::sim
