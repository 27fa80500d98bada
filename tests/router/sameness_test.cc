// One routing core, two drivers: a request sequence with engine answers and failures goes
// through the live router (kvf-router's Asio shell, real HTTP, fake engines on loopback with
// KV events) and through the simulator (engine cores in virtual time), and the two decision
// logs must agree attempt by attempt on everything the routing decided: instance, mode, peer,
// predicted cached tokens, reason, class, the instances excluded after failed attempts, the
// attempt's status, the scores and predicted costs, and P's outcome for an offload. Requests
// go one at a time (each settles, KV events applied, before the next), so both see the same
// state at every decision. Failures: an engine that is gone (connections refused, retried
// elsewhere, its circuit opening), engines answering 500, an engine that hangs (the router's
// read timeout), a drained cache holder pushing its blocks, a holder refusing the push, and a
// prefill peer failing an offload.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "experiments/sim/sim_runner.h"
#include "tests/router/router_fixture.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/toy_cluster.h"
#include "trace/reader.h"
#include "trace/token_synth.h"

namespace kvf::router {
namespace {

namespace fs = std::filesystem;

constexpr int kEngines = 3;
constexpr int kBlock = 16;
constexpr double kSpacingS = 5;  // between two requests, in the simulation

// One request and the failures in place while it is handled (engine numbers). `down` stays
// down for the rest of the sequence.
struct Step {
  std::string session;
  int first_id = 0;  // trace block ids first_id .. first_id + blocks - 1 (a shared prefix)
  int blocks = 0;
  int extra_tokens = 5;  // past the last full block, unique to the request
  std::vector<int> down, error, stall, refuse_push, drain;
};

struct Scenario {
  std::string policy;  // the `policy:` section, as YAML
  bool workers = false;
  std::vector<Step> steps;
};

constexpr std::string_view kRouterYaml =
    "upstream: {circuit_failure_threshold: 2, circuit_open_s: 3600, read_timeout_s: 1}\n"
    "health: {interval_s: 3600, scrape_metrics: false}\n"
    "index: {predicted_ttl_s: 3600, approximate_ttl_s: 3600}\n";

// The fields both drivers must agree on, with instance ids as the simulator names them ("0",
// "1", ...; the live router's are "e0", "e1", ...).
std::string routingFields(bj::object record) {
  auto plain = [](const bj::value& v) -> bj::value {
    if (!v.is_string()) return v;
    std::string id(v.as_string());
    return bj::value(id.starts_with("e") ? id.substr(1) : id);
  };
  bj::object out;
  for (const char* key :
       {"policy", "session", "mode", "reason", "class", "attempt", "prompt_tokens",
        "predicted_cached_tokens", "status", "predicted_costs", "offload_prefill"}) {
    out[key] = record[key];
  }
  out["instance"] = plain(record["instance"]);
  out["source"] = plain(record["source"]);
  bj::array excluded;
  for (const auto& id : record["excluded"].as_array()) excluded.push_back(plain(id));
  out["excluded"] = std::move(excluded);
  bj::object scores;
  for (const auto& [id, score] : record["scores"].as_object()) {
    scores[plain(bj::value(id)).as_string()] = score;
  }
  out["scores"] = std::move(scores);
  return bj::serialize(out);
}

class SamenessTest : public RouterFixture {
 protected:
  // Writes the trace and the experiment for `s` and runs the simulator on it; returns its
  // decision log's routing fields.
  std::vector<std::string> simulate(const Scenario& s) {
    fs::path dir = testing::freshTempDir("sameness");
    testing::writeToyCluster(dir, 8192, /*peak_flops=*/1e15);  // 2 us per prompt token
    std::ofstream trace(dir / "trace.jsonl");
    std::string failures;
    auto failure = [&](std::string_view kind, int engine, double at, double length) {
      failures += strCat("    - {kind: ", kind, ", instance: ", engine, ", at_s: ", at,
                         ", down_s: ", length, ", status: 500}\n");
    };
    for (size_t k = 0; k < s.steps.size(); ++k) {
      const Step& step = s.steps[k];
      std::vector<int> ids(static_cast<size_t>(step.blocks));
      std::iota(ids.begin(), ids.end(), step.first_id);
      trace << strCat("{\"timestamp\": ", static_cast<int64_t>(k * kSpacingS * 1000),
                      ", \"input_length\": ", step.blocks * kBlock + step.extra_tokens,
                      ", \"output_length\": 4, \"hash_ids\": [", strJoin(ids, ", "),
                      "], \"block_size\": ", kBlock, ", \"session_id\": \"", step.session,
                      "\", \"id\": \"r", k, "\"}\n");
      // Each failure covers the request's time (it is routed ~4 ms after it is sent and done
      // well within a second) and ends before the next one.
      double at = static_cast<double>(k) * kSpacingS - 1;
      for (int e : step.down) failure("down", e, at, 0);
      for (int e : step.error) failure("error", e, at, 3);
      for (int e : step.stall) failure("stall", e, at, 3);
      for (int e : step.refuse_push) failure("refuse_push", e, at, 3);
      for (int e : step.drain) failure("drain", e, at, 3);
    }
    trace.close();
    std::ofstream(dir / "exp.yaml") << strCat(
        "name: sameness\ntrace: {path: trace.jsonl, format: session}\n"
        "replay: {dispatch: timestamp, time_scale: 1, timeout_s: 600}\n"
        "cluster: {engines: ",
        kEngines, ", engine_config: engine.yaml, workers: ", s.workers ? "true" : "false", "}\n",
        "router:\n", indent(kRouterYaml), "sim:\n  token_free: false\n  failures:\n",
        failures.empty() ? "    []\n" : failures, "arms:\n  - {name: arm, policy: ", s.policy,
        "}\n");
    experiments::sim::SimRunOptions options;
    options.output_dir = (dir / "out").string();
    options.jobs = 1;
    options.plots = false;
    absl::Status run = experiments::sim::runSimExperiment((dir / "exp.yaml").string(), options);
    EXPECT_TRUE(run.ok()) << run;
    std::vector<std::string> out;
    std::ifstream in(dir / "out/arms/arm/rep0/decisions.jsonl");
    for (std::string line; std::getline(in, line);) {
      auto record = json::parseObject(line);
      EXPECT_TRUE(record.ok()) << line;
      if (record.ok()) out.push_back(routingFields(*record));
    }
    trace_path_ = dir / "trace.jsonl";
    return out;
  }

