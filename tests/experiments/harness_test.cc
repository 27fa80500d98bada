#include "experiments/harness/harness.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/testing/temp_dir.h"

namespace kvf::experiments {
namespace {

namespace fs = std::filesystem;

using kvf::testing::freshTempDir;

TEST(ColdCheck, RefusesAWarmEngine) {
  EXPECT_TRUE(checkCold("vllm:prefix_cache_queries_total{engine=\"0\"} 0\n"
                        "vllm:prefix_cache_hits_total{engine=\"0\"} 0\n",
                        "engine 0")
                  .ok());
  absl::Status warm = checkCold(
      "vllm:prefix_cache_queries_total 4096\n"
      "vllm:prefix_cache_hits_total 2048\n",
      "engine 3");
  EXPECT_EQ(warm.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(warm.message()).find("engine 3 is not cold"), std::string::npos);
  // An engine that cannot show it is cold is refused too.
  EXPECT_FALSE(checkCold("vllm:num_requests_running 0\n", "engine 1").ok());
}

TEST(ExperimentConfig, ParsesAndReportsFieldPaths) {
  fs::path dir = freshTempDir("kvf_exp_cfg");
  std::ofstream(dir / "trace.jsonl") << "";
  std::ofstream(dir / "exp.yaml") << R"(name: ab
trace: {path: trace.jsonl, start_s: 10, duration_s: 60, limit: 5}
replay: {dispatch: session, time_scale: 2}
cluster: {engines: 4, engine_config: engine.yaml}
arms:
  - {name: rr, policy: {kind: round_robin}}
  - {name: lm, policy: {kind: lmetric}}
repetitions: 2
)";
  // A relative experiment path still gives absolute trace and engine paths.
  fs::path cwd = fs::current_path();
  fs::current_path(dir.parent_path());
  auto c = loadExperimentConfig((dir.filename() / "exp.yaml").string());
  fs::current_path(cwd);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->trace.path, (dir / "trace.jsonl").string());
  EXPECT_EQ(c->cluster.engine_config, (dir / "engine.yaml").string());
  EXPECT_EQ(c->replay.dispatch, DispatchMode::kSession);
  EXPECT_EQ(c->arms.size(), 2u);
  EXPECT_EQ(c->arms[1].policy["kind"].as<std::string>(), "lmetric");
  EXPECT_EQ(c->output_dir, "experiments/results/ab");

  std::ofstream(dir / "bad.yaml") << R"(name: ab
trace: {path: t.jsonl, windw: 3}
cluster: {engines: 1025, engine_config: e.yaml}
router: {instances: []}
arms:
  - {name: rr, policy: {kind: round_robin}}
  - {name: rr, policy: {kind: lmetric}}
)";
  auto bad = loadExperimentConfig((dir / "bad.yaml").string());
  ASSERT_FALSE(bad.ok());
  std::string m(bad.status().message());
  EXPECT_NE(m.find("trace.windw: unknown key"), std::string::npos) << m;
  EXPECT_NE(m.find("cluster.engines: value 1025 is out of range"), std::string::npos) << m;
  EXPECT_NE(m.find("'instances' is set by the harness"), std::string::npos) << m;
  EXPECT_NE(m.find("arms[1].name: duplicate arm 'rr'"), std::string::npos) << m;
}

// An arm's own `router:` settings merge over the experiment's, key by key, for that arm only;
// the keys the harness sets are refused there too.
TEST(ExperimentConfig, ArmRouterSettingsMergeOverTheExperiments) {
  fs::path dir = freshTempDir("kvf_exp_arm_router");
  std::ofstream(dir / "exp.yaml") << R"(name: ab
trace: {path: trace.jsonl}
cluster: {engines: 2, engine_config: engine.yaml}
router:
  health: {interval_s: 1}
  overload: {max_waiting: 4, max_queue: 100}
arms:
  - {name: plain, policy: {kind: hybrid}}
  - name: controlled
    policy: {kind: hybrid}
    router: {overload: {enabled: true, max_waiting: 8}}
)";
  auto c = loadExperimentConfig((dir / "exp.yaml").string());
  ASSERT_TRUE(c.ok()) << c.status();
  YAML::Node plain = armRouter(*c, c->arms[0]);
  YAML::Node controlled = armRouter(*c, c->arms[1]);
  EXPECT_FALSE(plain["overload"]["enabled"]);
  EXPECT_EQ(plain["overload"]["max_waiting"].as<int>(), 4);
  EXPECT_TRUE(controlled["overload"]["enabled"].as<bool>());
  EXPECT_EQ(controlled["overload"]["max_waiting"].as<int>(), 8);
  EXPECT_EQ(controlled["overload"]["max_queue"].as<int>(), 100);
  EXPECT_EQ(controlled["health"]["interval_s"].as<double>(), 1.0);
  // The experiment's section is not changed by the merge.
  EXPECT_EQ(c->router["overload"]["max_waiting"].as<int>(), 4);

  std::ofstream(dir / "bad.yaml") << R"(name: ab
