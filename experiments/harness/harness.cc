#include "experiments/harness/harness.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include "common/http_client.h"
#include "common/log.h"
#include "common/process.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/engine_config.h"
#include "experiments/replay/replayer.h"
#include "experiments/report/prom_text.h"
#include "experiments/report/report.h"
#include "protocol/transfer_auth.h"
#include "trace/reader.h"
#include "trace/token_synth.h"
#include "trace/writer.h"

namespace kvf::experiments {

namespace fs = std::filesystem;

absl::StatusOr<std::string> httpGet(uint16_t port, const std::string& path,
                                    std::chrono::milliseconds timeout) {
  asio::io_context ioc;
  http::ClientOptions options;
  options.connect_timeout = timeout;
  options.read_timeout = timeout;
  auto client = http::HttpClient::create(ioc.get_executor(), "127.0.0.1", port, options);
  http::ClientRequest request;
  request.target = path;
  auto future = asio::co_spawn(
      ioc,
      [&]() -> asio::awaitable<absl::StatusOr<http::Response>> {
        co_return co_await client->request(request);
      },
      asio::use_future);
  ioc.run();
  auto response = future.get();
  if (!response.ok()) return response.status();
  if (response->status != 200) {
    return absl::UnavailableError(
        strCat("GET ", path, " on port ", port, " answered ", response->status));
  }
  return response->body;
}

absl::Status checkCold(const std::string& metrics_text, const std::string& who) {
  auto samples = parsePromText(metrics_text);
  if (!samples.ok()) return annotate(samples.status(), who);
  auto queries = sumOf(*samples, "vllm:prefix_cache_queries_total");
  auto hits = sumOf(*samples, "vllm:prefix_cache_hits_total");
  if (!queries || !hits) {
    return absl::FailedPreconditionError(
        strCat(who, " exports no prefix-cache counters; cannot verify it starts cold"));
  }
  if (*queries != 0 || *hits != 0) {
    return absl::FailedPreconditionError(
        strCat(who, " is not cold: prefix_cache_queries=", *queries, " hits=", *hits,
               "; refusing to run this arm on a warm cache"));
  }
  return absl::OkStatus();
}

Harness::Harness(ExperimentConfig config, std::string bin_dir)
    : config_(std::move(config)), bin_dir_(std::move(bin_dir)) {}

absl::Status Harness::prepareTrace() {
  trace::ReaderOptions reader;
  KVF_ASSIGN_OR_RETURN(reader.format, trace::parseFormatName(config_.trace.format));
  reader.arrivals.rate_per_s = config_.trace.conversation_rate;
  reader.arrivals.seed = config_.trace.seed;
  KVF_ASSIGN_OR_RETURN(std::vector<trace::Request> all, trace::readAll(config_.trace.path, reader));
  assignMissingIds(&all);
  std::stable_sort(all.begin(), all.end(),
                   [](const auto& a, const auto& b) { return a.arrival < b.arrival; });
  requests_.clear();
  if (!all.empty()) {
    Nanos from = all.front().arrival + secondsToNanos(config_.trace.start_s);
    Nanos to =
        config_.trace.duration_s > 0 ? from + secondsToNanos(config_.trace.duration_s) : INT64_MAX;
    int64_t too_long = 0;
    for (auto& r : all) {
      if (r.arrival < from || r.arrival >= to) continue;
      if (config_.trace.max_input_tokens > 0 && r.input_length > config_.trace.max_input_tokens) {
        ++too_long;  // the session's other turns stay; the next one follows the previous kept
        continue;
      }
      if (config_.trace.limit > 0 &&
          static_cast<int64_t>(requests_.size()) >= config_.trace.limit) {
        break;
      }
      requests_.push_back(std::move(r));
    }
    if (too_long > 0) {
      log::info("dropped requests over trace.max_input_tokens", "dropped", too_long, "limit",
                config_.trace.max_input_tokens);
    }
  }
  if (requests_.empty()) return absl::InvalidArgumentError("the trace slice has no requests");
  KVF_RETURN_IF_ERROR(applySplitAndLoad());
  fs::create_directories(config_.output_dir);
  KVF_ASSIGN_OR_RETURN(auto writer,
                       trace::SessionWriter::create(config_.output_dir + "/trace.jsonl"));
  for (const auto& r : requests_) KVF_RETURN_IF_ERROR(writer->write(r));
  return writer->close();
}

absl::Status Harness::applySplitAndLoad() {
  LoadRecord record;
  if (config_.split.enabled) {
    int64_t before = static_cast<int64_t>(requests_.size());
    SplitHalves halves = splitBySession(std::move(requests_), config_.split);
    bool validate = config_.split.half == SplitConfig::Half::kValidate;
    requests_ = std::move(validate ? halves.validate : halves.tune);
    record.split = validate ? "validate" : "tune";
    record.split_sessions = validate ? halves.validate_sessions : halves.tune_sessions;
    record.split_total_sessions = halves.validate_sessions + halves.tune_sessions;
    log::info("split by session", "half", record.split, "sessions", record.split_sessions, "of",
              record.split_total_sessions, "requests", requests_.size(), "of", before);
    if (requests_.empty()) {
      return absl::InvalidArgumentError(
          strCat("split: the ", record.split, " half of the slice has no requests"));
    }
  }
  if (config_.cluster.engine_config.empty()) {  // no cluster to model (trace-only callers)
    if (config_.load.utilisation) {
      return absl::InvalidArgumentError("load.utilisation needs cluster.engine_config");
    }
    return absl::OkStatus();
  }
  KVF_ASSIGN_OR_RETURN(engine::EngineConfig engine,
                       engine::loadEngineConfig(config_.cluster.engine_config));
  engine::TimingModel model(engine.profile);
  WorkModel work;
  work.model = &model;
  work.chunk_tokens = engine.scheduler.max_num_batched_tokens;
  work.decode_batch = config_.load.decode_batch;
  work.engines = config_.cluster.engines;
  work.trace_per_modelled = config_.replay.time_scale / config_.cluster.engine_time_scale;
  OfferedLoad natural = offeredLoad(requests_, work);
  record.natural_utilisation = natural.utilisation;
  if (config_.load.utilisation) {
    KVF_ASSIGN_OR_RETURN(record.arrival_factor,
                         scaleToUtilisation(&requests_, *config_.load.utilisation, work));
    std::stable_sort(requests_.begin(), requests_.end(),
                     [](const auto& a, const auto& b) { return a.arrival < b.arrival; });
  }
  record.load = offeredLoad(requests_, work);
  record.target = config_.load.utilisation;
  record.decode_batch = work.decode_batch;
  record.chunk_tokens = work.chunk_tokens;
  record.profile = engine.profile.name;
  log::info("offered load", "utilisation", record.load.utilisation, "work_s", record.load.work_s,
            "span_s", record.load.span_s, "arrival_factor", record.arrival_factor);
  fs::create_directories(config_.output_dir);
  return writeLoadRecord(config_.output_dir + "/load.yaml", record);
}

namespace {

struct EnginePorts {
  uint16_t http = 0, events = 0, replay = 0;
  uint16_t worker = 0;  // 0: no worker control server
};

std::string tail(const std::string& path, size_t bytes = 2000) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.size() > bytes ? text.substr(text.size() - bytes) : text;
}

absl::Status writeFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  return out ? absl::OkStatus() : absl::InternalError(strCat("cannot write ", path));
}

