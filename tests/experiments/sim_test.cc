// The simulator (`kvf-experiment sim`): TTFT and TPOT that follow from a hand-made profile by
// arithmetic, prefix hits, byte-identical results for a seed (in-process and through parallel
// arm processes), engine failures, session dispatch, and sweep expansion and report.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "experiments/replay/result_log.h"
#include "experiments/sim/sim_config.h"
#include "experiments/sim/sim_internal.h"
#include "experiments/sim/sim_runner.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/toy_cluster.h"

namespace kvf::experiments::sim {
namespace {

namespace fs = std::filesystem;

using kvf::testing::freshTempDir;

std::string readFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The toy cluster (tests/testing/toy_cluster.h): step times follow stepSeconds().
void writeCluster(const fs::path& dir, int batched_tokens = 8192) {
  kvf::testing::writeToyCluster(dir, batched_tokens);
}

double stepSeconds(double n, double ctx) {
  return 0.010 + 2e9 * n / 1e12 + 4.0 * (n * ctx + n * (n + 1) / 2) / 1e12;
}

std::map<std::string, RequestResult> loadById(const fs::path& path) {
  auto results = loadResults(path.string());
  EXPECT_TRUE(results.ok()) << results.status();
  std::map<std::string, RequestResult> out;
  if (results.ok()) {
    for (auto& r : *results) out[r.request_id] = r;
  }
  return out;
}

absl::Status runSim(const fs::path& exp, const fs::path& out, int jobs = 1) {
  SimRunOptions options;
  options.output_dir = out.string();
  options.jobs = jobs;
  options.plots = false;
  return runSimExperiment(exp.string(), options);
}

TEST(SimTiming, TtftAndTpotFollowFromTheProfile) {
  fs::path dir = freshTempDir("kvf_sim_timing");
  writeCluster(dir);
  // r0: 1000 cold tokens, 1 output token. r1 (t = 10 s, r0 long done): the same prompt, 2
  // output tokens: 62 blocks (992 tokens) hit, 8 computed. Mooncake lines: 512-token blocks.
  std::ofstream(dir / "trace.jsonl")
      << R"({"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1, 2]})"
      << "\n"
      << R"({"timestamp": 10000, "input_length": 1000, "output_length": 2, "hash_ids": [1, 2]})"
      << "\n";
  std::ofstream(dir / "exp.yaml") << R"(name: timing
trace: {path: trace.jsonl}
cluster: {engines: 1, engine_config: engine.yaml}
sim:
  overheads: {request_ms: 1, request_per_ktoken_ms: 0, forward_ms: 2, response_ms: 3,
              kv_event_delay_ms: 1}
arms: [{name: rr, policy: {kind: round_robin}}]
)";
  ASSERT_TRUE(runSim(dir / "exp.yaml", dir / "out").ok());
  auto results = loadById(dir / "out/arms/rr/rep0/results.jsonl");
  ASSERT_EQ(results.size(), 2u);
  const double overhead = 0.001 + 0.002 + 0.003;
  const RequestResult& r0 = results["r0"];
  ASSERT_TRUE(r0.outcome.ok) << r0.outcome.error;
  EXPECT_NEAR(r0.outcome.ttft_s, overhead + stepSeconds(1000, 0), 2e-9);  // 2.016002002 s
  EXPECT_NEAR(r0.outcome.e2e_s, r0.outcome.ttft_s, 1e-12);
  EXPECT_EQ(r0.outcome.cached_tokens, 0);
  EXPECT_EQ(r0.outcome.output_tokens, 1);
  const RequestResult& r1 = results["r1"];
  ASSERT_TRUE(r1.outcome.ok) << r1.outcome.error;
  EXPECT_EQ(r1.outcome.cached_tokens, 992);
  EXPECT_NEAR(r1.outcome.ttft_s, overhead + stepSeconds(8, 992), 2e-9);  // 0.032000031888 s
  // The second token is one decode step over 1000 tokens.
  EXPECT_NEAR(r1.outcome.tpot_s, stepSeconds(1, 1000), 2e-9);
  EXPECT_NEAR(r1.outcome.e2e_s - r1.outcome.ttft_s, stepSeconds(1, 1000), 2e-9);
  // The engine's counters: 2000 tokens looked up, 992 found.
  std::string metrics = readFile(dir / "out/arms/rr/rep0/engine_0.metrics");
  EXPECT_NE(metrics.find("vllm:prefix_cache_queries_total{model_name=\"toy\"} 2000"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("vllm:prefix_cache_hits_total{model_name=\"toy\"} 992"),
            std::string::npos);
  EXPECT_TRUE(fs::exists(dir / "out/arms/rr/rep0/DONE"));
  EXPECT_TRUE(fs::exists(dir / "out/report.md"));
}