trace: {path: trace.jsonl}
cluster: {engines: 2, engine_config: engine.yaml}
arms:
  - {name: a, policy: {kind: hybrid}, router: {decision_log: /tmp/x}}
  - {name: b, policy: {kind: hybrid}, router: [1]}
)";
  auto bad = loadExperimentConfig((dir / "bad.yaml").string());
  ASSERT_FALSE(bad.ok());
  std::string m(bad.status().message());
  EXPECT_NE(m.find("arms[0].router: 'decision_log' is set by the harness"), std::string::npos) << m;
  EXPECT_NE(m.find("arms[1].router: expected a map"), std::string::npos) << m;
}

// An arm's kv_connector: the dialect KV moves in (kvfabric by default, or vLLM's NIXL), only
// with workers, and nothing else.
TEST(ExperimentConfig, ArmKvConnector) {
  fs::path dir = freshTempDir("kvf_exp_connector");
  std::ofstream(dir / "trace.jsonl") << "";
  std::ofstream(dir / "exp.yaml") << R"(name: ab
trace: {path: trace.jsonl}
cluster: {engines: 2, engine_config: engine.yaml, workers: true}
arms:
  - {name: push, policy: {kind: unified}}
  - {name: pull, policy: {kind: unified}, kv_connector: nixl}
)";
  auto c = loadExperimentConfig((dir / "exp.yaml").string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arms[0].kv_connector, "kvfabric");
  EXPECT_EQ(c->arms[1].kv_connector, "nixl");

  std::ofstream(dir / "bad.yaml") << R"(name: ab
trace: {path: trace.jsonl}
cluster: {engines: 2, engine_config: engine.yaml}
arms:
  - {name: pull, policy: {kind: unified}, kv_connector: nixl}
  - {name: other, policy: {kind: unified}, kv_connector: mooncake}
)";
  auto bad = loadExperimentConfig((dir / "bad.yaml").string());
  ASSERT_FALSE(bad.ok());
  std::string m(bad.status().message());
  EXPECT_NE(m.find("arms[0].kv_connector: needs cluster.workers: true"), std::string::npos) << m;
  EXPECT_NE(m.find("arms[1].kv_connector: must be kvfabric or nixl"), std::string::npos) << m;
}

// ${KVF_TRACES_DIR} in a path: expanded when set, and otherwise an error naming the field, its
// line and the variable (never a silent fallback to some default folder).
TEST(ExperimentConfig, TracesDirVariableInPaths) {
  fs::path dir = freshTempDir("kvf_exp_vars");
  fs::create_directories(dir / "sets" / "agentic-coding");
  std::ofstream(dir / "exp.yaml") << R"(name: v
trace: {path: "${KVF_TRACES_DIR}/agentic-coding", format: agentic}
cluster: {engine_config: engine.yaml}
arms: [{name: rr, policy: {kind: round_robin}}]
)";
  std::string file = (dir / "exp.yaml").string();
  auto c = loadExperimentConfig(file, {{"KVF_TRACES_DIR", (dir / "sets").string()}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->trace.path, (dir / "sets" / "agentic-coding").string());

  auto unset = loadExperimentConfig(file);
  ASSERT_FALSE(unset.ok());
  std::string m(unset.status().message());
  EXPECT_NE(m.find(file + ":2:"), std::string::npos) << m;
  EXPECT_NE(m.find("trace.path: ${KVF_TRACES_DIR} is not set: set KVF_TRACES_DIR"),
            std::string::npos)
      << m;

  auto missing = loadExperimentConfig(file, {{"KVF_TRACES_DIR", (dir / "nowhere").string()}});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(std::string(missing.status().message()).find("which does not exist"), std::string::npos)
      << missing.status();

  EXPECT_FALSE(expandPathVariables("${HOME}/x", {{"HOME", "/root"}}).ok());  // only ours
  EXPECT_FALSE(expandPathVariables("${KVF_TRACES_DIR", {}).ok());
  EXPECT_EQ(*expandPathVariables("a/${KVF_TRACES_DIR}/b", {{"KVF_TRACES_DIR", "t"}}), "a/t/b");
  EXPECT_EQ(*expandPathVariables("plain/path", {}), "plain/path");
}

TEST(Harness, TraceSliceKeepsTheWindowAndLimit) {
  fs::path dir = freshTempDir("kvf_exp_slice");
  {
    std::ofstream t(dir / "trace.jsonl");
    for (int i = 0; i < 20; ++i) {
      t << "{\"timestamp\": " << i * 1000 << ", \"input_length\": 600, \"output_length\": 5, "
        << "\"hash_ids\": [" << i << ", " << 100 + i << "]}\n";
    }
  }
  ExperimentConfig config;
  config.name = "slice";
  config.output_dir = (dir / "out").string();
  config.trace.path = (dir / "trace.jsonl").string();
  config.trace.start_s = 5;
  config.trace.duration_s = 10;  // requests at 5..14 s
  config.trace.limit = 4;
  Harness harness(config, "/nonexistent");
  ASSERT_TRUE(harness.prepareTrace().ok());
  ASSERT_EQ(harness.requests().size(), 4u);
  EXPECT_EQ(harness.requests()[0].arrival, secondsToNanos(5));
  EXPECT_EQ(harness.requests()[0].id, "r5");
  EXPECT_TRUE(fs::exists(dir / "out" / "trace.jsonl"));
}

}  // namespace
}  // namespace kvf::experiments
