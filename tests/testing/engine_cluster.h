// Test helper: a kvfabric cluster as child processes on loopback: N kvf-engine instances (ids
// e0..eN-1, worker servers on when asked) and one kvf-router in front of them, every port picked
// before the start so an engine killed with SIGKILL can be restarted on the same ports and the
// router's registry stays valid. Each engine gets its own config file (a shared part plus its
// own worker settings, e.g. a fault knob); the router's KV-event endpoint of an instance may be
// redirected (e.g. through a TcpRelay). Throws std::runtime_error when a child does not start,
// which fails the test. Test thread only; the children die with the cluster.
#pragma once

#include <signal.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "common/process.h"
#include "common/strings.h"
#include "tests/testing/child_process.h"
#include "tests/testing/http_call.h"

namespace kvf::testing {

struct EngineClusterOptions {
  int engines = 3;
  // YAML lines every engine config gets after the fixed ones (profile, model, ports).
  std::string engine_yaml = "time_scale: 20\nmax_model_len: 32768\n";
  // Extra entries of engine i's `worker:` map (e.g. "fault: stall"); empty adds nothing.
  std::vector<std::string> worker_extra;
  bool workers = true;  // worker control servers (KV moves) and KV-event sockets
  std::string kv_connector = "kvfabric";
  std::string policy_yaml = "{kind: round_robin}";
  // YAML lines the router config gets after listen/policy/admin (health:, upstream: ...).
  std::string router_yaml = "health: {interval_s: 0.2}\n";
  std::string admin_token = "adm";
  // The KV-event endpoint the router subscribes to for engine i, given the engine's own; the
  // default is the engine's.
  std::function<std::string(int, const std::string&)> router_kv_endpoint;
};

class EngineCluster {
 public:
  struct EnginePorts {
    uint16_t http = 0, worker = 0, events = 0, replay = 0;
  };

  // `dir`: the test's folder (configs and logs go there); `source`/`bin`: the source tree and
  // build/bin (KVF_SOURCE_DIR / KVF_BIN_DIR).
  EngineCluster(std::filesystem::path dir, std::string source, std::string bin)
      : dir_(std::move(dir)), source_(std::move(source)), bin_(std::move(bin)) {}
  ~EngineCluster() {
    for (auto& e : engines_) {
      if (e) ::kill(e->pid(), SIGCONT);  // a stopped child cannot take SIGTERM
    }
    router_.reset();
    engines_.clear();
  }

  void start(EngineClusterOptions options) {
    options_ = std::move(options);
    options_.worker_extra.resize(static_cast<size_t>(options_.engines));
    for (int i = 0; i < options_.engines; ++i) {
      engines_.emplace_back();
      ports_.emplace_back();
      // A port picked free can be taken by a test running beside this one before the engine
      // binds it: a first start that finds its address in use picks new ports and tries again.
      for (int attempt = 1;; ++attempt) {
        ports_.back() = EnginePorts{freePort(), options_.workers ? freePort() : uint16_t{0},
                                    options_.workers ? freePort() : uint16_t{0},
                                    options_.workers ? freePort() : uint16_t{0}};
        writeEngineConfig(i);
        try {
          restartEngine(i);
          break;
        } catch (const std::runtime_error& e) {
          if (attempt == 3 || std::string_view(e.what()).find("in use") == std::string_view::npos) {
            throw;
          }
        }
      }
    }
    writeRouterConfig();
    router_ = startLogged(
        {bin_ + "/kvf-router", "--config", (dir_ / "router.yaml").string(), "--log_level", "warn"},
        (dir_ / "router.log").string());
    if (!waitForLog(*router_, "listening on port ", std::chrono::seconds(20))) {
      throw std::runtime_error("kvf-router did not start: " + readLog(*router_));
    }
    router_port_ = kvf::testing::routerPort(*router_).value_or(0);
  }

