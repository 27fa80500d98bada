#include "experiments/report/report.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "experiments/report/prom_text.h"
#include "tests/testing/temp_dir.h"

namespace kvf::experiments {
namespace {

namespace fs = std::filesystem;

TEST(PromText, ParsesSamplesLabelsAndSpecialValues) {
  auto samples = parsePromText(
      "# HELP vllm:prefix_cache_hits_total Hits.\n"
      "# TYPE vllm:prefix_cache_hits_total counter\n"
      "vllm:prefix_cache_hits_total{model_name=\"m\",engine=\"0\"} 1234\n"
      "vllm:prefix_cache_hits_total{model_name=\"m\",engine=\"1\"} 6 1700000000000\n"
      "x_bucket{le=\"+Inf\",a=\"q\\\"uote\"} +Inf\n"
      "plain 2.5e-3\n");
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 4u);
  EXPECT_EQ((*samples)[0].labels.at("engine"), "0");
  EXPECT_EQ((*samples)[2].labels.at("a"), "q\"uote");
  EXPECT_TRUE(std::isinf((*samples)[2].value));
  EXPECT_DOUBLE_EQ((*samples)[3].value, 0.0025);
  EXPECT_DOUBLE_EQ(*sumOf(*samples, "vllm:prefix_cache_hits_total"), 1240);
  EXPECT_FALSE(sumOf(*samples, "missing").has_value());
  EXPECT_FALSE(parsePromText("bad{label 1\n").ok());
  EXPECT_FALSE(parsePromText("name notanumber\n").ok());
}

TEST(Bootstrap, DeltaAndIntervalOnKnownSamples) {
  std::vector<std::vector<double>> base = {std::vector<double>(200, 1.0)};
  std::vector<std::vector<double>> half = {std::vector<double>(200, 0.5)};
  double (*mean)(std::vector<double>&) = [](std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s / static_cast<double>(v.size());
  };
  Delta d = bootstrapDelta(base, half, mean);
  EXPECT_DOUBLE_EQ(d.value, -0.5);
  EXPECT_DOUBLE_EQ(d.low, -0.5);
  EXPECT_DOUBLE_EQ(d.high, -0.5);
  // With spread, the interval brackets the point estimate and is deterministic per seed.
  std::vector<double> noisy;
  for (int i = 0; i < 200; ++i) noisy.push_back(0.5 + 0.01 * (i % 21));
  Delta e = bootstrapDelta(base, {noisy}, mean);
  EXPECT_LT(e.low, e.value);
  EXPECT_GT(e.high, e.value);
  Delta again = bootstrapDelta(base, {noisy}, mean);
  EXPECT_EQ(e.low, again.low);
}

void writeRep(const fs::path& dir, double ttft, const std::string& instance, double hits,
              double queries) {
  fs::create_directories(dir);
  std::ofstream out(dir / "results.jsonl");
  for (int i = 0; i < 50; ++i) {
    RequestResult r;
    r.request_id = std::to_string(i);
    r.input_length = i < 25 ? 1000 : 30000;
    r.output_length = 10;
    r.sent_s = i * 0.1;
    r.outcome.ok = true;
    r.outcome.ttft_s = ttft;
    r.outcome.e2e_s = ttft + 1;
    r.outcome.tpot_s = 0.02;
    r.outcome.prompt_tokens = r.input_length;
    r.outcome.cached_tokens = 0;
    r.outcome.instance = instance;
    r.outcome.decision = "local";
    out << r.toJsonLine() << "\n";
  }
  std::ofstream metrics(dir / ("engine_" + instance + ".metrics"));
  metrics << "vllm:prefix_cache_hits_total{engine=\"0\"} " << hits << "\n"
          << "vllm:prefix_cache_queries_total{engine=\"0\"} " << queries << "\n";
}

TEST(Report, TablesDeltasAndPlotsFromAResultDirectory) {
  fs::path dir = kvf::testing::freshTempDir("kvf_report");
  writeRep(dir / "arms" / "round_robin" / "rep0", 2.0, "0", 10, 100);
  writeRep(dir / "arms" / "round_robin" / "rep1", 2.0, "1", 30, 100);
  writeRep(dir / "arms" / "lmetric" / "rep0", 1.0, "0", 60, 100);
  std::ofstream(dir / "arms.txt") << "round_robin\nlmetric\n";
  auto md = writeReport(dir.string(), true);
  ASSERT_TRUE(md.ok()) << md.status();
  // Baseline first, cluster APC = sum(hits) / sum(queries).
  EXPECT_NE(md->find("| round_robin | 100 | 0 | 20.0% | 2.000"), std::string::npos) << *md;
  EXPECT_NE(md->find("| lmetric | 50 | 0 | 60.0% | 1.000"), std::string::npos) << *md;
  EXPECT_NE(md->find("| lmetric | -50.0% [-50.0%, -50.0%]"), std::string::npos) << *md;
  EXPECT_NE(md->find("inst_0=10.0%, inst_1=30.0%"), std::string::npos) << *md;
  EXPECT_NE(md->find("| lmetric | HEAVY | 25 |"), std::string::npos) << *md;
  EXPECT_TRUE(fs::exists(dir / "report.md"));
  EXPECT_TRUE(fs::exists(dir / "data" / "latencies.csv"));
  for (const char* png : {"ttft_cdf.png", "e2e_cdf.png", "instance_apc.png", "load.png"}) {
    EXPECT_TRUE(fs::exists(dir / "plots" / png)) << png;
  }
}

}  // namespace
}  // namespace kvf::experiments