TEST(SimTiming, ChunkedPrefillAndQueueing) {
  fs::path dir = freshTempDir("kvf_sim_chunks");
  writeCluster(dir, /*batched_tokens=*/512);
  // Two cold 1000-token requests at t = 0 on one engine with a 512-token budget: r0 prefills
  // in chunks 512 + 488; r1 is admitted in step 2 with the 24 tokens left (FCFS), then 512,
  // then 464. r0's first token ends step 2; r1's ends step 4.
  std::ofstream(dir / "trace.jsonl")
      << R"({"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1, 2]})"
      << "\n"
      << R"({"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [3, 4]})"
      << "\n";
  std::ofstream(dir / "exp.yaml") << R"(name: chunks
trace: {path: trace.jsonl}
cluster: {engines: 1, engine_config: engine.yaml}
sim: {overheads: {request_ms: 0, request_per_ktoken_ms: 0, forward_ms: 0, response_ms: 0}}
arms: [{name: rr, policy: {kind: round_robin}}]
)";
  ASSERT_TRUE(runSim(dir / "exp.yaml", dir / "out").ok());
  auto results = loadById(dir / "out/arms/rr/rep0/results.jsonl");
  ASSERT_EQ(results.size(), 2u);
  // Step k's batch, as (new tokens, context) per request; attention terms add per request.
  auto step = [](std::vector<std::pair<double, double>> batch) {
    double n = 0, attn = 0;
    for (auto [t, c] : batch) {
      n += t;
      attn += 4.0 * (t * c + t * (t + 1) / 2);
    }
    return 0.010 + 2e9 * n / 1e12 + attn / 1e12;
  };
  double s1 = step({{512, 0}});
  double s2 = step({{488, 512}, {24, 0}});
  double s3 = step({{512, 24}});
  double s4 = step({{464, 536}});
  EXPECT_NEAR(results["r0"].outcome.ttft_s, s1 + s2, 4e-9);
  EXPECT_NEAR(results["r1"].outcome.ttft_s, s1 + s2 + s3 + s4, 4e-9);
}

// A synthetic trace with shared prefixes and sessions, deterministic from `seed`.
void writeTrace(const fs::path& path, int requests, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::ofstream out(path);
  for (int i = 0; i < requests; ++i) {
    int session = static_cast<int>(rng() % 12);
    int blocks = 2 + static_cast<int>(rng() % 6);
    out << "{\"timestamp\": " << i * 150 << ", \"input_length\": " << blocks * 512 - 100
        << ", \"output_length\": " << 1 + rng() % 60 << ", \"session_id\": \"s" << session
        << "\", \"id\": \"q" << i << "\", \"block_size\": 512, \"hash_ids\": [";
    for (int b = 0; b < blocks; ++b) {
      out << (b == 0 ? "" : ", ") << (b < 2 ? session * 100 + b : 100000 + i * 10 + b);
    }
    out << "]}\n";
  }
}

void writeAbExperiment(const fs::path& dir, const std::string& extra) {
  std::ofstream(dir / "exp.yaml") << R"(name: ab
trace: {path: trace.jsonl}
replay: {timeout_s: 600}
cluster: {engines: 3, engine_config: engine.yaml}
sim: {seed: 7, overheads: {jitter_ms: 5}}
arms:
  - {name: round_robin, policy: {kind: round_robin}}
  - {name: hybrid, policy: {kind: hybrid}}
)" << extra;
}