  // The same requests through the live router, one at a time, with the same failures.
  std::vector<std::string> live(const Scenario& s) {
    workers_ = s.workers;
    start(kEngines, s.policy, true, std::string(kRouterYaml));
    waitSubscribed();
    auto requests = trace::readAll(trace_path_.string(), {});
    EXPECT_TRUE(requests.ok()) << requests.status();
    auto synth = trace::TokenSynthesizer::create();
    EXPECT_TRUE(synth.ok());
    for (size_t k = 0; k < s.steps.size() && requests.ok(); ++k) {
      const Step& step = s.steps[k];
      for (int e : step.down) engines_[e]->stop();
      for (int e : step.error) engines_[e]->fail_status = 500;
      for (int e : step.stall) engines_[e]->stall_ms = 3000;
      for (int e : step.refuse_push) engines_[e]->refuse_push = true;
      for (int e : step.drain) admin("POST", e, "/drain");
      const trace::Request& r = (*requests)[k];
      std::vector<int32_t> tokens = synth->prompt(r, k);
      std::string body =
          strCat("{\"model\":\"fake-model\",\"max_tokens\":", r.output_length,
                 ",\"stream\":true,\"stream_options\":{\"include_usage\":true},\"user\":\"",
                 r.session_id, "\",\"prompt\":[", strJoin(tokens, ","), "]}");
      exchange(post("/v1/completions", std::move(body)));
      for (int e : step.error) engines_[e]->fail_status = 0;
      for (int e : step.stall) engines_[e]->stall_ms = 0;
      for (int e : step.refuse_push) engines_[e]->refuse_push = false;
      for (int e : step.drain) admin("POST", e, "/undrain");
      settle();
    }
    std::vector<std::string> out;
    for (auto& record : decisionLog()) out.push_back(routingFields(record));
    return out;
  }

  void admin(std::string method, int engine, std::string action) {
    http::ClientRequest r = post(strCat("/admin/instances/e", engine, action), "");
    r.method = std::move(method);
    r.headers.emplace_back("authorization", "Bearer s3cret");
    auto response = call(std::move(r));
    ASSERT_TRUE(response.ok() && response->status == 200) << engine << action;
  }

  // Sends a request and reads its whole answer (stream or error), whatever its status.
  void exchange(http::ClientRequest request) {
    engine_io_.run(
        [&]() -> asio::awaitable<bool> {
          auto s = co_await client_->open(request);
          if (!s.ok()) co_return false;
          for (;;) {
            auto piece = co_await (*s)->next();
            if (!piece.ok() || !piece->has_value()) co_return true;
          }
        },
        20s);
  }

  // Waits until no load is held anywhere and every engine's KV events are in the index.
  void settle() {
    bool settled = eventually([&] {
      bj::object all = adminInstances();
      if (!all.contains("instances")) return false;
      for (auto& v : all["instances"].as_array()) {
        const bj::object& i = v.as_object();
        int engine = std::stoi(std::string(i.at("id").as_string()).substr(1));
        size_t cached = engine_io_.run(
            [&]() -> asio::awaitable<size_t> { co_return engines_[engine]->cachedBlocks(); });
        if (i.at("running").as_int64() != 0 || i.at("pending_prefill_tokens").as_int64() != 0 ||
            static_cast<size_t>(i.at("index_blocks").as_int64()) != cached) {
          return false;
        }
      }
      return true;
    });
    ASSERT_TRUE(settled);
  }

