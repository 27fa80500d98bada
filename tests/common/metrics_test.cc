#include "common/metrics.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

namespace kvf::metrics {
namespace {

TEST(Metrics, CountersGaugesHistograms) {
  Registry r;
  Counter& c = r.counter("kvfabric_test_requests_total", "Requests.", {{"policy", "lmetric"}});
  c.inc();
  c.inc(2);
  EXPECT_EQ(c.value(), 3);
  // Same name and labels give the same object.
  EXPECT_EQ(&r.counter("kvfabric_test_requests_total", "Requests.", {{"policy", "lmetric"}}), &c);
  Gauge& g = r.gauge("kvfabric_test_inflight", "In flight.");
  g.set(5);
  g.dec();
  EXPECT_EQ(g.value(), 4);
  Histogram& h = r.histogram("kvfabric_test_latency_seconds", "Latency.", {0.1, 1.0});
  h.observe(0.05);
  h.observe(0.1);  // le is inclusive
  h.observe(0.5);
  h.observe(7);
  auto cumulative = h.cumulativeCounts();
  ASSERT_EQ(cumulative.size(), 3u);
  EXPECT_EQ(cumulative[0], 2u);
  EXPECT_EQ(cumulative[1], 3u);
  EXPECT_EQ(cumulative[2], 4u);
  EXPECT_DOUBLE_EQ(h.sum(), 7.65);

  std::string text = r.exposition();
  EXPECT_NE(text.find("# TYPE kvfabric_test_requests_total counter\n"
                      "kvfabric_test_requests_total{policy=\"lmetric\"} 3\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("kvfabric_test_latency_seconds_bucket{le=\"0.1\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("kvfabric_test_latency_seconds_bucket{le=\"+Inf\"} 4\n"), std::string::npos);
  EXPECT_NE(text.find("kvfabric_test_latency_seconds_count 4\n"), std::string::npos);
  EXPECT_NE(text.find("kvfabric_test_inflight 4\n"), std::string::npos);
}

TEST(Metrics, CallbackAndEscaping) {
  Registry r;
  double value = 1.5;
  r.callback("kvfabric_test_usage_ratio", "Usage with \\ and\nnewline.", MetricType::kGauge,
             {{"instance", "a\"b\\c\nd"}}, [&] { return value; });
  value = 0.25;
  std::string text = r.exposition();
  EXPECT_NE(text.find("# HELP kvfabric_test_usage_ratio Usage with \\\\ and\\nnewline.\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("kvfabric_test_usage_ratio{instance=\"a\\\"b\\\\c\\nd\"} 0.25\n"),
            std::string::npos)
      << text;
}

TEST(Metrics, ConcurrentUpdatesAreCounted) {
  Registry r;
  Counter& c = r.counter("kvfabric_test_ops_total", "Ops.");
  Histogram& h = r.histogram("kvfabric_test_op_seconds", "Op time.", latencyBuckets());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c.inc();
        h.observe(0.001);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.value(), 40000);
  EXPECT_EQ(h.count(), 40000u);
}

TEST(Metrics, FormatValue) {
  EXPECT_EQ(formatValue(3), "3");
  EXPECT_EQ(formatValue(0.5), "0.5");
  EXPECT_EQ(formatValue(1.0 / 0.0), "+Inf");
  EXPECT_EQ(formatValue(-1.0 / 0.0), "-Inf");
}

// The exposition must pass `promtool check metrics` (installed by scripts/setup).
TEST(Metrics, ExpositionPassesPromtool) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) {
    FAIL() << "promtool not found: run scripts/setup (Debian package prometheus)";
  }
  Registry r;
  r.counter("kvfabric_router_requests_total", "Requests routed.", {{"policy", "hybrid"}}).inc(7);
  r.counter("kvfabric_router_requests_total", "Requests routed.", {{"policy", "lmetric"}}).inc();
  r.gauge("kvfabric_router_instances", "Healthy instances.").set(8);
  auto& h = r.histogram("kvfabric_router_decide_seconds", "Decision time.", latencyBuckets(),
                        {{"policy", "hybrid"}});
  h.observe(0.00002);
  h.observe(0.3);
  r.callback("kvfabric_router_index_blocks", "Blocks in the cache index.", MetricType::kGauge, {},
             [] { return 12345.0; });
  std::string path = ::testing::TempDir() + "/kvf_metrics_promtool.txt";
  {
    std::ofstream out(path);
    out << r.exposition();
  }
  std::string cmd = "promtool check metrics < " + path + " > " + path + ".out 2>&1";
  int rc = std::system(cmd.c_str());
  std::ifstream result(path + ".out");
  std::string output((std::istreambuf_iterator<char>(result)), std::istreambuf_iterator<char>());
  EXPECT_EQ(rc, 0) << output;
  EXPECT_EQ(output, "") << output;
}

// Retiring a label value removes its series from the exposition; a holder of a retired metric
// may keep updating it until the handle goes.
TEST(MetricsTest, RetireDropsSeriesOfALabelValue) {
  Registry r;
  Counter& gone = r.counter("requests_total", "Requests", {{"instance", "a"}});
  r.counter("requests_total", "Requests", {{"instance", "b"}}).inc(2);
  r.histogram("latency_seconds", "Latency", {1.0}, {{"instance", "a"}, {"kind", "x"}});
  r.callback("depth", "Depth", MetricType::kGauge, {{"instance", "a"}}, [] { return 1.0; });
  auto handle = r.retire("instance", "a");
  gone.inc();  // still alive
  std::string text = r.exposition();
  EXPECT_EQ(text.find("instance=\"a\""), std::string::npos) << text;
  EXPECT_NE(text.find("requests_total{instance=\"b\"} 2"), std::string::npos) << text;
  // The same series asked for again starts from zero.
  EXPECT_EQ(r.counter("requests_total", "Requests", {{"instance", "a"}}).value(), 0);
  handle.reset();
}

}  // namespace
}  // namespace kvf::metrics