TEST(SimDeterminism, SameSeedGivesIdenticalBytes) {
  fs::path dir = freshTempDir("kvf_sim_det");
  writeCluster(dir);
  writeTrace(dir / "trace.jsonl", 120, 3);
  writeAbExperiment(dir, "");
  ASSERT_TRUE(runSim(dir / "exp.yaml", dir / "a").ok());
  ASSERT_TRUE(runSim(dir / "exp.yaml", dir / "b").ok());
  for (const char* arm : {"round_robin", "hybrid"}) {
    for (const char* file : {"results.jsonl", "decisions.jsonl", "engine_1.metrics"}) {
      fs::path rel = fs::path("arms") / arm / "rep0" / file;
      std::string a = readFile(dir / "a" / rel);
      EXPECT_FALSE(a.empty()) << rel;
      EXPECT_EQ(a, readFile(dir / "b" / rel)) << rel;
    }
  }
  // Another seed draws other jitter, so the bytes differ (the test can fail).
  std::string text = readFile(dir / "exp.yaml");
  text.replace(text.find("seed: 7"), 7, "seed: 8");
  std::ofstream(dir / "exp8.yaml") << text;
  ASSERT_TRUE(runSim(dir / "exp8.yaml", dir / "c").ok());
  EXPECT_NE(readFile(dir / "a/arms/hybrid/rep0/results.jsonl"),
            readFile(dir / "c/arms/hybrid/rep0/results.jsonl"));
}

// sim.repetitions overrides the experiment's repetitions for the simulator only; repetition k
// draws its jitter from seed + k, so rep1 at seed 7 is rep0 at seed 8.
// Router replicas: one replica is the single router exactly; two replicas with the load
// exchange decide differently from two blind ones (each then sees only its own requests), and
// both finish every request; the same inputs give the same bytes.
TEST(SimReplicas, ExchangeChangesDecisionsAndOneReplicaIsOneRouter) {
  fs::path dir = freshTempDir("kvf_sim_replicas");
  writeCluster(dir);
  writeTrace(dir / "trace.jsonl", 150, 5);
  auto write = [&](const std::string& name, const std::string& replicas) {
    std::ofstream(dir / name) << "name: rep\ntrace: {path: trace.jsonl}\n"
                              << "replay: {timeout_s: 600, time_scale: 4}\n"
                              << "cluster: {engines: 3, engine_config: engine.yaml}\n"
                              << "sim: {seed: 7" << replicas << "}\n"
                              << "arms:\n  - {name: lr, policy: {kind: least_request}}\n";
  };
  write("one.yaml", "");
  write("one_replica.yaml", ", replicas: {count: 1}");
  write("synced.yaml", ", replicas: {count: 2, sync: true, sync_interval_ms: 1}");
  write("blind.yaml", ", replicas: {count: 2, sync: false}");
  for (const char* name : {"one", "one_replica", "synced", "blind"}) {
    ASSERT_TRUE(runSim(dir / (std::string(name) + ".yaml"), dir / name).ok()) << name;
  }
  ASSERT_TRUE(runSim(dir / "synced.yaml", dir / "synced_again").ok());
  const fs::path rel = fs::path("arms") / "lr" / "rep0" / "results.jsonl";
  const fs::path decisions = fs::path("arms") / "lr" / "rep0" / "decisions.jsonl";
  EXPECT_EQ(readFile(dir / "one" / rel), readFile(dir / "one_replica" / rel));
  EXPECT_EQ(readFile(dir / "synced" / rel), readFile(dir / "synced_again" / rel));
  EXPECT_NE(readFile(dir / "synced" / decisions), readFile(dir / "blind" / decisions));
  // An arm's `routers: 2` is two replicas with the default exchange, as in `run`; a
  // replica count that disagrees with it is refused.
  std::string arm_routers = readFile(dir / "one.yaml");
  arm_routers.replace(arm_routers.find("least_request}}"), 15, "least_request}, routers: 2}");
  std::ofstream(dir / "arm_routers.yaml") << arm_routers;
  ASSERT_TRUE(runSim(dir / "arm_routers.yaml", dir / "arm_routers").ok());
  EXPECT_EQ(readFile(dir / "synced" / decisions), readFile(dir / "arm_routers" / decisions));
  std::string clash = readFile(dir / "blind.yaml");
  clash.replace(clash.find("least_request}}"), 15, "least_request}, routers: 3}");
  std::ofstream(dir / "clash.yaml") << clash;
  auto refused = runSim(dir / "clash.yaml", dir / "clash");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(std::string(refused.message()).find("disagrees with sim.replicas.count"),
            std::string::npos)
      << refused.message();
  for (const char* name : {"synced", "blind"}) {
    auto results = loadById(dir / name / rel);
    EXPECT_EQ(results.size(), 150u) << name;
    for (const auto& [id, r] : results) EXPECT_TRUE(r.outcome.error.empty()) << name << " " << id;
  }
}

