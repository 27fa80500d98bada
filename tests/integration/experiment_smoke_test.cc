// kvf-experiment run end to end: real kvf-engine and kvf-router processes on loopback, two
// arms on a 12-request slice of the Mooncake conversation trace in data/traces/ (cut at run time),
// time compressed 20x. Checks every request succeeded through the router, each repetition started
// cold and finished, the report compares the arms, and a second run resumes without redoing
// finished arms.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "experiments/replay/result_log.h"
#include "tests/testing/temp_dir.h"

namespace {

namespace fs = std::filesystem;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string readFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ExperimentSmoke, TwoArmsOnRealEnginesAndRouter) {
  std::string bin = env("KVF_BIN_DIR"), src = env("KVF_SOURCE_DIR");
  ASSERT_FALSE(bin.empty());
  fs::path trace = fs::path(src) / "data" / "traces" / "mooncake" / "conversation_trace.jsonl";
  ASSERT_TRUE(fs::exists(trace)) << "the repository's trace is missing: " << trace;
  fs::path dir = kvf::testing::freshTempDir("kvf_exp_smoke");
  std::ofstream(dir / "exp.yaml") << "name: smoke\n"
                                  << "output_dir: " << (dir / "out").string() << "\n"
                                  << "trace: {path: " << trace.string() << ", limit: 12}\n"
                                  << "replay: {time_scale: 20, timeout_s: 60}\n"
                                  << "cluster:\n  engines: 2\n  engine_config: "
                                  << (fs::path(src) / "engine/configs/engine.yaml").string()
                                  << "\n  engine_time_scale: 20\n"
                                  << "arms:\n  - {name: rr, policy: {kind: round_robin}}\n"
                                  << "  - {name: lm, policy: {kind: lmetric}}\n";
  std::string cmd = bin + "/kvf-experiment run " + (dir / "exp.yaml").string() +
                    " --plots=false > " + (dir / "run.log").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << readFile(dir / "run.log");

  for (const char* arm : {"rr", "lm"}) {
    fs::path rep = dir / "out" / "arms" / arm / "rep0";
    EXPECT_TRUE(fs::exists(rep / "DONE")) << arm;
    auto results = kvf::experiments::loadResults((rep / "results.jsonl").string());
    ASSERT_TRUE(results.ok()) << results.status();
    ASSERT_EQ(results->size(), 12u) << arm;
    for (const auto& r : *results) {
      EXPECT_TRUE(r.outcome.ok) << arm << " " << r.request_id << ": " << r.outcome.error;
      EXPECT_GT(r.outcome.ttft_s, 0);
      EXPECT_EQ(r.outcome.output_tokens, r.output_length);
      EXPECT_TRUE(r.outcome.instance == "0" || r.outcome.instance == "1") << r.outcome.instance;
    }
    // Both engines were scraped before (cold) and after the replay.
    for (int i = 0; i < 2; ++i) {
      std::string before = readFile(rep / ("engine_" + std::to_string(i) + ".before.prom"));
      EXPECT_NE(before.find("vllm:prefix_cache_queries_total"), std::string::npos);
      EXPECT_TRUE(fs::exists(rep / ("engine_" + std::to_string(i) + ".metrics")));
    }
    EXPECT_FALSE(readFile(rep / "decisions.jsonl").empty());
  }
  std::string report = readFile(dir / "out" / "report.md");
  EXPECT_NE(report.find("| rr | 12 | 0 |"), std::string::npos) << report;
  EXPECT_NE(report.find("| lm | 12 | 0 |"), std::string::npos) << report;
  EXPECT_NE(report.find("Change against the baseline (rr)"), std::string::npos) << report;
  // The report says what ran, at which time scale, and why the arms differ; the run prints that
  // part, table included, when it ends.
  EXPECT_NE(report.find("**Setup.** 12 requests"), std::string::npos) << report;
  EXPECT_NE(report.find("Live: 2 engines"), std::string::npos) << report;
  EXPECT_NE(report.find("**Time scale 20**"), std::string::npos) << report;
  EXPECT_NE(report.find("**Why.** "), std::string::npos) << report;
  std::string printed = readFile(dir / "run.log");
  EXPECT_NE(printed.find("| arm | requests | errors |"), std::string::npos) << printed;
  EXPECT_NE(printed.find("**Why.** "), std::string::npos) << printed;

  // A second run finds every repetition done and only rewrites the report.
  auto stamp = fs::last_write_time(dir / "out" / "arms" / "rr" / "rep0" / "results.jsonl");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << readFile(dir / "run.log");
  EXPECT_EQ(fs::last_write_time(dir / "out" / "arms" / "rr" / "rep0" / "results.jsonl"), stamp);
  EXPECT_NE(readFile(dir / "run.log").find("already done, skipping"), std::string::npos);
}

// Engines with a disk tier: each gets its own config and tier directory (a tier directory is
// locked by one process, so a shared one kept the second engine from starting), and the
// directories are gone once the repetition ends.
TEST(ExperimentSmoke, EnginesWithADiskTierGetTheirOwnDirectory) {
  std::string bin = env("KVF_BIN_DIR"), src = env("KVF_SOURCE_DIR");
  ASSERT_FALSE(bin.empty());
  fs::path trace = fs::path(src) / "data" / "traces" / "mooncake" / "conversation_trace.jsonl";
  fs::path dir = kvf::testing::freshTempDir("kvf_exp_tiers");
  std::string engine = readFile(fs::path(src) / "engine/configs/engine.yaml");
  const std::string rel = "profile: ../profiles/";
  ASSERT_NE(engine.find(rel), std::string::npos);
  engine.replace(engine.find(rel), rel.size(),
                 "profile: " + (fs::path(src) / "engine/profiles").string() + "/");
  std::ofstream(dir / "engine.yaml")
      << engine << "\ntiers:\n  host: {capacity_mib: 8, pin: off}\n  disk: {dir: "
      << (dir / "shared-disk").string() << ", capacity_mib: 16}\n";
  std::ofstream(dir / "exp.yaml") << "name: tiers\noutput_dir: " << (dir / "out").string()
                                  << "\ntrace: {path: " << trace.string() << ", limit: 6}\n"
                                  << "replay: {time_scale: 20, timeout_s: 60}\n"
                                  << "cluster: {engines: 2, engine_config: "
                                  << (dir / "engine.yaml").string() << ", engine_time_scale: 20}\n"
                                  << "arms:\n  - {name: rr, policy: {kind: round_robin}}\n";
  std::string cmd = bin + "/kvf-experiment run " + (dir / "exp.yaml").string() +
                    " --plots=false > " + (dir / "run.log").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << readFile(dir / "run.log");
  fs::path rep = dir / "out" / "arms" / "rr" / "rep0";
  EXPECT_TRUE(fs::exists(rep / "DONE"));
  auto results = kvf::experiments::loadResults((rep / "results.jsonl").string());
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 6u);
  for (const auto& r : *results)
    EXPECT_TRUE(r.outcome.ok) << r.request_id << ": " << r.outcome.error;
  for (int i = 0; i < 2; ++i) {
    std::string config = readFile(rep / ("engine_" + std::to_string(i) + ".yaml"));
    EXPECT_NE(config.find((rep / ("disk_" + std::to_string(i))).string()), std::string::npos)
        << config;
    EXPECT_FALSE(fs::exists(rep / ("disk_" + std::to_string(i))));
  }
  EXPECT_FALSE(fs::exists(dir / "shared-disk"));
}

}  // namespace
