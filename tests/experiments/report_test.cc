#include "experiments/report/report.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "experiments/report/prom_text.h"
#include "experiments/report/report_summary.h"
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

RequestResult served(const std::string& instance, double sent_s, double ttft_s,
                     int64_t prompt_tokens) {
  RequestResult r;
  r.request_id = instance + "@" + std::to_string(sent_s);
  r.sent_s = sent_s;
  r.input_length = prompt_tokens;
  r.outcome.ok = true;
  r.outcome.instance = instance;
  r.outcome.ttft_s = ttft_s;
  r.outcome.e2e_s = 10;
  r.outcome.prompt_tokens = prompt_tokens;
  return r;
}

TEST(ReportSummary, QueueingAndBalanceCountIdleInstances) {
  ArmData arm;
  arm.name = "piled";
  // Instance 0 takes three requests whose prefills overlap (first tokens at 5, 6 and 7 s),
  // instance 1 one, instances 2 and 3 none.
  arm.reps.push_back({served("0", 0, 5, 1000), served("0", 1, 5, 1000), served("0", 2, 5, 1000),
                      served("1", 0, 5, 5000)});
  ArmBalance b = balanceOf(arm, 4);
  EXPECT_DOUBLE_EQ(b.prefill_ahead_tokens, (0 + 1000 + 2000 + 0) / 4.0);
  EXPECT_DOUBLE_EQ(b.max_over_mean_requests, 3.0);  // 3 of a mean of 1 per instance
  EXPECT_DOUBLE_EQ(b.max_over_mean_tokens, 2.5);    // 5000 of a mean of 2000
  EXPECT_EQ(b.busiest, "0");
  EXPECT_EQ(b.busiest_requests, 3);
  EXPECT_EQ(b.least_requests, 0);
  // A request that had its first token before the next was sent does not queue it; cached
  // tokens need no prefill.
  ArmData spread;
  spread.reps.push_back(
      {served("0", 0, 1, 1000), served("0", 1, 1, 1000), served("0", 1.5, 1, 1000)});
  spread.reps[0][1].outcome.cached_tokens = 600;
  EXPECT_DOUBLE_EQ(balanceOf(spread, 1).prefill_ahead_tokens, (0 + 0 + 400) / 3.0);
}

TEST(ReportSummary, WhyNamesTheFiguresThatSeparateTheArms) {
  ArmData even, piled;
  even.name = "even";
  piled.name = "piled";
  even.reps.push_back({served("0", 0, 1, 1000), served("1", 1, 1, 1000), served("2", 2, 1, 1000),
                       served("3", 3, 1, 1000)});
  piled.reps.push_back({served("0", 0, 3, 1000), served("0", 1, 3, 1000), served("0", 2, 3, 1000),
                        served("1", 3, 3, 1000)});
  even.instance_cache["0"] = {50, 100};
  piled.instance_cache["0"] = {60, 100};
  std::vector<ArmData> arms = {even, piled};
  std::vector<ReplaySummary> sums = {summarize(even.reps[0]), summarize(piled.reps[0])};
  std::vector<ArmBalance> balances = {balanceOf(even, 4), balanceOf(piled, 4)};
  std::string why = whyParagraph(arms, sums, balances);
  EXPECT_NE(why.find("even has the lowest mean TTFT (1.000 s) and piled the highest (3.000 s"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("piled hits the cache more (+10.0 points) but its requests wait behind "
                     "more prefill (750 vs 0 tokens queued ahead)"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("The most uneven load is piled's: its busiest instance (0) took 3 "
                     "requests, 3.00x the mean"),
            std::string::npos)
      << why;
  // Arms within noise of each other are called so, not ranked.
  std::vector<ArmData> twins = {even, even};
  std::vector<ReplaySummary> twin_sums = {sums[0], sums[0]};
  std::vector<ArmBalance> twin_balances = {balances[0], balances[0]};
  EXPECT_NE(whyParagraph(twins, twin_sums, twin_balances).find("They differ by 0.0%"),
            std::string::npos);
  // The other way round the explanation changes with the figures.
  piled.instance_cache["0"] = {10, 100};
  arms = {even, piled};
  why = whyParagraph(arms, sums, balances);
  EXPECT_NE(why.find("even serves 40.0 points more of the prompts from cache and queues no more "
                     "prefill"),
            std::string::npos)
      << why;
}

TEST(ReportSummary, SetupStatesSliceScaleAndLoad) {
  fs::path dir = kvf::testing::freshTempDir("kvf_report_setup");
  std::ofstream(dir / "experiment.yaml")
      << "name: s\ntrace: {path: ../../data/traces/mooncake/conversation_trace.jsonl, "
         "duration_s: 240}\nreplay: {time_scale: 8}\ncluster: {engines: 8, engine_config: "
         "../../engine/configs/engine.yaml, engine_time_scale: 8}\narms: []\n";
  {
    std::ofstream t(dir / "trace.jsonl");
    for (int i = 0; i < 5; ++i) {  // 5 requests over 4 s: 1.25 req/s, 2,000 tokens each
      t << "{\"timestamp\": " << i * 1000 << ", \"input_length\": 2000, \"output_length\": 10, "
        << "\"hash_ids\": [" << i << ", " << 10 + i << ", " << 20 + i << ", " << 30 + i << "]}\n";
    }
  }
  auto setup = readSetup(dir.string());
  ASSERT_TRUE(setup.ok()) << setup.status();
  EXPECT_TRUE(setup->simulated);  // no router.yaml under arms/
  EXPECT_EQ(setup->requests, 5);
  EXPECT_DOUBLE_EQ(setup->offered_requests_per_s, 1.25);
  EXPECT_DOUBLE_EQ(setup->offered_prompt_tokens_per_s_per_engine, 2500.0 / 8);
  std::string text = setupParagraph(*setup);
  for (const char* part :
       {"**Setup.** 5 requests from `conversation_trace.jsonl`", "trace seconds 0-240",
        "Simulated: 8 engines (`engine.yaml`)", "**Time scale 8**",
        "multiply by 8 for modelled seconds", "1.25 requests/s, 313 prompt tokens/s per engine",
        "offered utilisation: not computed yet"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
  }
  setup->offered_utilisation = 0.85;
  EXPECT_NE(setupParagraph(*setup).find("offered utilisation 85%"), std::string::npos);
  EXPECT_NE(setupParagraph(ExperimentSetup{}).find("Not recorded"), std::string::npos);
  EXPECT_EQ(terminalSummary("# R\n\nsetup\n\n| t |\n\n**Why.** x\n\n## Change\nmore\n"),
            "# R\n\nsetup\n\n| t |\n\n**Why.** x\n\n");
}

}  // namespace
}  // namespace kvf::experiments