TEST(SimDeterminism, SimRepetitionsDrawFromConsecutiveSeeds) {
  fs::path dir = freshTempDir("kvf_sim_reps");
  writeCluster(dir);
  writeTrace(dir / "trace.jsonl", 80, 5);
  writeAbExperiment(dir, "");
  std::string text = readFile(dir / "exp.yaml");
  text.replace(text.find("seed: 7"), 7, "seed: 7, repetitions: 2");
  std::ofstream(dir / "reps.yaml") << text;
  text = readFile(dir / "exp.yaml");
  text.replace(text.find("seed: 7"), 7, "seed: 8");
  std::ofstream(dir / "seed8.yaml") << text;
  ASSERT_TRUE(runSim(dir / "reps.yaml", dir / "reps").ok());
  ASSERT_TRUE(runSim(dir / "seed8.yaml", dir / "seed8").ok());
  for (const char* arm : {"round_robin", "hybrid"}) {
    fs::path arm_dir = dir / "reps/arms" / arm;
    EXPECT_TRUE(fs::exists(arm_dir / "rep0/DONE")) << arm;
    EXPECT_TRUE(fs::exists(arm_dir / "rep1/DONE")) << arm;
    EXPECT_FALSE(fs::exists(arm_dir / "rep2")) << arm;
    std::string rep1 = readFile(arm_dir / "rep1/results.jsonl");
    EXPECT_FALSE(rep1.empty());
    EXPECT_EQ(rep1, readFile(dir / "seed8/arms" / arm / "rep0/results.jsonl")) << arm;
  }
  EXPECT_NE(readFile(dir / "reps/arms/hybrid/rep0/results.jsonl"),
            readFile(dir / "reps/arms/hybrid/rep1/results.jsonl"));
}

TEST(SimDeterminism, ParallelArmProcessesMatchInProcess) {
  fs::path dir = freshTempDir("kvf_sim_par");
  writeCluster(dir);
  writeTrace(dir / "trace.jsonl", 80, 5);
  writeAbExperiment(dir, "");
  ASSERT_TRUE(runSim(dir / "exp.yaml", dir / "inproc", 1).ok());
  std::string cmd = std::string(KVF_EXPERIMENT_BIN) + " sim " + (dir / "exp.yaml").string() +
                    " --jobs 2 --plots=false --output_dir " + (dir / "forked").string() + " > " +
                    (dir / "forked.log").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << readFile(dir / "forked.log");
  for (const char* arm : {"round_robin", "hybrid"}) {
    fs::path rel = fs::path("arms") / arm / "rep0/results.jsonl";
    EXPECT_EQ(readFile(dir / "inproc" / rel), readFile(dir / "forked" / rel)) << arm;
  }
  // The report names its directory in the title; the rest is identical.
  std::string a = readFile(dir / "inproc/report.md"), b = readFile(dir / "forked/report.md");
  EXPECT_EQ(a.substr(a.find('\n')), b.substr(b.find('\n')));
}

TEST(SimFailures, InFlightRequestsFailAndTrafficMovesAway) {
  fs::path dir = freshTempDir("kvf_sim_fail");
  writeCluster(dir);
  // 40 requests, one every 0.5 s, 100 cold tokens and 50 output tokens each: 0.21 s of
  // prefill and 49 decode steps of 12 ms, about 0.8 s.
  {
    std::ofstream out(dir / "trace.jsonl");
    for (int i = 0; i < 40; ++i) {
      out << "{\"timestamp\": " << i * 500 << ", \"input_length\": 100, \"output_length\": 50, "
          << "\"hash_ids\": [" << i + 1 << "]}\n";
    }
  }
  std::ofstream(dir / "exp.yaml") << R"(name: fail
trace: {path: trace.jsonl}
cluster: {engines: 2, engine_config: engine.yaml}
router: {health: {interval_s: 1, unhealthy_threshold: 2}}
sim: {failures: [{instance: 0, at_s: 4.2, down_s: 6}]}
arms: [{name: rr, policy: {kind: round_robin}}]
)";
  ASSERT_TRUE(runSim(dir / "exp.yaml", dir / "out").ok());
  auto results = loadById(dir / "out/arms/rr/rep0/results.jsonl");
  ASSERT_EQ(results.size(), 40u);
  int failed = 0, on0_while_down = 0, on0_after = 0;
  for (auto& [id, r] : results) {
    if (!r.outcome.ok) {
      ++failed;
      EXPECT_NE(r.outcome.error.find("failed mid-stream"), std::string::npos) << r.outcome.error;
      EXPECT_EQ(r.outcome.instance, "0");
      continue;
    }
    if (r.outcome.instance != "0") continue;
    if (r.sent_s > 4.2 && r.sent_s < 10.2) ++on0_while_down;
    if (r.sent_s > 12) ++on0_after;
  }
  // Request r8 (sent at 4.0 s, running at 4.2 s) fails; r9 and later are retried on
  // instance 1 until the health check ejects 0; it comes back (cold) after 10.2 s.
  EXPECT_EQ(failed, 1);
  EXPECT_FALSE(results["r8"].outcome.ok);
  EXPECT_EQ(on0_while_down, 0);
  EXPECT_GT(on0_after, 5);
  std::string decisions = readFile(dir / "out/arms/rr/rep0/decisions.jsonl");
  EXPECT_NE(decisions.find("\"attempt\":2"), std::string::npos);  // a connection retry
}