// Copies the engine config with the time scale set and the profile path made absolute. With
// workers, the cluster's worker token (the config's worker.token, else a fresh random one) is
// written to it and returned in `worker_token` for the router, which signs kv_transfer_params
// with it, and the arm's kv_connector set.
// With a disk tier (tiers.disk), each engine gets its own copy, engine_<i>.yaml, whose disk
// directory is <rep dir>/disk_<i> (a tier directory is locked by one process). `paths` gets
// each engine's config file, `disk_dirs` those directories (none without a disk tier).
absl::Status writeEngineConfig(const ClusterConfig& cluster, const ArmConfig& arm,
                               const std::string& rep_dir, std::vector<std::string>* paths,
                               std::vector<std::string>* disk_dirs, std::string* worker_token) {
  YAML::Node node;
  try {
    node = YAML::LoadFile(cluster.engine_config);
    if (node["profile"]) {
      fs::path profile(node["profile"].as<std::string>());
      if (profile.is_relative()) {
        node["profile"] =
            (fs::path(cluster.engine_config).parent_path() / profile).lexically_normal().string();
      }
    }
    node["time_scale"] = cluster.engine_time_scale;
    if (cluster.workers) {
      YAML::Node worker = node["worker"];
      if (worker["token"] && !worker["token"].as<std::string>().empty()) {
        *worker_token = worker["token"].as<std::string>();
      } else {
        *worker_token = protocol::randomNonce();
        node["worker"]["token"] = *worker_token;
      }
      node["worker"]["kv_connector"] = arm.kv_connector;
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(strCat(cluster.engine_config, ": ", e.what()));
  }
  const std::string shared = rep_dir + "/engine.yaml";
  KVF_RETURN_IF_ERROR(writeFile(shared, strCat(YAML::Dump(node), "\n")));
  paths->assign(static_cast<size_t>(cluster.engines), shared);
  if (!node["tiers"] || !node["tiers"]["disk"]) return absl::OkStatus();
  for (size_t i = 0; i < paths->size(); ++i) {
    disk_dirs->push_back(strCat(rep_dir, "/disk_", i));
    node["tiers"]["disk"]["dir"] = disk_dirs->back();
    (*paths)[i] = strCat(rep_dir, "/engine_", i, ".yaml");
    KVF_RETURN_IF_ERROR(writeFile((*paths)[i], strCat(YAML::Dump(node), "\n")));
  }
  return absl::OkStatus();
}

// Writes replica `replica`'s router config to `path`. With several routers (`publish` holds one
// ZMQ port per replica) each gets a replicas: block naming the others as peers, over the arm's
// own router.replicas settings, and all share one worker token (it keys their messages).
absl::Status writeRouterConfig(const ExperimentConfig& config, const ArmConfig& arm, uint16_t port,
                               const std::vector<EnginePorts>& engines, const std::string& path,
                               const std::string& decision_log, const std::string& worker_token,
                               const std::vector<uint16_t>& publish, size_t replica) {
  YAML::Node root = armRouter(config, arm);
  if (!worker_token.empty()) root["worker_token"] = worker_token;
  root["listen"]["host"] = "127.0.0.1";
  root["listen"]["port"] = port;
  for (size_t i = 0; i < engines.size(); ++i) {
    YAML::Node instance;
    instance["id"] = std::to_string(i);
    instance["url"] = strCat("http://127.0.0.1:", engines[i].http);
    instance["kv_events"]["endpoint"] = strCat("tcp://127.0.0.1:", engines[i].events);
    instance["kv_events"]["replay_endpoint"] = strCat("tcp://127.0.0.1:", engines[i].replay);
    if (engines[i].worker != 0) {
      instance["worker_url"] = strCat("http://127.0.0.1:", engines[i].worker);
      instance["kv_connector"] = arm.kv_connector;
    }
    root["instances"].push_back(instance);
  }
  if (publish.size() > 1) {
    YAML::Node replicas = root["replicas"];
    replicas["id"] = strCat("r", replica);
    replicas["publish"] = strCat("tcp://127.0.0.1:", publish[replica]);
    YAML::Node peers(YAML::NodeType::Sequence);
    for (size_t p = 0; p < publish.size(); ++p) {
      if (p != replica) peers.push_back(strCat("tcp://127.0.0.1:", publish[p]));
    }
    replicas["peers"] = peers;
  }
  root["policy"] = arm.policy;
  root["decision_log"] = decision_log;
  return writeFile(path, strCat(YAML::Dump(root), "\n"));
}

// A child's options: stdout and stderr appended to `log_path`; its own process group, dying with
// the harness, SIGTERM then SIGKILL after 2 s when dropped on an error path.
ProcessOptions logTo(const std::string& log_path) {
  ProcessOptions options;
  options.log_path = log_path;
  return options;
}

// Polls GET /health until 200 or the deadline; fails early if the process exited.
absl::Status waitHealthy(Process& process, uint16_t port, double timeout_s,
                         const std::string& log_path) {
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    if (!process.running()) {
      return absl::UnavailableError(
          strCat(process.name(), " exited during start-up; log tail:\n", tail(log_path)));
    }
    if (httpGet(port, "/health", std::chrono::milliseconds(500)).ok()) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(strCat(process.name(), " on port ", port,
                                            " not healthy within ", timeout_s, " s; log tail:\n",
                                            tail(log_path)));
}

}  // namespace

