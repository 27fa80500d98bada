// The KV-moving policies with hand-checked costs (defaults: 7000 prefill tok/s, 98304 KV
// bytes/token, 200 Gbps, 50 us per transfer): unified's argmin over local / push / cold with
// soft session affinity and its refusal to migrate a cold prefix; elastic's HEAVY offload
// with round robin, overload skip, cost guard and the concurrency cap released by the driver.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "common/config.h"
#include "policy/policy.h"
#include "policy/registry.h"
#include "policy/unified.h"
#include "tests/policy/parse_policy.h"

namespace kvf::policy {
namespace {

using unified::transferSeconds;

RouteRequest request(int64_t prompt, std::string_view session = {}) {
  RouteRequest r;
  r.prompt_tokens = prompt;
  r.session = session;
  return r;
}

std::vector<InstanceSnapshot> pushCapable(int n) {
  std::vector<InstanceSnapshot> inst(n);
  for (auto& s : inst) s.push_capable = true;
  return inst;
}

TEST(TransferSecondsTest, BytesOverLinkPlusOverhead) {
  UnifiedParams m;
  // 25000 tokens x 98304 B = 2.4576 GB; x 8 / 200e9 = 0.098304 s; + 50 us.
  EXPECT_NEAR(transferSeconds(25000, m), 0.098354, 1e-9);
  EXPECT_NEAR(transferSeconds(0, m), 50e-6, 1e-12);
}

// C (0) holds 25k of a 28k prompt behind a 10 s queue; D (1) is idle and cold; E (2) has 1 s
// of queue. Local on C: 10 + 3000/7000 = 10.428571; cold on D: 28000/7000 = 4; push C->D:
// 0 + 0.098354 + 3000/7000 = 0.526925; push C->E: 1.526925.
std::vector<InstanceSnapshot> busyHolder() {
  auto inst = pushCapable(3);
  inst[0].matched_tokens = 25000;
  inst[0].pending_prefill_tokens = 70000;
  inst[2].pending_prefill_tokens = 7000;
  return inst;
}

TEST(UnifiedTest, PushesFromBusyHolderToIdlePeer) {
  auto p = createPolicy(configFor("unified"));
  auto d = p->decide(request(28000), busyHolder(), 0);
  EXPECT_EQ(d.instance, 1);
  EXPECT_EQ(d.mode, Mode::kPushMigrate);
  EXPECT_EQ(d.source_instance, 0);
  EXPECT_EQ(d.prefill_instance, -1);
  EXPECT_EQ(d.reason, "push_migrate");
  EXPECT_EQ(d.predicted_cached_tokens, 25000);
  EXPECT_EQ(d.request_class, RequestClass::kWarm);  // 3000 new tokens on D
  EXPECT_NEAR(d.predicted.local, 10.428571, 1e-6);
  EXPECT_NEAR(d.predicted.cold, 4.0, 1e-9);
  EXPECT_NEAR(d.predicted.push, 0.526925, 1e-6);
  EXPECT_NEAR(d.predicted.chosen, 0.526925, 1e-6);
  EXPECT_TRUE(std::isnan(d.predicted.offload));
  EXPECT_NEAR(d.scores[0], 10.428571, 1e-6);
  EXPECT_NEAR(d.scores[1], 0.526925, 1e-6);
  EXPECT_NEAR(d.scores[2], 1.526925, 1e-6);
}

TEST(UnifiedTest, StaysLocalWhenTheHolderIsCheapest) {
  auto p = createPolicy(configFor("unified"));
  auto inst = busyHolder();
  inst[0].pending_prefill_tokens = 0;  // local on C: 3000/7000 = 0.428571 < push 0.526925
  auto d = p->decide(request(28000), inst, 0);
  EXPECT_EQ(d.instance, 0);
  EXPECT_EQ(d.mode, Mode::kLocal);
  EXPECT_EQ(d.source_instance, -1);
  EXPECT_EQ(d.reason, "local_cached");
  EXPECT_NEAR(d.predicted.chosen, 3000.0 / 7000, 1e-9);
}

TEST(UnifiedTest, SoftSessionAffinityWithinTwiceTheBest) {
  auto p = createPolicy(configFor("unified"));
  auto inst = busyHolder();
  inst[0].pending_prefill_tokens = 0;
  ASSERT_EQ(p->decide(request(28000, "s"), inst, 0).instance, 0);  // the session lives on C
  // C gets 0.5 s of queue: 0.928571 <= 2 x 0.526925 (push to D): the session stays.
  inst[0].pending_prefill_tokens = 3500;
  auto d = p->decide(request(28000, "s"), inst, 1);
  EXPECT_EQ(d.instance, 0);
  EXPECT_EQ(d.mode, Mode::kLocal);
  EXPECT_EQ(d.reason, "session_affinity");
  EXPECT_NEAR(d.predicted.chosen, 0.928571, 1e-6);
  // Without a session the same load pushes to D.
  EXPECT_EQ(p->decide(request(28000), inst, 1).mode, Mode::kPushMigrate);
  // 1 s of queue: 1.428571 > 1.053850: the session migrates.
  inst[0].pending_prefill_tokens = 7000;
  d = p->decide(request(28000, "s"), inst, 2);
  EXPECT_EQ(d.instance, 1);
  EXPECT_EQ(d.mode, Mode::kPushMigrate);
  // ... and then sticks to D, which now holds its prefix.
  inst[1].matched_tokens = 28000;
  d = p->decide(request(29000, "s"), inst, 3);
  EXPECT_EQ(d.instance, 1);
  EXPECT_EQ(d.mode, Mode::kLocal);
}

TEST(UnifiedTest, NeverMigratesAColdOrTinyPrefix) {
  auto p = createPolicy(configFor("unified"));
  auto inst = pushCapable(2);
  inst[0].pending_prefill_tokens = 70000;
  auto d = p->decide(request(28000), inst, 0);
  EXPECT_EQ(d.instance, 1);
  EXPECT_EQ(d.mode, Mode::kLocal);
  EXPECT_EQ(d.reason, "cold");
  EXPECT_TRUE(std::isnan(d.predicted.push));
  EXPECT_TRUE(std::isnan(d.predicted.local));
  EXPECT_NEAR(d.predicted.cold, 4.0, 1e-9);
  inst[0].matched_tokens = 255;  // below min_push_tokens (256)
  d = p->decide(request(28000), inst, 0);
  EXPECT_EQ(d.mode, Mode::kLocal);
  EXPECT_TRUE(std::isnan(d.predicted.push));
}

TEST(UnifiedTest, PushNeedsWorkersOnBothEndsAndAReachableHolder) {
  auto p = createPolicy(configFor("unified"));
  auto inst = busyHolder();
  inst[0].push_capable = false;
  EXPECT_EQ(p->decide(request(28000), inst, 0).mode, Mode::kLocal);
  inst = busyHolder();
  inst[1].push_capable = false;
  inst[2].push_capable = false;
  EXPECT_EQ(p->decide(request(28000), inst, 0).mode, Mode::kLocal);
  // A drained holder is not routable but still pushes; an unreachable one does not.
  inst = busyHolder();
  inst[0].healthy = false;
  auto d = p->decide(request(28000), inst, 0);
  EXPECT_EQ(d.instance, 1);
  EXPECT_EQ(d.source_instance, 0);
  EXPECT_TRUE(std::isnan(d.scores[0]));
  inst[0].reachable = false;
  d = p->decide(request(28000), inst, 0);
  EXPECT_EQ(d.mode, Mode::kLocal);
  EXPECT_EQ(d.reason, "cold");
}

TEST(UnifiedTest, SlowLinkMakesRecomputeCheaper) {
  // 25k tokens take 196.6 s over 0.1 Gbps.
  auto p = createPolicy(parsePolicy("kind: unified\nunified: {link_bandwidth_gbps: 0.1}"));
  auto d = p->decide(request(28000), busyHolder(), 0);
  EXPECT_EQ(d.instance, 1);
  EXPECT_EQ(d.mode, Mode::kLocal);
  EXPECT_NEAR(d.predicted.push, 0 + 196.608 + 50e-6 + 3000.0 / 7000, 1e-6);
}

TEST(UnifiedTest, PicksTheHolderWithTheLongestRun) {
  auto p = createPolicy(configFor("unified"));
  auto inst = pushCapable(3);
  inst[0].matched_tokens = 8000;
  inst[0].pending_prefill_tokens = 70000;
  inst[1].matched_tokens = 20000;
  inst[1].pending_prefill_tokens = 70000;
  auto d = p->decide(request(21000), inst, 0);
  EXPECT_EQ(d.instance, 2);
  EXPECT_EQ(d.source_instance, 1);
  EXPECT_EQ(d.predicted_cached_tokens, 20000);
  // 20000 tokens: 0.0786432 + 50e-6; 1000 left: 0.142857.
  EXPECT_NEAR(d.predicted.chosen, 0.0786932 + 1000.0 / 7000, 1e-6);
}

// The chosen score is the minimum over every (target, holder) pair and every local option,
// computed here by brute force, on random clusters.
TEST(UnifiedTest, ChoiceIsTheArgminOverAllPairs) {
  std::mt19937_64 rng(7);
  UnifiedParams m;
  for (int round = 0; round < 500; ++round) {
    // Without the margin a move must win by, the choice is the plain argmin.
    auto p = createPolicy(parsePolicy("kind: unified\nunified: {move_margin: 0}"));
    int n = 2 + static_cast<int>(rng() % 9);
    std::vector<InstanceSnapshot> inst(n);
    int64_t prompt = 1 + static_cast<int64_t>(rng() % 60000);
    for (auto& s : inst) {
      s.push_capable = rng() % 4 != 0;
      s.reachable = rng() % 8 != 0;
      s.healthy = rng() % 6 != 0;
      s.pending_prefill_tokens = static_cast<int64_t>(rng() % 50000);
      s.matched_tokens = rng() % 3 == 0 ? 0 : static_cast<int64_t>(rng() % 70000) / 16 * 16;
    }
    double best = std::numeric_limits<double>::infinity();
    for (int i = 0; i < n; ++i) {
      if (!inst[i].healthy) continue;
      double q = static_cast<double>(inst[i].pending_prefill_tokens) / 7000;
      int64_t own = std::min(inst[i].matched_tokens, prompt);
      best = std::min(best, q + static_cast<double>(prompt - own) / 7000);
      for (int h = 0; h < n && inst[i].push_capable; ++h) {
        int64_t held = std::min(inst[h].matched_tokens, prompt);
        if (h == i || !inst[h].push_capable || !inst[h].reachable || held - own < 256) continue;
        best = std::min(
            best, q + transferSeconds(held - own, m) + static_cast<double>(prompt - held) / 7000);
      }
    }
    auto d = p->decide(request(prompt), inst, 0);
    if (std::isinf(best)) {
      EXPECT_EQ(d.instance, -1);
      continue;
    }
    ASSERT_GE(d.instance, 0);
    EXPECT_NEAR(d.predicted.chosen, best, 1e-9) << "round " << round;
    EXPECT_NEAR(d.scores[d.instance], best, 1e-9);
    if (d.mode == Mode::kPushMigrate) {
      EXPECT_NE(d.source_instance, d.instance);
      EXPECT_GE(d.predicted_cached_tokens - std::min(inst[d.instance].matched_tokens, prompt), 256);
    }
  }
}

// The busy holder over a 20 Gbps link: push C->D predicts 0 + 0.983090 + 3000/7000 = 1.411661
// against D computing everything itself in 4 s.
TEST(UnifiedTest, MovesOnlyWhenTheGainBeatsTheMargin) {
  auto moved = createPolicy(
      parsePolicy("kind: unified\nunified: {link_bandwidth_gbps: 20, move_margin: 0.5}"));
  auto d = moved->decide(request(28000), busyHolder(), 0);
  EXPECT_EQ(d.mode, Mode::kPushMigrate);
  EXPECT_EQ(d.instance, 1);
  EXPECT_NEAR(d.move_model_s, 0.98309, 1e-6);
  EXPECT_NEAR(d.move_s, 0.98309, 1e-6);  // no measurements yet: no correction
  // 1.41 s is 35% of D's 4 s: a margin of 0.7 wants it under 1.2 s, so D computes (cold).
  auto kept = createPolicy(
      parsePolicy("kind: unified\nunified: {link_bandwidth_gbps: 20, move_margin: 0.7}"));
  d = kept->decide(request(28000), busyHolder(), 0);
  EXPECT_EQ(d.mode, Mode::kLocal);
  EXPECT_EQ(d.instance, 1);
  EXPECT_NEAR(d.predicted.chosen, 4.0, 1e-9);
  EXPECT_TRUE(std::isnan(d.move_s));
}

// The full cost: a source running requests finishes its step first and shares its link.
TEST(UnifiedTest, MoveCostIncludesTheSourcesOwnLoad) {
  auto p = createPolicy(
      parsePolicy("kind: unified\nunified: {source_step_s: 0.05, source_share_per_request: 0.5}"));
  auto inst = busyHolder();
  inst[0].running = 2;  // transfer x (1 + 0.5 x 2), plus one 50 ms step
  auto d = p->decide(request(28000), inst, 0);
  EXPECT_EQ(d.mode, Mode::kPushMigrate);
  EXPECT_NEAR(d.move_model_s, 2 * 0.098354 + 0.05, 1e-6);
  EXPECT_NEAR(d.predicted.chosen, d.move_model_s + 3000.0 / 7000, 1e-6);
}

// Measured moves from C take 10x the prediction: after the minimum samples the correction
// (capped at 8x) prices C's pushes above computing on D, and D computes.
TEST(UnifiedTest, MeasuredCostsTurnABiasedSourceOff) {
  auto p = createPolicy(
      parsePolicy("kind: unified\nunified: {link_bandwidth_gbps: 20, feedback_min_samples: 3}"));
  auto d = p->decide(request(28000), busyHolder(), 0);
  ASSERT_EQ(d.mode, Mode::kPushMigrate);
  p->moveMeasured(0, 1, d.move_model_s, 10 * d.move_model_s);
  p->moveMeasured(0, 1, d.move_model_s, 10 * d.move_model_s);
  d = p->decide(request(28000), busyHolder(), 0);
  EXPECT_EQ(d.mode, Mode::kPushMigrate);  // two samples: not yet
  p->moveMeasured(0, 1, d.move_model_s, 10 * d.move_model_s);
  d = p->decide(request(28000), busyHolder(), 0);
  EXPECT_EQ(d.mode, Mode::kLocal);
  EXPECT_EQ(d.instance, 1);
  // The push it turned down was priced at 8 x the model (the cap).
  EXPECT_NEAR(d.predicted.push, 8 * 0.98309 + 3000.0 / 7000, 1e-5);
}

// vLLM's NIXL dialect (InstanceSnapshot::nixl on the holder): the holder's first leg waits in
// its queue and prefills what it lacks, then D reads every block it lacks. Transfer of the whole
// 28000-token prompt: 28000 x 98304 x 8 / 200e9 + 50e-6 = 0.1101505 s.
constexpr double kWholePromptTransfer = 0.1101505;

// C (0) holds 25k of 28k but is drained (not routable, still reachable): D (1) and E (2) choose
// between computing cold (4 s on D) and reading C's blocks after C's leg.
std::vector<InstanceSnapshot> drainedNixlHolder() {
  auto inst = busyHolder();
  inst[0].healthy = false;
  inst[0].pending_prefill_tokens = 0;
  inst[0].nixl = true;
  return inst;
}

TEST(UnifiedNixlTest, PricesTheHoldersLegThenTheRead) {
  auto p = createPolicy(configFor("unified"));
  auto d = p->decide(request(28000), drainedNixlHolder(), 0);
  EXPECT_EQ(d.instance, 1);
  EXPECT_EQ(d.mode, Mode::kPushMigrate);
  EXPECT_EQ(d.source_instance, 0);
  EXPECT_EQ(d.reason, "nixl_pull");
  // D reads every block: nothing is left for it to prefill.
  EXPECT_EQ(d.predicted_cached_tokens, 28000);
  // C's leg prefills the 3000 tokens it lacks (0.428571 s), then D reads the whole prompt.
  const double move = 3000.0 / 7000 + kWholePromptTransfer;
  EXPECT_NEAR(d.move_model_s, move, 1e-6);
  EXPECT_NEAR(d.predicted.push, move, 1e-6);
  EXPECT_NEAR(d.predicted.chosen, move, 1e-6);
  EXPECT_NEAR(d.scores[2], 1.0 + move, 1e-6);  // E's own queue comes after C's leg
}

// The terms of C's side: its queue, the step it is running, and at least one step of its own
// even when it holds the whole prompt. A unit test of the formula would pass with any of them
// dropped from decide(); these compare decisions.
TEST(UnifiedNixlTest, TheHoldersQueueAndStepsAreChargedToTheMove) {
  auto p = createPolicy(configFor("unified"));
  auto inst = drainedNixlHolder();
  inst[0].pending_prefill_tokens = 7000;  // one second of queue on C
  auto d = p->decide(request(28000), inst, 0);
  EXPECT_NEAR(d.move_model_s, 1.0 + 3000.0 / 7000 + kWholePromptTransfer, 1e-6);
  inst[0].pending_prefill_tokens = 7000 * 4;  // 4 s on C: computing cold on D is cheaper
  d = p->decide(request(28000), inst, 0);
  EXPECT_EQ(d.mode, Mode::kLocal);
  EXPECT_EQ(d.instance, 1);
  EXPECT_NEAR(d.predicted.push, 4.0 + 3000.0 / 7000 + kWholePromptTransfer, 1e-6);
  // The same holder pushing (kvfabric) does not wait in its queue: it pushes.
  inst[0].nixl = false;
  d = p->decide(request(28000), inst, 0);
  EXPECT_EQ(d.mode, Mode::kPushMigrate);
  EXPECT_EQ(d.reason, "push_migrate");

  auto stepped = createPolicy(
      parsePolicy("kind: unified\nunified: {source_step_s: 0.05, source_share_per_request: 0.5}"));
  inst = drainedNixlHolder();
  inst[0].matched_tokens = 28000;  // C holds it all: its leg is still one step
  inst[0].running = 2;             // and it first finishes the step it is running
  d = stepped->decide(request(28000), inst, 0);
  EXPECT_EQ(d.mode, Mode::kPushMigrate);
  EXPECT_NEAR(d.move_model_s, 0.05 + 0.05 + 2 * kWholePromptTransfer, 1e-6);
}

TEST(UnifiedNixlTest, MeasuredLegsCorrectThePull) {
  auto p = createPolicy(parsePolicy("kind: unified\nunified: {feedback_min_samples: 2}"));
  auto d = p->decide(request(28000), drainedNixlHolder(), 0);
  ASSERT_EQ(d.reason, "nixl_pull");
  // Legs that take 8x the model (C's real queue was longer than it reported).
  p->moveMeasured(0, 1, d.move_model_s, 8 * d.move_model_s);
  p->moveMeasured(0, 1, d.move_model_s, 8 * d.move_model_s);
  d = p->decide(request(28000), drainedNixlHolder(), 0);
  EXPECT_EQ(d.mode, Mode::kLocal);
  EXPECT_NEAR(d.predicted.push, 8 * (3000.0 / 7000 + kWholePromptTransfer), 1e-5);
}

PolicyConfig elasticConfig() {
  return parsePolicy("kind: elastic\nelastic: {max_concurrent_offloads: 2}");
}

TEST(ElasticTest, HeavyPrefillGoesToNextPeerRoundRobin) {
  auto p = createPolicy(elasticConfig());
  auto inst = pushCapable(3);
  // 30000 new tokens: HEAVY. Local: 30000/7000 = 4.285714. Offload: P's prefill 4.285714 +
  // transfer(30000) = 0.1179648 + 50e-6 -> 4.403729 (1.03x local <= 1.5x).
  auto d = p->decide(request(30000), inst, 0);
  ASSERT_EQ(d.instance, 0);
  EXPECT_EQ(d.mode, Mode::kPrefillOffload);
  EXPECT_EQ(d.prefill_instance, 1);
  EXPECT_EQ(d.source_instance, -1);
  EXPECT_EQ(d.reason, "heavy_offload");
  EXPECT_EQ(d.request_class, RequestClass::kHeavy);
  EXPECT_NEAR(d.predicted.local, 4.285714, 1e-6);
  EXPECT_NEAR(d.predicted.offload, 4.403729, 1e-6);
  EXPECT_NEAR(d.predicted.chosen, 4.403729, 1e-6);
  EXPECT_EQ(p->offloadsInFlight(), 1);
  // The next heavy one: D by load (hybrid: instance 1 after the cursor), P the next after 1.
  d = p->decide(request(30000), inst, 0);
  EXPECT_EQ(d.mode, Mode::kPrefillOffload);
  EXPECT_NE(d.prefill_instance, d.instance);
  EXPECT_EQ(d.prefill_instance, 2);
  EXPECT_EQ(p->offloadsInFlight(), 2);
}

TEST(ElasticTest, CapHoldsUntilTheDriverReleases) {
  auto p = createPolicy(elasticConfig());
  auto inst = pushCapable(3);
  EXPECT_EQ(p->decide(request(30000), inst, 0).mode, Mode::kPrefillOffload);
  EXPECT_EQ(p->decide(request(30000), inst, 0).mode, Mode::kPrefillOffload);
  auto d = p->decide(request(30000), inst, 0);
  EXPECT_EQ(d.mode, Mode::kLocal);
  EXPECT_EQ(d.reason, "offload_cap");
  p->offloadFinished();
  EXPECT_EQ(p->offloadsInFlight(), 1);
  EXPECT_EQ(p->decide(request(30000), inst, 0).mode, Mode::kPrefillOffload);
  for (int i = 0; i < 5; ++i) p->offloadFinished();  // never below zero
  EXPECT_EQ(p->offloadsInFlight(), 0);
}

TEST(ElasticTest, OnlyHeavyRequestsAndPushCapableDecodersOffload) {
  auto p = createPolicy(elasticConfig());
  auto inst = pushCapable(3);
  auto d = p->decide(request(20000), inst, 0);  // MEDIUM
  EXPECT_EQ(d.mode, Mode::kLocal);
  EXPECT_EQ(d.request_class, RequestClass::kMedium);
  EXPECT_NEAR(d.predicted.local, 20000.0 / 7000, 1e-9);
  for (auto& s : inst) s.push_capable = false;
  d = p->decide(request(30000), inst, 0);
  EXPECT_EQ(d.mode, Mode::kLocal);
  EXPECT_EQ(p->offloadsInFlight(), 0);
}

TEST(ElasticTest, SkipsOverloadedPeersAndSlowOffloads) {
  auto p = createPolicy(elasticConfig());
  auto inst = pushCapable(3);
  // Running well above average (5 > 2 x 5/3, >= 4): instance 0 is skipped as P.
  inst[0].running = 5;
  auto d = p->decide(request(30000), inst, 0);
  ASSERT_EQ(d.mode, Mode::kPrefillOffload);
  EXPECT_EQ(d.instance, 1);
  EXPECT_EQ(d.prefill_instance, 2);
  p->offloadFinished();
  // A long prefill queue (100000 > 65536 pending tokens) skips instance 0 too. D is the
  // instance with 5000 cached tokens (35000 new: HEAVY): local 5.0 s; offload on 1:
  // 40000/7000 + transfer(35000) = 5.714286 + 0.1376756 = 5.851961.
  inst = pushCapable(3);
  inst[0].pending_prefill_tokens = 100000;
  inst[2].matched_tokens = 5000;
  auto fresh = createPolicy(elasticConfig());
  d = fresh->decide(request(40000), inst, 0);
  ASSERT_EQ(d.mode, Mode::kPrefillOffload);
  EXPECT_EQ(d.instance, 2);
  EXPECT_EQ(d.prefill_instance, 1);
  EXPECT_NEAR(d.predicted.local, 5.0, 1e-9);
  EXPECT_NEAR(d.predicted.offload, 5.851961, 1e-6);
  p->offloadFinished();
  // Every peer is slow: its queue makes the offload > 1.5 x local.
  auto slow = pushCapable(2);
  slow[1].pending_prefill_tokens = 40000;  // 5.71 s queue
  slow[1].running = 1;
  auto q = createPolicy(elasticConfig());
  d = q->decide(request(30000), slow, 0);
  EXPECT_EQ(d.instance, 0);
  EXPECT_EQ(d.mode, Mode::kLocal);
  EXPECT_EQ(d.reason, "offload_too_slow");
  // P runs a request: its blocks leave after its current step (unified.source_step_s 0.03).
  EXPECT_NEAR(d.predicted.offload, 40000.0 / 7000 + 4.285714 + 0.1180148 + 0.03, 1e-5);
  slow[1].pending_prefill_tokens = 70000;  // now over the pending cap: no peer at all
  d = q->decide(request(30000), slow, 0);
  EXPECT_EQ(d.reason, "offload_no_peer");
}

TEST(MigrationPolicyConfigTest, ParsesSectionsAndNamesBadFields) {
  auto ok = tryParsePolicy(
      "kind: unified\nunified: {prefill_tokens_per_s: 20000, link_bandwidth_gbps: 400,\n"
      "  kv_bytes_per_token: 131072, transfer_overhead_s: 0.001, affinity_factor: 1.5,\n"
      "  min_push_tokens: 64, waiting_request_s: 0.01}\n"
      "elastic: {max_concurrent_offloads: 8, lease_ms: 5000, prefill_timeout_s: 10,\n"
      "  max_cost_ratio: 2, max_pending_prefill_tokens: 1000}\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->kind, "unified");
  auto m = ok->params<UnifiedParams>("unified");
  EXPECT_DOUBLE_EQ(m.prefill_tokens_per_s, 20000);
  EXPECT_DOUBLE_EQ(m.link_bandwidth_gbps, 400);
  EXPECT_DOUBLE_EQ(m.kv_bytes_per_token, 131072);
  EXPECT_DOUBLE_EQ(m.transfer_overhead_s, 0.001);
  EXPECT_DOUBLE_EQ(m.affinity_factor, 1.5);
  EXPECT_EQ(m.min_push_tokens, 64);
  EXPECT_DOUBLE_EQ(m.waiting_request_s, 0.01);
  auto u = createPolicy(*ok);
  EXPECT_EQ(u->name(), "unified");
  EXPECT_TRUE(u->movesKv());
  // The elastic block is elastic's, read when the kind is elastic.
  ok->kind = "elastic";
  auto e = createPolicy(*ok);
  EXPECT_EQ(e->name(), "elastic");
  EXPECT_TRUE(e->movesKv());
  EXPECT_EQ(e->offloadTerms().lease_ms, 5000);
  EXPECT_EQ(e->offloadTerms().prefill_timeout, 10 * kNanosPerSecond);
  // Defaults where no block was given; policies that move no KV say so.
  auto elastic = tryParsePolicy("kind: elastic\n");
  ASSERT_TRUE(elastic.ok());
  EXPECT_EQ(createPolicy(*elastic)->offloadTerms().lease_ms, 30000);
  EXPECT_FALSE(createPolicy(configFor("hybrid"))->movesKv());
  auto bad = tryParsePolicy(
      "kind: unified\nunified: {link_bandwidth_gbps: 0, typo: 1}\n"
      "elastic: {max_concurrent_offloads: -1}\n");
  ASSERT_FALSE(bad.ok());
  std::string message(bad.status().message());
  EXPECT_NE(message.find("unified.link_bandwidth_gbps"), std::string::npos) << message;
  EXPECT_NE(message.find("typo"), std::string::npos) << message;
  EXPECT_NE(message.find("elastic.max_concurrent_offloads"), std::string::npos) << message;
}

}  // namespace
}  // namespace kvf::policy