TEST(SimDispatch, SessionTurnsWaitForThePreviousTurnAndThinkTime) {
  fs::path dir = freshTempDir("kvf_sim_session");
  writeCluster(dir);
  // Turn 2 is stamped 0.1 s after turn 1 but must wait for turn 1 (about 2 s) + 0.5 s think.
  std::ofstream(dir / "trace.jsonl")
      << R"({"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1, 2], )"
      << R"("session_id": "a", "id": "a#1", "turn": 1, "block_size": 512})"
      << "\n"
      << R"({"timestamp": 100, "input_length": 1000, "output_length": 1, "hash_ids": [1, 2], )"
      << R"("session_id": "a", "id": "a#2", "turn": 2, "think_time_ms": 500, "block_size": 512})"
      << "\n";
  std::ofstream(dir / "exp.yaml") << R"(name: session
trace: {path: trace.jsonl}
replay: {dispatch: session}
cluster: {engines: 2, engine_config: engine.yaml}
arms: [{name: hybrid, policy: {kind: hybrid}}]
)";
  ASSERT_TRUE(runSim(dir / "exp.yaml", dir / "out").ok());
  auto results = loadById(dir / "out/arms/hybrid/rep0/results.jsonl");
  ASSERT_EQ(results.size(), 2u);
  const auto& t1 = results["a#1"];
  const auto& t2 = results["a#2"];
  EXPECT_NEAR(t2.sent_s, t1.sent_s + t1.outcome.e2e_s + 0.5, 1e-6);
  // The session's prefix is on the instance of turn 1: the hybrid gate keeps it there.
  EXPECT_EQ(t2.outcome.instance, t1.outcome.instance);
  EXPECT_EQ(t2.outcome.cached_tokens, 992);
  EXPECT_EQ(t2.outcome.reason, "cache_gate");
}

// Tiers below the simulated pool (sim.engine.tiers): a prefix the pool evicted comes back from
// host memory through the same engine core as live, and costs its modelled onboard time.
TEST(SimTiers, AnEvictedPrefixIsServedFromHostMemory) {
  auto run = [](const std::string& name, const std::string& engine) {
    fs::path dir = freshTempDir(name);
    writeCluster(dir);
    // r0: blocks 1-2 (1000 tokens); r1: 1580 tokens of other blocks, which evict nearly all of
    // r0's from the 100-block pool; r2: r0's prompt again.
    std::ofstream(dir / "trace.jsonl")
        << R"({"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1, 2]})"
        << "\n"
        << R"({"timestamp": 5000, "input_length": 1580, "output_length": 1, "hash_ids": [3, 4, 5, 6]})"
        << "\n"
        << R"({"timestamp": 10000, "input_length": 1000, "output_length": 1, "hash_ids": [1, 2]})"
        << "\n";
    std::ofstream(dir / "exp.yaml") << "name: tiers\ntrace: {path: trace.jsonl}\n"
                                    << "cluster: {engines: 1, engine_config: engine.yaml}\n"
                                    << "sim: {engine: " << engine << "}\n"
                                    << "arms: [{name: rr, policy: {kind: round_robin}}]\n";
    EXPECT_TRUE(runSim(dir / "exp.yaml", dir / "out").ok());
    return loadById(dir / "out/arms/rr/rep0/results.jsonl");
  };
  auto plain = run("kvf_sim_no_tiers", "{cache: {num_gpu_blocks: 100}}");
  auto tiers =
      run("kvf_sim_tiers", "{cache: {num_gpu_blocks: 100}, tiers: {host: {capacity_mib: 1}}}");
  ASSERT_EQ(plain.size(), 3u);
  ASSERT_EQ(tiers.size(), 3u);
  EXPECT_LE(plain["r2"].outcome.cached_tokens, 16);
  EXPECT_EQ(tiers["r2"].outcome.cached_tokens, 992);
  EXPECT_LT(tiers["r2"].outcome.ttft_s, plain["r2"].outcome.ttft_s);
  // r0 found nothing either way: the first request is cold.
  EXPECT_EQ(tiers["r0"].outcome.cached_tokens, 0);
}