  static std::string indent(std::string_view text) {
    std::string out;
    std::istringstream in{std::string(text)};
    for (std::string line; std::getline(in, line);) out += "  " + line + "\n";
    return out;
  }

  // Runs `s` both ways; expects equal logs and returns the live one for the scenario's own
  // checks.
  std::vector<bj::object> expectSame(const Scenario& s) {
    std::vector<std::string> simulated = simulate(s);
    std::vector<std::string> routed = live(s);
    EXPECT_EQ(routed.size(), simulated.size());
    for (size_t i = 0; i < std::min(routed.size(), simulated.size()); ++i) {
      EXPECT_EQ(routed[i], simulated[i]) << "attempt record " << i;
    }
    return decisionLog();
  }

  // Records of the live log matching every given (key, value).
  static size_t count(const std::vector<bj::object>& log,
                      std::vector<std::pair<std::string, bj::value>> match) {
    size_t n = 0;
    for (const auto& r : log) {
      bool all = true;
      for (const auto& [key, value] : match) all = all && r.contains(key) && r.at(key) == value;
      n += all;
    }
    return n;
  }

  fs::path trace_path_;
};

// Cold requests spread by the rotating cursor, a session following its prefix, a gone engine
// (refused twice: retried elsewhere with it excluded, then its circuit opens), every engine
// answering 500, and an engine that hangs past the read timeout.
TEST_F(SamenessTest, RetriesCircuitErrorsAndTimeoutsDecideAlike) {
  Scenario s;
  s.policy = "{kind: hybrid}";
  s.steps = {
      {"a", 1, 20},                                    // cold: e0
      {"b", 101, 20},                                  // cold: e1
      {"a", 1, 30},                                    // gate: e0
      {"a", 1, 40, 5, /*down=*/{0}},                   // e0 refused, retried on e1
      {"c", 201, 20},                                  // cold: e2
      {"d", 301, 20},                                  // e0 refused again: circuit open
      {"e", 401, 20},                                  // e0 not admitted
      {"f", 501, 20, 5, {}, /*error=*/{0, 1, 2}},      // 500
      {"g", 601, 20, 5, {}, {}, /*stall=*/{0, 1, 2}},  // read timeout: 502
      {"b", 101, 30},                                  // gate: e1
  };
  auto log = expectSame(s);
  EXPECT_EQ(log.size(), 12u);
  EXPECT_EQ(count(log, {{"status", 0}, {"instance", "e0"}}), 2u);
  EXPECT_EQ(count(log, {{"attempt", 2}, {"excluded", bj::array{"e0"}}}), 2u);
  EXPECT_EQ(count(log, {{"status", 500}}), 1u);
  EXPECT_EQ(count(log, {{"status", 502}}), 1u);
  EXPECT_EQ(count(log, {{"reason", "cache_gate"}}), 3u);
}

// A drained holder pushes its cached prefix to the instance that takes the session over; a
// holder that refuses the push leaves the receiver to prefill (the decision stands).
TEST_F(SamenessTest, PushMigrationFromADrainedHolderDecidesAlike) {
  Scenario s;
  s.policy = "{kind: unified}";
  s.workers = true;
  s.steps = {
      {"a", 1, 40},                                             // cold: e0
      {"b", 101, 40},                                           // cold: e1
      {"c", 201, 40},                                           // cold: e2
      {"d", 301, 40},                                           // cold: e0
      {"a", 1, 45, 5, {}, {}, {}, {}, /*drain=*/{0}},           // push from e0
      {"d", 301, 45, 5, {}, {}, {}, /*refuse_push=*/{0}, {0}},  // push refused
      {"b", 101, 45},                                           // local on e1
  };
  auto log = expectSame(s);
  EXPECT_EQ(log.size(), 7u);
  EXPECT_EQ(count(log, {{"mode", "push_migrate"}, {"source", "e0"}}), 2u);
}

// HEAVY prefills offloaded to a peer, one of which fails (D prefills locally).
TEST_F(SamenessTest, PrefillOffloadAndAFailingPeerDecideAlike) {
  Scenario s;
  s.policy = "{kind: elastic}";
  s.workers = true;
  s.steps = {
      {"h", 1, 1400},                           // offload: D e0, P e1
      {"i", 2001, 1400, 5, {}, /*error=*/{2}},  // offload: D e1, P e2 fails
      {"h", 1, 1410},                           // the session's prefix: gate
  };
  auto log = expectSame(s);
  EXPECT_EQ(log.size(), 3u);
  EXPECT_EQ(count(log, {{"mode", "prefill_offload"}, {"offload_prefill", "ok"}}), 1u);
  EXPECT_EQ(count(log, {{"mode", "prefill_offload"}, {"offload_prefill", "error"}}), 1u);
}

}  // namespace
}  // namespace kvf::router
