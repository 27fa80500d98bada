// Onboarding from the lower tiers, whole and layer-wise (scheduler.onboard), through the engine
// core: the first token of a prefix served from host memory, with the live store (real bytes)
// and with the simulator's block accounting alike, against the timing model's closed forms; and
// a step that batches an onboarding request with a running decode.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/engine_core.h"
#include "engine/virtual_run.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/tier_test_util.h"
#include "worker/tiers/tier_config.h"

namespace kvf::engine {
namespace {

using testing::makeConfig;
using testing::promptOf;
using testing::spec;

constexpr int kBlock = 16;
constexpr int kPrefixBlocks = 256;  // 4,096 tokens
constexpr int kPrefix = kPrefixBlocks * kBlock;
constexpr int kSuffix = 16;
constexpr int64_t kPoolBlocks = 300;

EngineConfig onboardConfig(OnboardMode mode) {
  EngineConfig c = makeConfig(kBlock, kPoolBlocks, 8192);
  c.cache.payload_bytes_per_block = 256;
  c.scheduler.onboard = mode;
  auto tiers = worker::parseTierConfigText("host: {capacity_mib: 4, pin: off}\n", "tiers");
  EXPECT_TRUE(tiers.ok()) << tiers.status();
  if (tiers.ok()) c.tiers = *tiers;
  EXPECT_TRUE(finalizeEngineConfig(&c).ok());
  return c;
}

std::unique_ptr<EngineCore> makeCore(const EngineConfig& c, bool live) {
  return live ? testing::liveCore(c, nullptr) : testing::accountedCore(c);
}

std::vector<TokenId> prefixed(int salt) {
  std::vector<TokenId> p = promptOf(kPrefix, 1);
  std::vector<TokenId> tail = promptOf(kSuffix, salt);
  p.insert(p.end(), tail.begin(), tail.end());
  return p;
}

// Serves the prefix, evicts it to host memory with a filler that takes the whole pool (unless
// `g1`), then serves prefix + 16 new tokens alone, 1 s later: its outcome.
VirtualOutcome measured(EngineCore& core, bool g1) {
  Nanos now = 0;
  EXPECT_TRUE(runToCompletion(core, spec("warm", promptOf(kPrefix, 1), 1), &now).finished);
  if (!g1) {
    auto filler = spec("filler", promptOf(kPoolBlocks * kBlock - 1, 9), 1);
    EXPECT_TRUE(runToCompletion(core, std::move(filler), &now).finished);
  }
  now += kNanosPerSecond;
  VirtualOutcome out = runToCompletion(core, spec("measured", prefixed(7), 1), &now);
  EXPECT_TRUE(out.finished);
  return out;
}

TEST(LayerwiseOnboardTest, HostHitTtftIsBelowWholeAndAtLeastAPoolHit) {
  for (bool live : {false, true}) {
    SCOPED_TRACE(live ? "live tiers" : "accounted tiers");
    auto whole_core = makeCore(onboardConfig(OnboardMode::kWhole), live);
    auto layer_core = makeCore(onboardConfig(OnboardMode::kLayerwise), live);
    auto g1_core = makeCore(onboardConfig(OnboardMode::kLayerwise), live);
    auto g1_whole_core = makeCore(onboardConfig(OnboardMode::kWhole), live);
    ASSERT_TRUE(whole_core && layer_core && g1_core && g1_whole_core);
    VirtualOutcome whole = measured(*whole_core, false);
    VirtualOutcome layer = measured(*layer_core, false);
    VirtualOutcome g1 = measured(*g1_core, true);
    VirtualOutcome g1_whole = measured(*g1_whole_core, true);
    for (const VirtualOutcome* o : {&whole, &layer}) {
      EXPECT_EQ(o->cached_tokens, kPrefix);
      EXPECT_EQ(o->tier_tokens, kPrefix);  // all of it from host memory
    }
    EXPECT_EQ(g1.cached_tokens, kPrefix);
    EXPECT_EQ(g1.tier_tokens, 0);
    EXPECT_EQ(layer_core->onboardPayloadMismatches(), 0u);

    // A request that onboards nothing is timed alike in both modes: its step alone.
    EXPECT_EQ(g1.ttft, g1_whole.ttft);
    const TimingModel& t = layer_core->timing();
    BatchEntry e{kSuffix, kPrefix};
    const Nanos compute = t.stepDuration({&e, 1});
    EXPECT_EQ(g1.ttft, compute);
    // Whole: the onboard, then the step. Layer-wise: the pipeline's closed form.
    EXPECT_EQ(whole.ttft, t.onboardDuration(kPrefix, 0) + compute);
    double pipeline = t.onboardedStepSeconds(OnboardMode::kLayerwise, kPrefix, 0,
                                             static_cast<double>(compute) * 1e-9);
    EXPECT_NEAR(static_cast<double>(layer.ttft) * 1e-9, pipeline, 3e-9);
    EXPECT_LT(layer.ttft, whole.ttft);
    EXPECT_GE(layer.ttft, g1.ttft);
  }
}

// One step's outputs and duration, stepping at `*now` and moving it to the step's end.
StepResult stepAt(EngineCore& core, Nanos* now) {
  StepResult r = core.step(*now);
  *now += r.duration;
  return r;
}

const RequestOutput* outputOf(const StepResult& r, const std::string& id) {
  for (const RequestOutput& o : r.outputs) {
    if (o.id == id) return &o;
  }
  return nullptr;
}

// A decode runs while a prefix onboards over slow PCIe (20 Gbps: 161 ms for 4,096 tokens, over
// three decode steps). Whole: the request joins a step once its onboard is over, and that step
// is charged its compute alone. Layer-wise: it joins the next step, whose whole batch (decode
// included) waits for the last layer's KV: max(C, kv_ready + C / layers - start).
TEST(LayerwiseOnboardTest, ABatchWithAnOnboardingRequestWaitsOnlyForItsLoad) {
  for (OnboardMode mode : {OnboardMode::kWhole, OnboardMode::kLayerwise}) {
    SCOPED_TRACE(mode == OnboardMode::kWhole ? "whole" : "layerwise");
    EngineConfig c = onboardConfig(mode);
    c.profile.pcie.bandwidth_gbps = 20;
    auto core = makeCore(c, false);
    ASSERT_NE(core, nullptr);
    Nanos now = 0;
    ASSERT_TRUE(runToCompletion(*core, spec("warm", promptOf(kPrefix, 1), 1), &now).finished);
    auto filler = spec("filler", promptOf(kPoolBlocks * kBlock - 1, 9), 1);
    ASSERT_TRUE(runToCompletion(*core, std::move(filler), &now).finished);
    const TimingModel& t = core->timing();
    const int64_t decode_prompt = 100;
    ASSERT_TRUE(core->add(spec("decode", promptOf(decode_prompt, 5), 200), now).ok());
    const RequestOutput* d = outputOf(stepAt(*core, &now), "decode");  // its prefill
    ASSERT_NE(d, nullptr);
    int64_t decoded = d->output_tokens;

    const Nanos arrival = now;
    ASSERT_TRUE(core->add(spec("onboard", prefixed(7), 1), now).ok());
    StepResult first = stepAt(*core, &now);
    ASSERT_EQ(first.tier_onboards.size(), 1u);
    BatchEntry alone{1, decode_prompt + decoded - 1};
    EXPECT_EQ(first.duration, t.stepDuration({&alone, 1}));  // unaffected by the onboard start
    decoded = outputOf(first, "decode")->output_tokens;
    const Nanos kv_ready = arrival + t.onboardDuration(kPrefix, 0);
    bool joined = false;
    for (int i = 0; i < 20 && !joined; ++i) {
      const Nanos start = now;
      const int64_t decode_context = decode_prompt + decoded - 1;
      StepResult r = stepAt(*core, &now);
      const RequestOutput* o = outputOf(r, "onboard");
      decoded = outputOf(r, "decode")->output_tokens;
      if (o == nullptr) {  // the decode alone, at its own cost, until the onboard is ready
        BatchEntry e{1, decode_context};
        EXPECT_EQ(r.duration, t.stepDuration({&e, 1}));
        EXPECT_LT(start, arrival + t.onboardReadyDuration(mode, kPrefix, 0));
        continue;
      }
      std::vector<BatchEntry> batch = {{1, decode_context}, {kSuffix, kPrefix}};
      const Nanos compute = t.stepDuration(batch);
      if (mode == OnboardMode::kWhole) {
        EXPECT_GE(start, kv_ready);
        EXPECT_EQ(r.duration, compute);
      } else {
        EXPECT_LT(start, kv_ready);  // it joined before the load was over ...
        EXPECT_EQ(r.duration, std::max(compute, kv_ready + compute / t.layers() - start));
        EXPECT_GT(r.duration, compute);  // ... and this batch waited for its last layer
      }
      EXPECT_EQ(o->first_token_time, now);
      EXPECT_EQ(o->tier_tokens, kPrefix);
      joined = true;
    }
    EXPECT_TRUE(joined);
  }
}

}  // namespace
}  // namespace kvf::engine