TEST(SimSweep, ExpandsArmsAndWritesOnePlotTablePerSweep) {
  fs::path dir = freshTempDir("kvf_sim_sweep");
  writeCluster(dir);
  writeTrace(dir / "trace.jsonl", 60, 9);
  writeAbExperiment(dir, R"(sweep:
  - {param: policy.hybrid.gate_fraction, values: [0.3, 0.9], arms: [hybrid]}
  - {param: sim.overheads.kv_event_delay_ms, values: [1, 5000]}
)");
  auto config = loadExperimentConfig((dir / "exp.yaml").string());
  ASSERT_TRUE(config.ok()) << config.status();
  auto sweeps = parseSweeps(config->sweep, config->arms, config->source);
  ASSERT_TRUE(sweeps.ok()) << sweeps.status();
  auto arms = expandArms(*config, *sweeps);
  ASSERT_TRUE(arms.ok()) << arms.status();
  std::vector<std::string> names;
  for (const auto& a : *arms) names.push_back(a.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{
                "round_robin", "hybrid", "hybrid@gate_fraction=0.3", "hybrid@gate_fraction=0.9",
                "round_robin@kv_event_delay_ms=1", "round_robin@kv_event_delay_ms=5000",
                "hybrid@kv_event_delay_ms=1", "hybrid@kv_event_delay_ms=5000"}));
  EXPECT_EQ((*arms)[3].policy["hybrid"]["gate_fraction"].as<double>(), 0.9);
  EXPECT_EQ((*arms)[3].policy["kind"].as<std::string>(), "hybrid");
  EXPECT_FALSE((*arms)[1].policy["hybrid"]);  // the base arm is untouched
  EXPECT_EQ((*arms)[7].sim["overheads"]["kv_event_delay_ms"].as<int>(), 5000);
  EXPECT_EQ((*arms)[7].sim["seed"].as<int>(), 7);

  ASSERT_TRUE(runSim(dir / "exp.yaml", dir / "out").ok());
  std::string csv = readFile(dir / "out/data/sweep.csv");
  EXPECT_NE(csv.find("0,policy.hybrid.gate_fraction,hybrid,0.9,hybrid@gate_fraction=0.9,60,"),
            std::string::npos)
      << csv;
  EXPECT_NE(csv.find("1,sim.overheads.kv_event_delay_ms,round_robin,base,round_robin,60,"),
            std::string::npos);
  std::string report = readFile(dir / "out/report.md");
  EXPECT_NE(report.find("### Sweep 1: `sim.overheads.kv_event_delay_ms`"), std::string::npos);
}

TEST(SimSweep, BadSweepsNameTheField) {
  std::vector<ArmConfig> arms(1);
  arms[0].name = "hybrid";
  auto bad_param = parseSweeps(YAML::Load("{param: gate_fraction, values: [1]}"), arms, "x.yaml");
  ASSERT_FALSE(bad_param.ok());
  EXPECT_NE(std::string(bad_param.status().message()).find("sweep[0].param"), std::string::npos)
      << bad_param.status();
  auto bad_arm =
      parseSweeps(YAML::Load("{param: policy.kind, values: [lmetric], arms: [nope]}"), arms, "x");
  ASSERT_FALSE(bad_arm.ok());
  EXPECT_NE(std::string(bad_arm.status().message()).find("no arm named 'nope'"), std::string::npos)
      << bad_arm.status();
  auto bad_sim = parseSimOptions(YAML::Load("{overheads: {request_ms: -1}}"), "x.yaml");
  ASSERT_FALSE(bad_sim.ok());
  EXPECT_NE(std::string(bad_sim.status().message()).find("sim.overheads.request_ms"),
            std::string::npos)
      << bad_sim.status();
}

}  // namespace
}  // namespace kvf::experiments::sim

