#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/engine_config.h"
#include "engine/timing_model.h"

namespace kvf::engine {
namespace {

void expectAnchors(const std::string& path) {
  auto profile = loadProfile(path);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const Anchors& a = profile->anchors;
  ASSERT_GT(a.prefill_tokens_per_s, 0);
  ASSERT_GT(a.tpot_s, 0);
  TimingModel model(*profile);
  double prefill = model.prefillTokensPerSecond(a.prefill_prompt_tokens, a.prefill_chunk_tokens);
  double tpot = model.decodeStepSeconds(a.tpot_batch, a.tpot_context_tokens);
  EXPECT_NEAR(prefill / a.prefill_tokens_per_s, 1.0, 0.10) << path << " prefill " << prefill;
  EXPECT_NEAR(tpot / a.tpot_s, 1.0, 0.10) << path << " tpot " << tpot;
}

// Step and transfer durations round with secondsToNanosRounded: exactly std::llround(s * 1e9),
// halves away from zero, on the edges (halves, the double just below a half, both signs, past
// 2^53) and on random durations from nanoseconds to hours.
TEST(TimingModelTest, RoundedNanosAreLlround) {
  std::vector<double> seconds = {0.0,  -0.0, 0.5e-9, 1.5e-9, 2.5e-9, -0.5e-9,   -2.5e-9,
                                 1e-9, 0.25, 3600.0, 9.1e6,  -9.1e6, 0.0375e-3, 1.23456789e-3};
  seconds.push_back(std::nextafter(0.5, 0.0) * 1e-9);
  seconds.push_back(std::ldexp(1.0, 53) * 1e-9 + 0.5e-9);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 200000; ++i) {
    double exponent = -9.0 + static_cast<double>(rng() % 13000) / 1000.0;
    double s = std::pow(10.0, exponent) * (rng() % 2 == 0 ? 1.0 : -1.0);
    seconds.push_back(s);
    // Values whose nanoseconds end in exactly .5 as doubles.
    seconds.push_back((static_cast<double>(rng() % 100000000) + 0.5) * 1e-9);
  }
  for (double s : seconds) {
    ASSERT_EQ(secondsToNanosRounded(s), std::llround(s * 1e9)) << s;
  }
}

TEST(TimingModelTest, QwenH20ReproducesSeedAnchors) {
  expectAnchors("engine/profiles/qwen3-coder-30b-a3b-h20.yaml");
  auto profile = loadProfile("engine/profiles/qwen3-coder-30b-a3b-h20.yaml");
  ASSERT_TRUE(profile.ok());
  EXPECT_EQ(profile->kv_cache_tokens, 281888);
  TimingModel model(*profile);
  // 48 layers x 4 KV heads x 128 x 2 (K,V) x 2 bytes = 96 KiB per token; 281,888 -> 25.8 GiB.
  EXPECT_DOUBLE_EQ(model.kvBytesPerToken(), 98304.0);
  EXPECT_NEAR(model.kvBytesPerToken() * 281888 / (1 << 30), 25.8, 0.05);
}

// The MoE expert term reads pow(1 - k/E, tokens) from a table below 8193 tokens: every step
// duration must be the one std::pow gives, on both sides of the table's end.
TEST(TimingModelTest, MoeStepIsExactlyThePowFormula) {
  auto profile = loadProfile("engine/profiles/qwen3-coder-30b-a3b-h20.yaml");
  ASSERT_TRUE(profile.ok());
  const ModelShape& m = profile->model;
  ASSERT_GT(m.num_experts, 0);
  ASSERT_LT(m.experts_per_token, m.num_experts);
  const GpuFigures& g = profile->gpu;
  TimingModel model(*profile);
  double share = static_cast<double>(m.experts_per_token) / m.num_experts;
  double expert = (m.total_params - m.active_params) / (1.0 - share);
  double dense = m.total_params - expert;
  auto reference = [&](const std::vector<BatchEntry>& batch) {
    double tokens = 0, attn = 0, kv = 0;
    double per_pair = 4.0 * m.num_layers * m.num_attention_heads * m.head_dim;
    for (const BatchEntry& e : batch) {
      auto n = static_cast<double>(e.new_tokens);
      auto ctx = static_cast<double>(e.context_tokens);
      tokens += n;
      attn += per_pair * (n * ctx + n * (n + 1) / 2);
      kv += model.kvBytesPerToken() * (ctx + n);
    }
    double compute = 2.0 * m.active_params * tokens / (g.peak_flops * g.matmul_efficiency) +
                     attn / (g.peak_flops * g.attention_efficiency);
    double weights = dense + expert * (1.0 - std::pow(1.0 - share, tokens));
    double memory = (weights * m.dtype_bytes + kv) / (g.hbm_bytes_per_s * g.bandwidth_efficiency);
    return g.step_overhead_s + g.per_seq_overhead_s * static_cast<double>(batch.size()) +
           std::max(compute, memory);
  };
  for (int64_t n : {1, 2, 3, 7, 64, 255, 1000, 4096, 8191, 8192, 8193, 8194, 12000}) {
    std::vector<BatchEntry> prefill{{n, 100}};
    EXPECT_EQ(model.stepSeconds(prefill), reference(prefill)) << n;
  }
  for (int batch = 1; batch <= 300; ++batch) {
    std::vector<BatchEntry> decode(static_cast<size_t>(batch), BatchEntry{1, 3000 + batch});
    EXPECT_EQ(model.stepSeconds(decode), reference(decode)) << batch;
  }
}

TEST(TimingModelTest, LlamaH100ReproducesAnchors) {
  expectAnchors("engine/profiles/llama-3.1-8b-h100.yaml");
}

TEST(TimingModelTest, CostGrowsWithContextAndBatch) {
  auto profile = loadProfile("engine/profiles/qwen3-coder-30b-a3b-h20.yaml");
  ASSERT_TRUE(profile.ok());
  TimingModel model(*profile);
  BatchEntry early{4096, 0}, late{4096, 65536};
  EXPECT_LT(model.stepSeconds({&early, 1}), model.stepSeconds({&late, 1}));
  EXPECT_LT(model.decodeStepSeconds(1, 1000), model.decodeStepSeconds(64, 1000));
  EXPECT_LT(model.decodeStepSeconds(8, 1000), model.decodeStepSeconds(8, 100000));
  EXPECT_EQ(model.stepSeconds({}), 0);
  // A cached prefix removes its prefill cost: computing 16 tokens after 8,000 cached ones is far
  // cheaper than computing all 8,016.
  BatchEntry cold{8016, 0}, warm{16, 8000};
  EXPECT_LT(model.stepSeconds({&warm, 1}) * 5, model.stepSeconds({&cold, 1}));
}

TEST(TimingModelTest, ProfileErrorsNameTheField) {
  auto p = config::parseText<Profile>(
      "name: x\nkv_cache_tokens: 10\nmodel: {num_layers: -1}\ngpu: {peak_flops: 1e12, "
      "hbm_bytes_per_s: 1e12, bogus: 1}\n",
      "<test>", parseProfile);
  ASSERT_FALSE(p.ok());
  std::string msg(p.status().message());
  EXPECT_NE(msg.find("model.num_layers"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.hidden_size"), std::string::npos) << msg;
  EXPECT_NE(msg.find("gpu.bogus"), std::string::npos) << msg;
}

TEST(TimingModelTest, TransferDurationFollowsLinkFigures) {
  auto profile = loadProfile("engine/profiles/qwen3-coder-30b-a3b-h20.yaml");
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_DOUBLE_EQ(profile->link.bandwidth_gbps, 200);
  EXPECT_DOUBLE_EQ(profile->link.overhead_us, 50);
  TimingModel model(*profile);
  // 25,000 tokens x 98,304 B = 2.4576 GB = 19.66 Gbit -> 98.304 ms at 200 Gbps, + 50 us.
  EXPECT_EQ(model.transferDuration(25000), 98'304'000 + 50'000);
  EXPECT_EQ(model.transferDuration(0), 0);
  EXPECT_EQ(model.transferDuration(1), 3'932 + 50'000);  // 786,432 bit / 200 Gbps = 3.93 us
  Profile slow = *profile;
  slow.link = {.bandwidth_gbps = 100, .overhead_us = 0};
  EXPECT_EQ(TimingModel(slow).transferDuration(25000), 2 * 98'304'000);
}

TEST(TimingModelTest, LinkDefaultsAndRangeChecks) {
  std::string base = R"(name: p
kv_cache_tokens: 1000
model: {num_layers: 2, hidden_size: 64, num_attention_heads: 2, num_kv_heads: 1, head_dim: 32,
        total_params: 1.0e7, active_params: 1.0e7, vocab_size: 100, max_model_len: 512}
gpu: {peak_flops: 1.0e12, hbm_bytes_per_s: 1.0e11}
)";
  auto p = config::parseText<Profile>(base, "p.yaml", parseProfile);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->link.bandwidth_gbps, 200);
  EXPECT_DOUBLE_EQ(p->link.overhead_us, 50);
  auto bad =
      config::parseText<Profile>(base + "link: {bandwidth_gbps: 0}\n", "p.yaml", parseProfile);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("link.bandwidth_gbps"), std::string::npos)
      << bad.status();
  auto unknown =
      config::parseText<Profile>(base + "link: {latency_us: 3}\n", "p.yaml", parseProfile);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(std::string(unknown.status().message()).find("latency_us"), std::string::npos);
}

// Onboarding, whole and layer-wise, by hand on the Qwen/H20 profile: 96 KiB per token, 48
// layers, PCIe 400 Gbps + 10 us, disk read 48 Gbps. 25,000 tokens = 19.6608 Gbit: 49.152 ms over
// PCIe (1.024 ms a layer), 409.6 ms from disk (8.5333 ms a layer).
TEST(TimingModelTest, OnboardWholeAndLayerwiseByHand) {
  auto profile = loadProfile("engine/profiles/qwen3-coder-30b-a3b-h20.yaml");
  ASSERT_TRUE(profile.ok()) << profile.status();
  TimingModel t(*profile);
  ASSERT_EQ(t.layers(), 48);
  constexpr auto kWhole = OnboardMode::kWhole;
  constexpr auto kLayerwise = OnboardMode::kLayerwise;
  EXPECT_EQ(t.onboardDuration(25000, 0), 49'152'000 + 10'000);
  EXPECT_EQ(t.onboardDuration(0, 25000), 409'600'000 + 10'000);
  // When the request may run: after everything, or after the first layer.
  EXPECT_EQ(t.onboardReadyDuration(kWhole, 25000, 0), 49'162'000);
  EXPECT_EQ(t.onboardReadyDuration(kLayerwise, 25000, 0), 10'000 + 1'024'000);
  EXPECT_EQ(t.onboardReadyDuration(kLayerwise, 0, 25000), 10'000 + 8'533'333);
  EXPECT_EQ(t.onboardReadyDuration(kLayerwise, 0, 0), 0);
  // From the onboard's start to the end of a 51.2 ms step (Ck = 1.0667 ms > Lk = 1.024 ms):
  // whole 49.162 + 51.2; layer-wise 0.01 + max(51.2, 49.152) + min(1.0667, 1.024).
  EXPECT_NEAR(t.onboardedStepSeconds(kWhole, 25000, 0, 0.0512), 0.100362, 1e-12);
  EXPECT_NEAR(t.onboardedStepSeconds(kLayerwise, 25000, 0, 0.0512), 0.052234, 1e-12);
  // A 24 ms step (Ck = 0.5 ms < Lk): the load sets the pace, plus the last layer's compute.
  EXPECT_NEAR(t.onboardedStepSeconds(kLayerwise, 25000, 0, 0.024), 0.01e-3 + 0.049152 + 0.0005,
              1e-12);
  // From disk: 0.01 + 409.6 + 51.2 / 48.
  EXPECT_NEAR(t.onboardedStepSeconds(kLayerwise, 0, 25000, 0.0512), 0.4106766667, 1e-9);
  EXPECT_NEAR(t.onboardedStepSeconds(kWhole, 0, 25000, 0.0512), 0.46081, 1e-12);
  // Nothing to onboard: the step alone in both modes.
  EXPECT_DOUBLE_EQ(t.onboardedStepSeconds(kLayerwise, 0, 0, 0.0512), 0.0512);
  EXPECT_DOUBLE_EQ(t.onboardedStepSeconds(kWhole, 0, 0, 0.0512), 0.0512);
}

// The step a layer-wise load meets: 48 ms of compute (1 ms a layer) from t = 0.
TEST(TimingModelTest, LayeredStepEndsAfterTheLastLayerByHand) {
  auto profile = loadProfile("engine/profiles/qwen3-coder-30b-a3b-h20.yaml");
  ASSERT_TRUE(profile.ok()) << profile.status();
  TimingModel t(*profile);
  const Nanos c = 48'000'000;
  EXPECT_EQ(t.layeredStepDuration(c, 0, -1), c);                   // KV already there
  EXPECT_EQ(t.layeredStepDuration(c, 5'000'000, 0), c);            // complete before the step
  EXPECT_EQ(t.layeredStepDuration(c, 0, 10'000'000), c);           // hidden under the compute
  EXPECT_EQ(t.layeredStepDuration(c, 0, 47'000'000), c);           // just hidden: 47 + 1 = 48
  EXPECT_EQ(t.layeredStepDuration(c, 0, 60'000'000), 61'000'000);  // the load sets the pace
  EXPECT_EQ(t.layeredStepDuration(c, 2'000'000, 60'000'000), 59'000'000);
}

// The closed forms against the layer pipeline itself: layer l's KV is in at its arrival, its
// compute starts when both that layer and the previous one's compute are done.
TEST(TimingModelTest, LayerwiseFormulaIsTheLayerPipeline) {
  auto profile = loadProfile("engine/profiles/llama-3.1-8b-h100.yaml");
  ASSERT_TRUE(profile.ok()) << profile.status();
  TimingModel t(*profile);
  const int layers = t.layers();
  ASSERT_EQ(layers, 32);
  const double overhead = profile->pcie.overhead_us * 1e-6;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    int64_t host = static_cast<int64_t>(rng() % 200000);
    int64_t disk = i % 3 == 0 ? static_cast<int64_t>(rng() % 20000) : 0;
    double compute = 1e-4 * static_cast<double>(1 + rng() % 20000);
    double load = t.onboardSeconds(host, disk) - (host + disk > 0 ? overhead : 0);
    double lk = load / layers, ck = compute / layers;
    double start = host + disk > 0 ? overhead + lk : 0;  // the step starts at the first layer
    double end = start;
    for (int l = 1; l <= layers; ++l) {
      double arrival = host + disk > 0 ? overhead + l * lk : 0;
      end = std::max(end, arrival) + ck;
    }
    EXPECT_NEAR(t.onboardedStepSeconds(OnboardMode::kLayerwise, host, disk, compute), end, 1e-12)
        << host << " " << disk << " " << compute;
    // The scheduler's form (absolute times, whole nanoseconds) agrees to the rounding.
    Nanos ready = secondsToNanosRounded(start);
    Nanos kv_ready = t.onboardDuration(host, disk);
    Nanos step = t.layeredStepDuration(secondsToNanosRounded(compute), ready, kv_ready);
    EXPECT_NEAR(static_cast<double>(ready + step) * 1e-9, end, 3e-9);
    EXPECT_LE(end, t.onboardedStepSeconds(OnboardMode::kWhole, host, disk, compute) + 1e-12);
  }
}

}  // namespace
}  // namespace kvf::engine
