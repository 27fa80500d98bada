#include "trace/synth.h"

#include <map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "trace/stats.h"

namespace kvf::trace {
namespace {

using ::testing::HasSubstr;

TraceStats statsOf(const SynthConfig& config, std::vector<Request>* keep = nullptr) {
  auto acc = StatsAccumulator::create({});
  EXPECT_TRUE(acc.ok());
  Nanos last = 0;
  auto status = synthesize(config, [&](const Request& r) {
    EXPECT_GE(r.arrival, last);  // emitted in arrival order
    last = r.arrival;
    EXPECT_TRUE(blockCountConsistent(r));
    acc->add(r);
    if (keep != nullptr) keep->push_back(r);
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
  return acc->finish();
}

void expectWithin10(double got, double want, const char* what) {
  EXPECT_NEAR(got, want, 0.1 * want) << what;
}

// The default config must reproduce seed 003 §2.3 within 10%, as kvf-trace stats measures it.
TEST(Synth, DefaultConfigReproducesTheSeedStatistics) {
  TraceStats s = statsOf(SynthConfig{});
  EXPECT_EQ(s.requests, 50000);
  expectWithin10(s.input.mean, 33600, "input mean");
  expectWithin10(static_cast<double>(s.input.p50), 20000, "input p50");
  expectWithin10(static_cast<double>(s.input.p90), 88000, "input p90");
  expectWithin10(s.output.mean, 445, "output mean");
  expectWithin10(static_cast<double>(s.output.p50), 80, "output p50");
  expectWithin10(s.multi_turn_share, 0.70, "multi-turn share");
  expectWithin10(s.turns_per_session, 4.9, "turns per session");
  expectWithin10(s.intra_session_reuse, 0.62, "intra-session reuse");
  expectWithin10(s.cross_session_reuse, 0.38, "cross-session reuse");
  expectWithin10(s.hit_all.token, 0.67, "theoretical hit ratio");
}

TEST(Synth, DeterministicForASeed) {
  SynthConfig c;
  c.requests = 2000;
  std::vector<Request> a, b, d;
  statsOf(c, &a);
  statsOf(c, &b);
  c.seed = 2;
  statsOf(c, &d);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].arrival, b[i].arrival);
    ASSERT_EQ(a[i].hash_ids, b[i].hash_ids);
    ASSERT_EQ(a[i].session_id, b[i].session_id);
  }
  EXPECT_NE(a[10].hash_ids, d[10].hash_ids);
}

TEST(Synth, SessionsGrowTheirPrefixAndChainTurns) {
  SynthConfig c;
  c.requests = 3000;
  c.prefix_break_prob = 0;
  std::vector<Request> all;
  statsOf(c, &all);
  std::map<std::string, const Request*> last;
  int checked = 0;
  for (const auto& r : all) {
    auto it = last.find(r.session_id);
    if (it != last.end()) {
      const Request& prev = *it->second;
      EXPECT_EQ(r.turn, prev.turn + 1);
      EXPECT_EQ(r.parent_id, prev.id);
      EXPECT_GE(r.think_time, 0);
      if (r.input_length <= c.max_context_tokens && r.input_length > prev.input_length) {
        // Without prefix breaks the previous turn's full blocks are a prefix of this one.
        size_t full = static_cast<size_t>(prev.input_length / c.block_size);
        ASSERT_GE(r.hash_ids.size(), full);
        EXPECT_TRUE(std::equal(prev.hash_ids.begin(),
                               prev.hash_ids.begin() + static_cast<long>(full),
                               r.hash_ids.begin()));
        ++checked;
      }
    } else {
      EXPECT_EQ(r.turn, 1);
    }
    last[r.session_id] = &r;
  }
  EXPECT_GT(checked, 1000);
}

TEST(Synth, BurstyArrivalsKeepTheMeanRateAndRaiseThePeak) {
  SynthConfig c;
  c.requests = 20000;
  c.sessions_per_s = 2;
  TraceStats poisson = statsOf(c);
  c.arrivals = SynthConfig::Arrivals::kBursty;
  TraceStats bursty = statsOf(c);
  EXPECT_NEAR(bursty.mean_qps, poisson.mean_qps, 0.25 * poisson.mean_qps);
  EXPECT_GT(bursty.peak_qps, 1.5 * poisson.peak_qps);
}

TEST(Synth, ConfigParsingValidates) {
  auto ok = parseSynthConfig(R"(
seed: 7
requests: 10
block_size: 64
arrivals: {process: bursty, sessions_per_s: 3, burst_factor: 4, burst_on_s: 5, burst_off_s: 20}
sessions: {single_turn_share: 0.5, multi_turn_mean_turns: 3, multi_turn_sigma: 0}
system_prompts: {count: 4, zipf: 1.2, tokens: {median: 100, sigma: 0.1, min: 10, max: 200}}
output_tokens: {median: 5, sigma: 0}
response: {base_s: 0.5, per_token_s: 0.01}
prefix_break_prob: 0
)",
                             "test.yaml");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->seed, 7u);
  EXPECT_EQ(ok->block_size, 64);
  EXPECT_EQ(ok->arrivals, SynthConfig::Arrivals::kBursty);
  EXPECT_EQ(ok->system_prompts, 4);
  EXPECT_EQ(ok->output_tokens.median, 5);
  EXPECT_EQ(ok->turn_tokens.median, SynthConfig{}.turn_tokens.median);  // default kept
  std::vector<Request> all;
  statsOf(*ok, &all);
  EXPECT_EQ(all.size(), 10u);
  EXPECT_EQ(all[0].output_length, 5);

  auto bad = parseSynthConfig(
      "requests: 0\nsessions: {single_turn_share: 2}\ncolour: red\n"
      "output_tokens: {median: 5, min: 9, max: 3}\n",
      "bad.yaml");
  ASSERT_FALSE(bad.ok());
  std::string msg(bad.status().message());
  EXPECT_THAT(msg, HasSubstr("requests"));
  EXPECT_THAT(msg, HasSubstr("sessions.single_turn_share"));
  EXPECT_THAT(msg, HasSubstr("colour"));
  EXPECT_THAT(msg, HasSubstr("output_tokens.min"));
}

}  // namespace
}  // namespace kvf::trace