  // Starts engine i (again) on its ports and waits until it is ready; its log is
  // e<i>-<start>.log.
  void restartEngine(int i) {
    auto& slot = engines_[static_cast<size_t>(i)];
    slot.reset();
    std::vector<std::string> argv = {bin_ + "/kvf-engine", "--config", configPath(i).string(),
                                     "--instance_id", id(i)};
    if (options_.workers) {
      argv.insert(argv.end(),
                  {"--worker_port", std::to_string(ports_[static_cast<size_t>(i)].worker)});
    }
    slot = startLogged(argv, (dir_ / strCat(id(i), "-", ++starts_, ".log")).string());
    if (!waitForLog(*slot, "kvf-engine ready", std::chrono::seconds(30))) {
      throw std::runtime_error(strCat("kvf-engine ", id(i), " did not start: ", readLog(*slot)));
    }
  }

  void killEngine(int i) { engines_[static_cast<size_t>(i)]->kill(); }
  void signalEngine(int i, int sig) { ::kill(engines_[static_cast<size_t>(i)]->pid(), sig); }

  static std::string id(int i) { return "e" + std::to_string(i); }
  int size() const { return options_.engines; }
  Process& engine(int i) { return *engines_[static_cast<size_t>(i)]; }
  Process& router() { return *router_; }
  uint16_t routerPort() const { return router_port_; }
  const EnginePorts& ports(int i) const { return ports_[static_cast<size_t>(i)]; }
  std::string eventsEndpoint(int i) const {
    return strCat("tcp://127.0.0.1:", ports_[static_cast<size_t>(i)].events);
  }
  std::string replayEndpoint(int i) const {
    return strCat("tcp://127.0.0.1:", ports_[static_cast<size_t>(i)].replay);
  }
  const std::string& adminToken() const { return options_.admin_token; }

 private:
  void writeEngineConfig(int i) {
    const EnginePorts& p = ports_[static_cast<size_t>(i)];
    const std::string& worker_extra = options_.worker_extra[static_cast<size_t>(i)];
    std::ofstream(configPath(i))
        << "port: " << p.http << "\nprofile: " << source_
        << "/engine/profiles/qwen3-coder-30b-a3b-h20.yaml\nserved_model_name: test-model\n"
        << options_.engine_yaml << "\n"
        << (options_.workers
                ? strCat("kv_events: {endpoint: '", eventsEndpoint(i), "', replay_endpoint: '",
                         replayEndpoint(i), "'}\nworker: {kv_connector: ", options_.kv_connector,
                         worker_extra.empty() ? "" : ", ", worker_extra, "}\n")
                : std::string("kv_events: {enabled: false}\n"));
  }

  static uint16_t freePort() {
    auto p = pickFreePort();
    if (!p.ok()) throw std::runtime_error("no free port: " + p.status().ToString());
    return *p;
  }
  std::filesystem::path configPath(int i) const { return dir_ / (id(i) + ".yaml"); }

  void writeRouterConfig() {
    std::string yaml = strCat("listen: {port: 0}\npolicy: ", options_.policy_yaml,
                              "\nadmin: {token: ", options_.admin_token, "}\n",
                              options_.router_yaml, "\ninstances:\n");
    for (int i = 0; i < options_.engines; ++i) {
      const EnginePorts& p = ports_[static_cast<size_t>(i)];
      yaml += strCat("  - id: ", id(i), "\n    url: http://127.0.0.1:", p.http, "\n");
      if (!options_.workers) continue;
      std::string events = eventsEndpoint(i);
      if (options_.router_kv_endpoint) events = options_.router_kv_endpoint(i, events);
      yaml +=
          strCat("    worker_url: http://127.0.0.1:", p.worker,
                 "\n    kv_connector: ", options_.kv_connector, "\n    kv_events: {endpoint: \"",
                 events, "\", replay_endpoint: \"", replayEndpoint(i), "\"}\n");
    }
    std::ofstream(dir_ / "router.yaml") << yaml;
  }

  std::filesystem::path dir_;
  std::string source_, bin_;
  EngineClusterOptions options_;
  std::vector<EnginePorts> ports_;
  std::vector<std::unique_ptr<Process>> engines_;
  std::unique_ptr<Process> router_;
  uint16_t router_port_ = 0;
  int starts_ = 0;
};

}  // namespace kvf::testing