absl::Status Harness::runRepetition(const ArmConfig& arm, int rep, const std::string& rep_dir) {
  fs::remove_all(rep_dir);  // a repetition that did not finish starts again from scratch
  fs::create_directories(rep_dir + "/logs");
  std::vector<EnginePorts> ports(static_cast<size_t>(config_.cluster.engines));
  for (auto& p : ports) {
    KVF_ASSIGN_OR_RETURN(p.http, pickFreePort());
    KVF_ASSIGN_OR_RETURN(p.events, pickFreePort());
    KVF_ASSIGN_OR_RETURN(p.replay, pickFreePort());
    if (config_.cluster.workers) {
      KVF_ASSIGN_OR_RETURN(p.worker, pickFreePort());
    }
  }
  const size_t routers = static_cast<size_t>(arm.routers);
  std::vector<uint16_t> router_ports(routers), publish_ports(routers > 1 ? routers : 0);
  for (auto& p : router_ports) {
    KVF_ASSIGN_OR_RETURN(p, pickFreePort());
  }
  for (auto& p : publish_ports) {
    KVF_ASSIGN_OR_RETURN(p, pickFreePort());
  }
  std::string worker_token;
  std::vector<std::string> engine_configs;
  // Disk tiers are scratch: removed once the engines (declared after, so stopped first) exit.
  struct ScratchDirs {
    std::vector<std::string> dirs;
    ~ScratchDirs() {
      std::error_code ec;
      for (const auto& d : dirs) fs::remove_all(d, ec);
    }
  } disk_dirs;
  KVF_RETURN_IF_ERROR(writeEngineConfig(config_.cluster, arm, rep_dir, &engine_configs,
                                        &disk_dirs.dirs, &worker_token));
  if (routers > 1 && worker_token.empty()) worker_token = protocol::randomNonce();

  std::vector<std::unique_ptr<Process>> engines;
  for (size_t i = 0; i < ports.size(); ++i) {
    std::vector<std::string> argv = {bin_dir_ + "/kvf-engine",
                                     "--config",
                                     engine_configs[i],
                                     "--port",
                                     std::to_string(ports[i].http),
                                     "--instance_id",
                                     std::to_string(i),
                                     "--kv_events_endpoint",
                                     strCat("tcp://127.0.0.1:", ports[i].events),
                                     "--kv_replay_endpoint",
                                     strCat("tcp://127.0.0.1:", ports[i].replay)};
    if (ports[i].worker != 0) {
      argv.push_back("--worker_port");
      argv.push_back(std::to_string(ports[i].worker));
    }
    KVF_ASSIGN_OR_RETURN(auto child,
                         Process::spawn(argv, logTo(strCat(rep_dir, "/logs/engine_", i, ".log"))));
    engines.push_back(std::move(child));
  }
  for (size_t i = 0; i < engines.size(); ++i) {
    KVF_RETURN_IF_ERROR(waitHealthy(*engines[i], ports[i].http, config_.cluster.startup_timeout_s,
                                    strCat(rep_dir, "/logs/engine_", i, ".log")));
    KVF_ASSIGN_OR_RETURN(std::string before,
                         httpGet(ports[i].http, "/metrics", std::chrono::seconds(5)));
    KVF_RETURN_IF_ERROR(writeFile(strCat(rep_dir, "/engine_", i, ".before.prom"), before));
    KVF_RETURN_IF_ERROR(checkCold(before, strCat("engine ", i)));
  }
  // One router: router.yaml, decisions.jsonl, router.prom. Replica k > 0: the same names with
  // "-r<k>" (replica 0 keeps the plain names, so reports read it as before).
  auto named = [&](size_t k, const std::string& stem, const std::string& ext) {
    return strCat(rep_dir, "/", stem, k == 0 ? "" : strCat("-r", k), ext);
  };
  std::vector<std::unique_ptr<Process>> router_processes;
  std::vector<EndpointAddress> endpoints;
  for (size_t k = 0; k < routers; ++k) {
    KVF_RETURN_IF_ERROR(
        writeRouterConfig(config_, arm, router_ports[k], ports, named(k, "router", ".yaml"),
                          named(k, "decisions", ".jsonl"), worker_token, publish_ports, k));
    KVF_ASSIGN_OR_RETURN(auto router, Process::spawn({bin_dir_ + "/kvf-router", "--config",
                                                      named(k, "router", ".yaml")},
                                                     logTo(named(k, "logs/router", ".log"))));
    router_processes.push_back(std::move(router));
    endpoints.push_back(
        {strCat("http://127.0.0.1:", router_ports[k]), "127.0.0.1", router_ports[k]});
  }
  for (size_t k = 0; k < routers; ++k) {
    KVF_RETURN_IF_ERROR(waitHealthy(*router_processes[k], router_ports[k],
                                    config_.cluster.startup_timeout_s,
                                    named(k, "logs/router", ".log")));
  }

  log::info("replaying", "arm", arm.name, "rep", rep, "requests", requests_.size(), "routers",
            routers);
  KVF_ASSIGN_OR_RETURN(auto log, ResultLog::open(rep_dir + "/results.jsonl", false));
  trace::TokenSynthOptions synth_options;
  synth_options.salt = config_.salt;
  KVF_RETURN_IF_ERROR(replayTrace(requests_, endpoints, config_.replay, synth_options, log.get()));

  for (size_t i = 0; i < ports.size(); ++i) {
    KVF_ASSIGN_OR_RETURN(std::string after,
                         httpGet(ports[i].http, "/metrics", std::chrono::seconds(5)));
    KVF_RETURN_IF_ERROR(writeFile(strCat(rep_dir, "/engine_", i, ".metrics"), after));
  }
  for (size_t k = 0; k < routers; ++k) {
    if (auto m = httpGet(router_ports[k], "/metrics", std::chrono::seconds(5)); m.ok()) {
      KVF_RETURN_IF_ERROR(writeFile(named(k, "router", ".prom"), *m));
    }
  }
  for (auto& router : router_processes) router->stop();
  for (auto& e : engines) e->stop();
  return writeFile(rep_dir + "/DONE", "");
}

