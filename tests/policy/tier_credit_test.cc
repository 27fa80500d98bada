// Lower-tier credit (policy/tier_credit.h): the modelled worth of a host-memory or disk run
// against recomputing it, fixed weights as llm-d and Dynamo set them, the config's errors, the
// per-tier holdings' leading run, and policies choosing by the credit (a long CPU run over a
// short GPU hit, a push served from a holder's host memory).
#include <gtest/gtest.h>

#include <cmath>

#include "policy/policy.h"
#include "policy/registry.h"
#include "policy/tier_credit.h"
#include "policy/tier_holdings.h"
#include "policy/unified.h"
#include "tests/policy/parse_policy.h"

namespace kvf::policy {
namespace {

RouteRequest request(int64_t prompt) {
  RouteRequest r;
  r.prompt_tokens = prompt;
  return r;
}

TEST(TierCreditTest, ModelledCpuIsWorthLessThanGpuAndMoreThanNothing) {
  const TierCreditConfig c;  // modelled, H20 defaults
  const double cpu = tiers::creditedTokens(25000, 0, c);
  EXPECT_GT(cpu, 0.0);
  EXPECT_LT(cpu, 25000.0);
  // (1 - onboard_s / recompute_s) of a GPU block each.
  const double onboard = tiers::onboardSeconds(25000, 0, c);
  EXPECT_NEAR(onboard, 25000.0 * 98304 * 8 / 400e9 + 0.005, 1e-12);
  EXPECT_NEAR(cpu, 25000 * (1 - onboard / (25000 / 7000.0)), 1e-6);
}

TEST(TierCreditTest, DiskIsWorthLessThanCpu) {
  const TierCreditConfig c;
  EXPECT_LT(tiers::creditedTokens(0, 8000, c), tiers::creditedTokens(8000, 0, c));
  EXPECT_GT(tiers::onboardSeconds(0, 8000, c), tiers::onboardSeconds(8000, 0, c));
}

TEST(TierCreditTest, HugeDiskPrefixBeatsRecomputeTinyOneDoesNot) {
  const TierCreditConfig c;
  const int64_t huge = 100000;
  EXPECT_LT(tiers::onboardSeconds(0, huge, c), huge / c.prefill_tokens_per_s);
  EXPECT_GT(tiers::creditedTokens(0, huge, c), 0.5 * huge);
  const int64_t tiny = 16;  // one block: the onboard's fixed cost is more than its prefill
  EXPECT_GT(tiers::onboardSeconds(0, tiny, c), tiny / c.prefill_tokens_per_s);
  EXPECT_EQ(tiers::creditedTokens(0, tiny, c), 0.0);
  EXPECT_EQ(tiers::creditedTokens(tiny, 0, c), 0.0);
}

TEST(TierCreditTest, FixedModeMatchesLlmDAndDynamoWeights) {
  PolicyConfig llmd = parsePolicy("tier_scoring: fixed\ntier_weights: {CPU: 0.8}");
  EXPECT_DOUBLE_EQ(tiers::creditedTokens(1000, 0, llmd.tiers), 800.0);
  PolicyConfig dynamo = parsePolicy("tier_scoring: fixed\ntier_weights: {CPU: 0.75, DISK: 0.25}");
  EXPECT_DOUBLE_EQ(tiers::creditedTokens(1000, 1000, dynamo.tiers), 1000.0);
  EXPECT_DOUBLE_EQ(tiers::creditedTokens(16, 0, dynamo.tiers), 12.0);  // no size threshold
  PolicyConfig off = parsePolicy("tier_scoring: off");
  EXPECT_EQ(tiers::creditedTokens(1000, 1000, off.tiers), 0.0);
  EXPECT_EQ(configFor("hybrid").tiers.scoring, TierScoring::kModelled);  // the default
}

// Engines that load layer by layer hide the transfer under the first step's compute of the
// request's new tokens: the router waits for what is left, by the engine's pipeline formula.
TEST(TierCreditTest, LayerwiseEnginesHideTheLoadUnderTheNewTokensCompute) {
  TierCreditConfig whole;
  TierCreditConfig layered = parsePolicy("tier_model: {onboard: layerwise, layers: 48}").tiers;
  ASSERT_EQ(layered.onboard, TierOnboard::kLayerwise);
  const int64_t cpu = 25000;
  const double load = tiers::onboardSeconds(cpu, 0, whole) - whole.onboard_overhead_s;
  // Few new tokens: the step is shorter than the load, which mostly shows.
  const int64_t few = 16;
  const double c_few = few / 7000.0;
  EXPECT_NEAR(tiers::exposedOnboardSeconds(cpu, 0, few, layered),
              0.005 + (load - c_few) + c_few / 48, 1e-12);
  // Many new tokens: a step longer than the load hides all of it but one layer's share.
  const int64_t many = 20000;
  EXPECT_NEAR(tiers::exposedOnboardSeconds(cpu, 0, many, layered), 0.005 + load / 48, 1e-12);
  EXPECT_DOUBLE_EQ(tiers::exposedOnboardSeconds(cpu, 0, many, whole),
                   tiers::onboardSeconds(cpu, 0, whole));
  // So the same run is worth more with layer-wise engines, and more the more is computed.
  EXPECT_GT(tiers::creditedTokens(cpu, 0, layered, many), tiers::creditedTokens(cpu, 0, whole));
  EXPECT_GT(tiers::creditedTokens(cpu, 0, layered, many),
            tiers::creditedTokens(cpu, 0, layered, few));
  EXPECT_DOUBLE_EQ(tiers::creditedTokens(cpu, 0, whole, many),
                   tiers::creditedTokens(cpu, 0, whole));
  EXPECT_LE(tiers::creditedTokens(cpu, 0, layered, many), static_cast<double>(cpu));
  auto bad = tryParsePolicy("tier_model: {onboard: chunked}");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tier_model.onboard"), std::string::npos) << bad.status();
}

TEST(TierCreditTest, ConfigErrorsNameTheField) {
  auto bad = tryParsePolicy("tier_scoring: weighted");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tier_scoring"), std::string::npos) << bad.status();
  bad = tryParsePolicy("tier_weights: {GPU: 1}");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tier_weights.GPU"), std::string::npos) << bad.status();
  bad = tryParsePolicy("tier_weights: {CPU: 1.5}");
  ASSERT_FALSE(bad.ok());
  bad = tryParsePolicy("tier_model: {pcie_gbps: 0}");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tier_model.pcie_gbps"), std::string::npos) << bad.status();
  auto good = tryParsePolicy("tier_model: {pcie_gbps: 200, disk_read_gbps: 24}");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->tiers.pcie_gbps, 200);
  EXPECT_EQ(good->tiers.disk_read_gbps, 24);
}

TEST(TierHoldingsTest, RunContinuesThroughCpuThenDiskUntilAGap) {
  TierHoldings t;
  std::vector<BlockHash> chain = {{11}, {12}, {13}, {14}, {15}, {16}};
  // Engine hashes 101.. map to our 11..; 103 only on disk; 106 unresolved (never credited).
  std::vector<uint64_t> cpu_engine = {101, 102, 104};
  std::vector<BlockHash> cpu_ours = {{11}, {12}, {14}};
  ASSERT_TRUE(t.store("CPU", cpu_engine, cpu_ours, 0));
  std::vector<uint64_t> disk_engine = {102, 103, 105, 106};
  std::vector<BlockHash> disk_ours = {{12}, {13}, {15}, {0}};
  ASSERT_TRUE(t.store("DISK", disk_engine, disk_ours, 0));
  EXPECT_TRUE(t.creditable());
  EXPECT_EQ(t.unresolved(), 1u);
  LowerTierRun run = t.run(chain, 0);
  EXPECT_EQ(run.cpu_blocks, 3u);   // 11, 12, 14
  EXPECT_EQ(run.disk_blocks, 2u);  // 13, 15; 16 is unknown
  run = t.run(chain, 2);           // past a GPU match of two blocks
  EXPECT_EQ(run.cpu_blocks, 1u);
  EXPECT_EQ(run.disk_blocks, 2u);
  EXPECT_EQ(t.ourHash(104), BlockHash{14});
  std::vector<uint64_t> gone = {103};
  EXPECT_EQ(t.remove("DISK", gone), 0u);
  run = t.run(chain, 0);
  EXPECT_EQ(run.cpu_blocks + run.disk_blocks, 2u);  // the disk block 13 left: a gap
  // Another medium is shown, not credited.
  TierHoldings storage;
  std::vector<uint64_t> one = {101};
  std::vector<BlockHash> one_ours = {{11}};
  ASSERT_TRUE(storage.store("STORAGE", one, one_ours, 0));
  EXPECT_FALSE(storage.creditable());
  EXPECT_EQ(storage.run(chain, 0).cpu_blocks, 0u);
  EXPECT_EQ(storage.blocks("STORAGE"), 1u);
  // The credited media are matched without case ("Disk", "cpu").
  TierHoldings mixed;
  std::vector<uint64_t> first = {101, 102};
  std::vector<BlockHash> first_ours = {{11}, {12}};
  ASSERT_TRUE(mixed.store("cpu", first, first_ours, 0));
  std::vector<uint64_t> third = {103};
  std::vector<BlockHash> third_ours = {{13}};
  ASSERT_TRUE(mixed.store("Disk", third, third_ours, 0));
  EXPECT_TRUE(mixed.creditable());
  run = mixed.run(chain, 0);
  EXPECT_EQ(run.cpu_blocks, 2u);
  EXPECT_EQ(run.disk_blocks, 1u);
}

// Two idle instances: 0 holds a short GPU prefix, 1 a long run in host memory.
std::vector<InstanceSnapshot> shortGpuLongCpu(int64_t gpu, int64_t cpu) {
  std::vector<InstanceSnapshot> inst(2);
  inst[0].matched_tokens = gpu;
  inst[1].cpu_tokens = cpu;
  return inst;
}

TEST(TierPolicyTest, HybridTakesALongCpuRunOverAShortGpuHitWhenTheModelSaysSo) {
  auto inst = shortGpuLongCpu(4000, 16000);
  auto modelled = createPolicy(configFor("hybrid"));
  Decision d = modelled->decide(request(20000), inst, 0);
  EXPECT_EQ(d.instance, 1);
  EXPECT_EQ(d.reason, "cache_gate");
  auto off = createPolicy(parsePolicy("kind: hybrid\ntier_scoring: off"));
  EXPECT_EQ(off->decide(request(20000), inst, 0).instance, 0);
  // A CPU run barely longer than the GPU hit is worth less than it once onboarding is paid.
  auto close = shortGpuLongCpu(4000, 4016);
  EXPECT_EQ(createPolicy(configFor("lmetric"))->decide(request(20000), close, 0).instance, 0);
}

TEST(TierPolicyTest, UnifiedPricesOnboardSecondsInsteadOfPrefill) {
  auto inst = shortGpuLongCpu(4000, 16000);
  PolicyConfig config = configFor("unified");
  auto p = createPolicy(config);
  Decision d = p->decide(request(20000), inst, 0);
  ASSERT_EQ(d.instance, 1);
  const UnifiedParams& m = config.params<UnifiedParams>("unified");
  // 16000 tokens cost their onboard seconds, the other 4000 their prefill.
  const double expected =
      tiers::onboardSeconds(16000, 0, config.tiers) + 4000 / m.prefill_tokens_per_s;
  EXPECT_NEAR(d.predicted.chosen, expected, 1e-9);
  auto close = shortGpuLongCpu(4000, 4016);
  EXPECT_EQ(createPolicy(config)->decide(request(20000), close, 0).instance, 0);
}

TEST(TierPolicyTest, UnifiedPushesFromAHolderThatHasThePrefixOnlyInCpu) {
  std::vector<InstanceSnapshot> inst(2);
  for (auto& s : inst) s.push_capable = true;
  inst[1].cpu_tokens = 16000;
  inst[1].pending_prefill_tokens = 100000;  // the holder is busy: move its KV instead
  PolicyConfig config = configFor("unified");
  auto p = createPolicy(config);
  Decision d = p->decide(request(20000), inst, 0);
  EXPECT_EQ(d.instance, 0);
  EXPECT_EQ(d.mode, Mode::kPushMigrate);
  EXPECT_EQ(d.source_instance, 1);
  EXPECT_EQ(d.predicted_cached_tokens, 16000);
  const UnifiedParams& m = config.params<UnifiedParams>("unified");
  // The move reads the run out of host memory before sending it.
  EXPECT_NEAR(
      d.move_model_s,
      unified::moveSeconds(16000, inst[1], m) + tiers::onboardSeconds(16000, 0, config.tiers),
      1e-9);
  auto off = createPolicy(parsePolicy("kind: unified\ntier_scoring: off"));
  Decision cold = off->decide(request(20000), inst, 0);
  EXPECT_EQ(cold.mode, Mode::kLocal);
  EXPECT_EQ(cold.reason, "cold");
}

}  // namespace
}  // namespace kvf::policy