namespace kvf::experiments::sim {
namespace {

TEST(SimTransfer, PushAndOffloadRunThroughTheEngineCore) {
  fs::path dir = freshTempDir("kvf_sim_push");
  writeCluster(dir);
  writeTrace(dir / "trace.jsonl", 150, 11);
  std::ofstream(dir / "exp.yaml") << R"(name: push
trace: {path: trace.jsonl}
cluster: {engines: 3, engine_config: engine.yaml, workers: true}
arms:
  - name: unified   # every move worth its model cost: no margin, no holder step
    policy: {kind: unified, unified: {move_margin: 0, source_step_s: 0}}
  - name: elastic   # offloads HEAVY requests only: make every request HEAVY
    policy: {kind: elastic, classify: {warm_max_new_tokens: 100, medium_max_new_tokens: 200},
             elastic: {max_cost_ratio: 100}}
)";
  ASSERT_TRUE(runSim(dir / "exp.yaml", dir / "out").ok());
  ASSERT_TRUE(runSim(dir / "exp.yaml", dir / "again").ok());
  for (const char* arm : {"unified", "elastic"}) {
    fs::path rel = fs::path("arms") / arm / "rep0/results.jsonl";
    EXPECT_EQ(readFile(dir / "out" / rel), readFile(dir / "again" / rel)) << arm;
    auto results = loadById(dir / "out" / rel);
    ASSERT_EQ(results.size(), 150u) << arm;
    int moved = 0, with_peer_blocks = 0;
    for (auto& [id, r] : results) {
      EXPECT_TRUE(r.outcome.ok) << arm << " " << id << ": " << r.outcome.error;
      if (r.outcome.decision == "local") continue;
      ++moved;
      // The decoder starts with the peer's blocks, unless the holder no longer (or not yet)
      // has them and the decoder falls back to local prefill.
      if (r.outcome.cached_tokens > 0) ++with_peer_blocks;
    }
    EXPECT_GT(moved, 0) << arm << ": no push or offload decision";
    EXPECT_GT(with_peer_blocks, moved / 2) << arm;
  }
}

// The token-free path (block keys from the trace's ids, the default) and the token path
// (synthesised token ids, hashed by the engines and the router) give byte-identical results,
// decisions and engine counters: Mooncake-style lines (partial last block) and agentic-style
// lines (unhashed tail), KV push and prefill offload, engine blocks dividing the trace's 512
// and not (48).
TEST(SimTokenFree, SameResultsAsTheTokenPath) {
  fs::path dir = freshTempDir("kvf_sim_token_free");
  writeCluster(dir);
  writeTrace(dir / "trace.jsonl", 160, 13);
  {
    std::ofstream out(dir / "trace.jsonl", std::ios::app);  // agentic style: floor(len / 512) ids
    for (int i = 0; i < 40; ++i) {
      out << "{\"timestamp\": " << 24000 + i * 200 << ", \"input_length\": " << 1024 + 11 * i
          << ", \"output_length\": 20, \"session_id\": \"t" << i % 4 << "\", \"id\": \"a" << i
          << "\", \"block_size\": 512, \"hash_ids\": [" << 900 + i % 4 << ", " << 950 + i % 2
          << "]}\n";
    }
  }
  for (int bs : {16, 48}) {
    for (bool token_free : {false, true}) {
      std::ofstream(dir / "exp.yaml")
          << "name: tf\ntrace: {path: trace.jsonl}\nreplay: {timeout_s: 600}\n"
          << "cluster: {engines: 3, engine_config: engine.yaml, workers: true}\n"
          << "router: {index: {block_size: " << bs << "}}\n"
          << "sim: {token_free: " << (token_free ? "true" : "false")
          << ", engine: {cache: {block_size: " << bs << "}}}\n"
          << "arms:\n  - {name: round_robin, policy: {kind: round_robin}}\n"
          << "  - {name: hybrid, policy: {kind: hybrid}}\n"
          << "  - {name: unified, policy: {kind: unified}}\n"
          << "  - name: elastic\n"
          << "    policy: {kind: elastic, classify: {warm_max_new_tokens: 100, "
          << "medium_max_new_tokens: 200}, elastic: {max_cost_ratio: 100}}\n";
      std::string out = "out" + std::to_string(bs) + (token_free ? "kf" : "tok");
      absl::Status status = runSim(dir / "exp.yaml", dir / out);
      ASSERT_TRUE(status.ok()) << out << ": " << status;
    }
    std::string tok = "out" + std::to_string(bs) + "tok", kf = "out" + std::to_string(bs) + "kf";
    for (const char* arm : {"round_robin", "hybrid", "unified", "elastic"}) {
      for (const char* file :
           {"results.jsonl", "decisions.jsonl", "engine_0.metrics", "engine_2.metrics"}) {
        fs::path rel = fs::path("arms") / arm / "rep0" / file;
        std::string a = readFile(dir / tok / rel);
        EXPECT_FALSE(a.empty()) << rel;
        EXPECT_EQ(a, readFile(dir / kf / rel)) << bs << " " << rel;
      }
      // Not vacuous: prefix hits happen, and some requests are not fully cached.
      auto results = loadById(dir / kf / "arms" / arm / "rep0/results.jsonl");
      ASSERT_EQ(results.size(), 200u);
      int hits = 0;
      for (auto& [id, r] : results) hits += r.outcome.cached_tokens > 0 ? 1 : 0;
      EXPECT_GT(hits, 20) << bs << " " << arm;
      EXPECT_LT(hits, 200) << bs << " " << arm;
    }
  }
}

// The event queue's FIFO lanes and its two heaps pop in exactly a single heap's (time, sequence)
// order, also when a push would break its lane's order (it goes to the heap).
TEST(SimEventQueue, LanesKeepTheHeapOrder) {
  std::mt19937_64 rng(17);
  EventQueue queue;
  std::vector<Event> all;
  uint64_t seq = 0;
  Nanos now = 0;
  for (int round = 0; round < 2000; ++round) {
    now += static_cast<Nanos>(rng() % 5);
    int n = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < n; ++i) {
      // -2 = the engine heap, -1 = the heap, else a lane.
      int lane = static_cast<int>(rng() % (EventQueue::kLanes + 2)) - 2;
      // Lanes get now + their fixed delay, sometimes from a later "now" (out of order).
      Nanos delay = lane < 0 ? static_cast<Nanos>(rng() % 50) : 10 * (lane + 1);
      Nanos t = now + delay + (rng() % 10 == 0 ? static_cast<Nanos>(rng() % 30) : 0);
      Event e{t, seq++, Ev::kArrival, static_cast<uint32_t>(round), 0};
      queue.push(e, lane);
      all.push_back(e);
    }
    if (rng() % 2 == 0 && !queue.empty()) {  // interleave pops with pushes
      Event e = queue.pop();
      auto least = std::min_element(all.begin(), all.end(), [](const Event& x, const Event& y) {
        return EventLater()(y, x);
      });
      ASSERT_EQ(e.seq, least->seq);
      all.erase(least);
    }
  }
  std::sort(all.begin(), all.end(),
            [](const Event& x, const Event& y) { return EventLater()(y, x); });
  for (const Event& expected : all) {
    ASSERT_FALSE(queue.empty());
    EXPECT_EQ(queue.pop().seq, expected.seq);
  }
  EXPECT_TRUE(queue.empty());
}

// The engine heap's deferred pop: a taken top is overwritten by the next push or removed at the
// next access; random takes, pushes and peeks give std::priority_queue's order.
TEST(SimEventQueue, ReplaceTopHeapMatchesAPriorityQueue) {
  std::mt19937_64 rng(5);
  ReplaceTopHeap heap;
  std::priority_queue<Event, std::vector<Event>, EventLater> reference;
  uint64_t seq = 0;
  for (int op = 0; op < 20000; ++op) {
    int what = static_cast<int>(rng() % 4);
    if (what <= 1 || reference.empty()) {
      Event e{static_cast<Nanos>(rng() % 100), seq++, Ev::kStepEnd, 0, 0};
      heap.push(e);
      reference.push(e);
    } else if (what == 2) {
      ASSERT_EQ(heap.take().seq, reference.top().seq);
      reference.pop();
    } else {
      ASSERT_EQ(heap.top().seq, reference.top().seq);
    }
    ASSERT_EQ(heap.empty(), reference.empty());
  }
}

}  // namespace
}  // namespace kvf::experiments::sim