absl::Status Harness::run(bool plots) {
  KVF_RETURN_IF_ERROR(prepareTrace());
  const std::string& dir = config_.output_dir;
  {
    std::string names;
    for (const auto& arm : config_.arms) names += arm.name + "\n";
    KVF_RETURN_IF_ERROR(writeFile(dir + "/arms.txt", names));
    std::error_code ec;
    fs::copy_file(config_.source, dir + "/experiment.yaml", fs::copy_options::overwrite_existing,
                  ec);
  }
  int total = static_cast<int>(config_.arms.size()) * config_.repetitions, done = 0;
  for (const auto& arm : config_.arms) {
    for (int rep = 0; rep < config_.repetitions; ++rep) {
      std::string rep_dir = strCat(dir, "/arms/", arm.name, "/rep", rep);
      ++done;
      if (fs::exists(rep_dir + "/DONE")) {
        log::info("already done, skipping", "arm", arm.name, "rep", rep);
        continue;
      }
      log::info("starting", "arm", arm.name, "rep", rep, "run", strCat(done, "/", total));
      absl::Status s = runRepetition(arm, rep, rep_dir);
      // Another process can take a picked port before our child binds it; try new ports once.
      if (!s.ok() && std::string(s.message()).find("Address already in use") != std::string::npos) {
        log::warn("port taken during start-up; retrying with new ports", "arm", arm.name);
        s = runRepetition(arm, rep, rep_dir);
      }
      if (!s.ok()) return annotate(s, strCat("arm ", arm.name, " rep ", rep));
    }
  }
  auto report = writeReport(dir, plots);
  return report.ok() ? absl::OkStatus() : report.status();
}

}  // namespace kvf::experiments
