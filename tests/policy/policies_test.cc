// Policy scenarios from the milestone report (seed 003 §3.4, §3.9, §9): LMetric's implicit
// soft affinity through the uncached term, Linear's session stickiness with its overload
// redirect, and the hybrid's > 50% cache gate with deterministic ties and hysteresis.
#include "policy/holder_set.h"
#include "policy/policy.h"
#include "policy/policy_support.h"
#include "policy/registry.h"
#include "tests/policy/parse_policy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>

#include "common/config.h"

namespace kvf::policy {
namespace {

std::vector<InstanceSnapshot> idle(int n) { return std::vector<InstanceSnapshot>(n); }

RouteRequest request(int64_t prompt, std::string_view session = {}) {
  RouteRequest r;
  r.prompt_tokens = prompt;
  r.session = session;
  return r;
}

TEST(ClassifyTest, Boundaries) {
  ClassifyConfig c;
  EXPECT_EQ(classify(0, c), RequestClass::kWarm);
  EXPECT_EQ(classify(4999, c), RequestClass::kWarm);
  EXPECT_EQ(classify(5000, c), RequestClass::kMedium);
  EXPECT_EQ(classify(20000, c), RequestClass::kMedium);
  EXPECT_EQ(classify(20001, c), RequestClass::kHeavy);
}

TEST(RoundRobinTest, CyclesOverHealthyInstances) {
  auto p = createPolicy(configFor("round_robin"));
  auto inst = idle(3);
  inst[1].healthy = false;
  std::vector<int> picks;
  for (int i = 0; i < 4; ++i) picks.push_back(p->decide(request(10), inst, 0).instance);
  EXPECT_EQ(picks, (std::vector<int>{0, 2, 0, 2}));
  for (auto& s : inst) s.healthy = false;
  auto d = p->decide(request(10), inst, 0);
  EXPECT_EQ(d.instance, -1);
  EXPECT_EQ(d.reason, "no_healthy_instance");
}

TEST(LeastRequestTest, PicksFewestRequestsAndRotatesTies) {
  auto p = createPolicy(configFor("least_request"));
  auto inst = idle(3);
  inst[0].running = 2;
  inst[1].running = 1;
  inst[2].running = 1;
  inst[2].waiting = 1;
  EXPECT_EQ(p->decide(request(10), inst, 0).instance, 1);
  inst[2].waiting = 0;
  int first = p->decide(request(10), inst, 0).instance;
  int second = p->decide(request(10), inst, 0).instance;
  EXPECT_NE(first, second);  // equal instances share the work
  EXPECT_NE(first, 0);
  EXPECT_NE(second, 0);
}

TEST(LMetricTest, ScoreIsPendingPlusUncachedTimesRunning) {
  auto p = createPolicy(configFor("lmetric"));
  auto inst = idle(2);
  inst[0].running = 2;
  inst[0].pending_prefill_tokens = 1000;
  inst[0].matched_tokens = 8000;  // 10000-token prompt: 2000 uncached
  inst[1].running = 1;
  inst[1].pending_prefill_tokens = 0;
  auto d = p->decide(request(10000), inst, 0);
  EXPECT_DOUBLE_EQ(d.scores[0], (1000 + 2000) * 2.0);
  EXPECT_DOUBLE_EQ(d.scores[1], (0 + 10000) * 1.0);
  EXPECT_EQ(d.instance, 0);
  EXPECT_EQ(d.predicted_cached_tokens, 8000);
  EXPECT_EQ(d.request_class, RequestClass::kWarm);  // 2000 new tokens
  EXPECT_EQ(d.reason, "lmetric_score");
}

TEST(LMetricTest, ImplicitSoftAffinityWithoutSessionStickiness) {
  // §3.4: the uncached term attracts the next turn to the instance holding the session's
  // prefix when loads are equal...
  auto p = createPolicy(configFor("lmetric"));
  auto inst = idle(4);
  for (auto& s : inst) s.running = 1;
  inst[3].matched_tokens = 30000;
  EXPECT_EQ(p->decide(request(32000, "s1"), inst, 0).instance, 3);
  // ...but there is no pin: once that instance is loaded enough, the request goes elsewhere.
  inst[3].running = 20;
  inst[3].pending_prefill_tokens = 50000;
  EXPECT_NE(p->decide(request(32000, "s1"), inst, 0).instance, 3);
}

TEST(LMetricTest, IdleInstancesTieOnScoreAndPreferCache) {
  auto p = createPolicy(configFor("lmetric"));
  auto inst = idle(3);
  inst[2].matched_tokens = 100;
  auto d = p->decide(request(1000), inst, 0);
  EXPECT_EQ(d.scores[0], 0.0);  // running = 0
  EXPECT_EQ(d.instance, 2);
}

TEST(LinearTest, StickyUntilPinnedLoadExceedsTwiceAverage) {
  auto p = createPolicy(configFor("linear"));
  auto inst = idle(4);
  auto first = p->decide(request(1000, "s"), inst, 0);
  EXPECT_EQ(first.reason, "linear_score");
  int pinned = first.instance;
  // Load elsewhere makes the pinned instance look cheapest to the score, but affinity alone
  // must keep it: make the pinned instance costlier yet under 2x the average.
  for (auto& s : inst) s.ongoing_tokens = 1000;
  inst[pinned].ongoing_tokens = 1900;  // average 1225, 2x = 2450
  auto again = p->decide(request(1000, "s"), inst, 1);
  EXPECT_EQ(again.instance, pinned);
  EXPECT_EQ(again.reason, "session_affinity");
  inst[pinned].ongoing_tokens = 10000;  // average 3250, 2x = 6500: overloaded
  auto moved = p->decide(request(1000, "s"), inst, 2);
  EXPECT_NE(moved.instance, pinned);
  EXPECT_EQ(moved.reason, "overload_redirect");
  // The session is now pinned to its new instance.
  EXPECT_EQ(p->decide(request(1000, "s"), inst, 3).instance, moved.instance);
}

TEST(LinearTest, ScoreIsOngoingMinusAlphaCacheHits) {
  auto p = createPolicy(parsePolicy("kind: linear\nlinear: {alpha: 0.5}"));
  auto inst = idle(2);
  inst[0].ongoing_tokens = 3000;
  inst[0].matched_tokens = 4000;  // 3000 - 2000 = 1000
  inst[1].ongoing_tokens = 1500;  // 1500
  auto d = p->decide(request(5000), inst, 0);
  EXPECT_DOUBLE_EQ(d.scores[0], 1000.0);
  EXPECT_DOUBLE_EQ(d.scores[1], 1500.0);
  EXPECT_EQ(d.instance, 0);
}

TEST(LinearTest, PinnedUnhealthyRedirectsAndSessionsExpire) {
  PolicyConfig c = configFor("linear");
  c.session_ttl = 100;
  auto p = createPolicy(c);
  auto inst = idle(3);
  int pinned = p->decide(request(10, "s"), inst, 0).instance;
  inst[pinned].healthy = false;
  auto d = p->decide(request(10, "s"), inst, 10);
  EXPECT_NE(d.instance, pinned);
  EXPECT_EQ(d.reason, "pinned_unhealthy");
  auto later = p->decide(request(10, "s"), inst, 1000);  // pin expired
  EXPECT_EQ(later.reason, "linear_score");
}

TEST(HybridTest, GateSendsToInstanceHoldingMoreThanHalf) {
  auto p = createPolicy(configFor("hybrid"));
  auto inst = idle(4);
  for (auto& s : inst) s.running = 1;
  inst[1].running = 3;  // busier: plain LMetric would avoid it
  inst[1].matched_tokens = 6000;
  inst[2].matched_tokens = 4000;
  auto d = p->decide(request(10000), inst, 0);
  EXPECT_EQ(d.instance, 1);
  EXPECT_EQ(d.reason, "cache_gate");
  // Exactly half is not enough: falls back to the LMetric score.
  inst[1].matched_tokens = 5000;
  auto half = p->decide(request(10000), inst, 0);
  EXPECT_EQ(half.reason, "lmetric_score");
  EXPECT_EQ(half.instance, 2);  // (0 + 6000) x 1 is the lowest score
}

TEST(HybridTest, GateSkipsOverloadedHolder) {
  auto p = createPolicy(configFor("hybrid"));
  auto inst = idle(4);
  inst[0].running = 12;  // average 3: 12 > 2 x 3 and >= 4
  inst[0].matched_tokens = 9000;
  auto d = p->decide(request(10000), inst, 0);
  EXPECT_NE(d.instance, 0);
  EXPECT_EQ(d.reason, "gate_overloaded");
}

// With gate_cost_factor the gate also weighs the prefill work queued ahead on the holder: a
// holder that would make this request wait behind more than factor x the least work anywhere
// loses the gate, even when its running count is not overloaded.
TEST(HybridTest, GateCostFactorSkipsHolderWithMuchQueuedPrefill) {
  auto inst = idle(3);
  for (auto& s : inst) s.running = 2;
  inst[0].matched_tokens = 8000;           // holds 80% of the prompt
  inst[0].pending_prefill_tokens = 40000;  // work ahead: 40000 + 2000 = 42000
  inst[1].pending_prefill_tokens = 5000;   // 5000 + 10000 = 15000 (the least)
  inst[2].pending_prefill_tokens = 20000;  // 30000
  auto off = createPolicy(configFor("hybrid"));
  auto d = off->decide(request(10000), inst, 0);
  EXPECT_EQ(d.instance, 0);
  EXPECT_EQ(d.reason, "cache_gate");
  auto on = createPolicy(parsePolicy("kind: hybrid\nhybrid: {gate_cost_factor: 2}"));
  auto skipped = on->decide(request(10000), inst, 0);
  EXPECT_NE(skipped.instance, 0);
  EXPECT_EQ(skipped.reason, "gate_costly");
  // Within the factor the holder keeps the gate: 42000 <= 3 x 15000.
  auto loose = createPolicy(parsePolicy("kind: hybrid\nhybrid: {gate_cost_factor: 3}"));
  EXPECT_EQ(loose->decide(request(10000), inst, 0).reason, "cache_gate");
  EXPECT_FALSE(tryParsePolicy("kind: hybrid\nhybrid: {gate_cost_factor: 0.5}").ok());
}

TEST(HybridTest, GateTieBreakIsDeterministic) {
  auto inst = idle(3);
  inst[0].matched_tokens = inst[2].matched_tokens = 8000;
  inst[0].running = 2;
  inst[2].running = 1;
  for (int trial = 0; trial < 3; ++trial) {
    auto p = createPolicy(configFor("hybrid"));
    EXPECT_EQ(p->decide(request(10000), inst, 0).instance, 2);  // lower LMetric score
  }
  inst[0].running = 1;
  auto p = createPolicy(configFor("hybrid"));
  EXPECT_EQ(p->decide(request(10000), inst, 0).instance, 0);  // full tie: lower index
}

TEST(HybridTest, HysteresisKeepsSessionOnNearEqualScores) {
  auto p = createPolicy(configFor("hybrid"));
  auto inst = idle(2);
  inst[0].running = inst[1].running = 1;
  int first = p->decide(request(1000, "s"), inst, 0).instance;
  int other = 1 - first;
  // The other instance becomes slightly cheaper (within 10%): the session stays.
  inst[first].pending_prefill_tokens = 50;
  auto d = p->decide(request(1000, "s"), inst, 1);
  EXPECT_EQ(d.instance, first);
  EXPECT_EQ(d.reason, "hysteresis");
  // A clear difference moves it.
  inst[first].pending_prefill_tokens = 500;
  auto moved = p->decide(request(1000, "s"), inst, 2);
  EXPECT_EQ(moved.instance, other);
  EXPECT_EQ(moved.reason, "lmetric_score");
  // Without a session, equal instances alternate (no flapping memory needed).
  inst[0].pending_prefill_tokens = inst[1].pending_prefill_tokens = 0;
  int a = p->decide(request(1000), inst, 3).instance;
  int b = p->decide(request(1000), inst, 4).instance;
  EXPECT_NE(a, b);
}

TEST(HybridTest, UnhealthyInstancesNeverChosenAndScoredNaN) {
  auto p = createPolicy(configFor("hybrid"));
  auto inst = idle(2);
  inst[0].healthy = false;
  inst[0].matched_tokens = 10000;
  auto d = p->decide(request(10000), inst, 0);
  EXPECT_EQ(d.instance, 1);
  EXPECT_TRUE(std::isnan(d.scores[0]));
}

TEST(PolicyConfigTest, ParsesAndRejectsBadValues) {
  auto ok = tryParsePolicy(
      "kind: linear\nlinear: {alpha: 0.25, overload_factor: 3}\n"
      "classify: {warm_max_new_tokens: 4000}\nsession_ttl_s: 5\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->kind, "linear");
  EXPECT_EQ(ok->classify.warm_max_new_tokens, 4000);
  EXPECT_EQ(ok->session_ttl, 5 * kNanosPerSecond);
  // The block reached the policy: score = ongoing - 0.25 x cached.
  auto p = createPolicy(*ok);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->name(), "linear");
  auto inst = idle(2);
  inst[0].ongoing_tokens = 3000;
  inst[0].matched_tokens = 4000;
  EXPECT_DOUBLE_EQ(p->decide(request(5000), inst, 0).scores[0], 2000.0);

  auto bad = tryParsePolicy("kind: magic\nhybrid: {gate_fraction: 2, bogus: 1}\n");
  ASSERT_FALSE(bad.ok());
  std::string message(bad.status().message());
  EXPECT_NE(message.find("kind: must be one of: round_robin, least_request, linear, lmetric, "
                         "hybrid, unified, elastic (got \"magic\")"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("hybrid.gate_fraction"), std::string::npos) << message;
  EXPECT_NE(message.find("hybrid.bogus"), std::string::npos) << message;
  // A policy without parameters takes no block keys.
  auto no_params = tryParsePolicy("kind: lmetric\nlmetric: {alpha: 1}\n");
  ASSERT_FALSE(no_params.ok());
  EXPECT_NE(std::string(no_params.status().message()).find("lmetric.alpha"), std::string::npos)
      << no_params.status();
}

// Blocks of policies other than the chosen one load as before (an experiment file that tunes
// several arms) and are still checked.
TEST(PolicyConfigTest, OtherPoliciesBlocksAreParsedByTheirOwners) {
  auto ok = tryParsePolicy(
      "kind: lmetric\nhybrid: {gate_fraction: 0.3}\nunified: {min_push_tokens: 64}\n"
      "elastic: {lease_ms: 100}\nlinear: {alpha: 2}\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->blocks.size(), 4u);
  EXPECT_EQ(createPolicy(*ok)->name(), "lmetric");
  auto bad = tryParsePolicy("kind: lmetric\nunified: {min_push_tokens: 0}\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("unified.min_push_tokens"), std::string::npos);
}

}  // namespace
}  // namespace kvf::policy

namespace kvf::policy {
namespace {

// Every policy decides among kMaxInstances (1,024) instances: the cache-aware ones find the one
// holding the prompt far past the holder word, the load-based ones the idle one, round robin
// cycles over the healthy ones, and none picks an unhealthy instance.
TEST(LargeClusterTest, EveryPolicyDecidesAmong1024Instances) {
  constexpr int kHolder = 1000;
  for (std::string_view kind : {"lmetric", "linear", "hybrid", "unified", "elastic"}) {
    SCOPED_TRACE(kind);
    auto p = createPolicy(configFor(kind));
    auto inst = idle(kMaxInstances);
    for (auto& s : inst) s.running = 2;
    inst[kHolder].matched_tokens = 30000;
    auto d = p->decide(request(32768, "s"), inst, 0);
    EXPECT_EQ(d.instance, kHolder);
    EXPECT_EQ(d.scores.size(), static_cast<size_t>(kMaxInstances));
    inst[kHolder].healthy = false;
    d = p->decide(request(32768, "t"), inst, 1);
    EXPECT_NE(d.instance, kHolder);
    EXPECT_GE(d.instance, 0);
    EXPECT_LT(d.instance, kMaxInstances);
  }
  auto least = createPolicy(configFor("least_request"));
  auto inst = idle(kMaxInstances);
  for (auto& s : inst) s.running = 3;
  inst[kMaxInstances - 1].running = 0;
  EXPECT_EQ(least->decide(request(10), inst, 0).instance, kMaxInstances - 1);

  auto rr = createPolicy(configFor("round_robin"));
  for (auto& s : inst) s.healthy = false;
  inst[70].healthy = true;
  inst[kMaxInstances - 1].healthy = true;
  std::vector<int> picks;
  for (int i = 0; i < 3; ++i) picks.push_back(rr->decide(request(10), inst, 0).instance);
  EXPECT_EQ(picks, (std::vector<int>{70, kMaxInstances - 1, 70}));
}

// hybrid decides in one pass over the snapshots; this reference is the multi-pass form it
// replaced (lmetric's scores, the average, the gate over every instance, the rotating argmin),
// written from docs/policies.md. On random clusters (unhealthy instances, tied scores, lower-tier
// runs, sessions that come back, every gate setting) both must pick the same instance for the
// same reason with the same scores, decision after decision.
struct ReferenceHybrid {
  double gate_fraction = 0.5, overload_factor = 2.0, hysteresis = 0.1, gate_cost_factor = 0;
  int64_t overload_min_running = 4;
  TierCreditConfig tiers;
  size_t cursor = 0;
  std::map<std::string, int, std::less<>> sessions;

  std::pair<int, std::string_view> decide(const RouteRequest& r,
                                          const std::vector<InstanceSnapshot>& inst) {
    const size_t n = inst.size();
    std::vector<double> score(n), uncached(n);
    for (size_t i = 0; i < n; ++i) {
      uncached[i] = support::uncached(r, inst[i], tiers);
      score[i] = (static_cast<double>(inst[i].pending_prefill_tokens) + uncached[i]) *
                 static_cast<double>(inst[i].running);
    }
    std::string_view reason;
    int chosen = -1;
    if (r.prompt_tokens > 0) {
      const double average = support::averageRunning(inst);
      double least_work = -1;
      if (gate_cost_factor > 0) {
        for (size_t i = 0; i < n; ++i) {
          const double w = static_cast<double>(inst[i].pending_prefill_tokens) + uncached[i];
          if (inst[i].healthy && (least_work < 0 || w < least_work)) least_work = w;
        }
      }
      double best_hits = 0;
      bool overloaded = false, costly = false;
      for (size_t i = 0; i < n; ++i) {
        if (!inst[i].healthy) continue;
        const double hits = tiers::effectiveHits(r, inst[i], tiers);
        if (hits <= gate_fraction * static_cast<double>(r.prompt_tokens)) continue;
        if (support::overloaded(inst[i].running, average, overload_factor, overload_min_running)) {
          overloaded = true;
          continue;
        }
        const double w = static_cast<double>(inst[i].pending_prefill_tokens) + uncached[i];
        if (least_work >= 0 && w > gate_cost_factor * least_work) {
          costly = true;
          continue;
        }
        if (chosen < 0 || hits > best_hits || (hits == best_hits && score[i] < score[chosen])) {
          chosen = static_cast<int>(i);
          best_hits = hits;
        }
      }
      reason = chosen >= 0  ? "cache_gate"
               : overloaded ? "gate_overloaded"
               : costly     ? "gate_costly"
                            : "";
    }
    if (chosen < 0 && n > 0) {
      chosen = support::argmin(inst, score, uncached, cursor);
      if (reason.empty()) reason = "lmetric_score";
      auto last = sessions.find(r.session);
      if (chosen >= 0 && last != sessions.end() && last->second != chosen &&
          inst[last->second].healthy && score[last->second] <= score[chosen] * (1.0 + hysteresis)) {
        chosen = last->second;
        reason = "hysteresis";
      }
    }
    if (chosen >= 0) {
      cursor = static_cast<size_t>(chosen) + 1;
      sessions[std::string(r.session)] = chosen;
    }
    return {chosen, chosen < 0 ? std::string_view("no_healthy_instance") : reason};
  }
};

TEST(HybridTest, OnePassDecidesAsTheMultiPassReference) {
  std::mt19937_64 rng(7);
  const std::vector<double> cost_factors = {0, 1.5, 4};
  for (double cost_factor : cost_factors) {
    for (int trial = 0; trial < 40; ++trial) {
      const int n = trial % 4 == 0 ? 1 + static_cast<int>(rng() % 8)
                                   : 1 + static_cast<int>(rng() % kMaxInstances);
      auto policy = createPolicy(parsePolicy(
          "kind: hybrid\nhybrid: {gate_cost_factor: " + std::to_string(cost_factor) + "}"));
      ReferenceHybrid ref;
      ref.gate_cost_factor = cost_factor;
      ref.tiers = configFor("hybrid").tiers;
      std::vector<InstanceSnapshot> inst(static_cast<size_t>(n));
      for (int step = 0; step < 30; ++step) {
        const int64_t prompt = rng() % 4 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % 40000);
        for (auto& s : inst) {
          s.healthy = rng() % 10 != 0;
          s.running = static_cast<int64_t>(rng() % 6);  // small ranges: many ties
          s.pending_prefill_tokens = static_cast<int64_t>(rng() % 3) * 4096;
          s.matched_tokens = rng() % 3 == 0 ? static_cast<int64_t>(rng() % 4) * prompt / 3 : 0;
          s.cpu_tokens = rng() % 8 == 0 ? static_cast<int64_t>(rng() % 8192) : 0;
          s.disk_tokens = rng() % 16 == 0 ? static_cast<int64_t>(rng() % 8192) : 0;
        }
        RouteRequest r;
        r.prompt_tokens = prompt;
        const std::string session = "s" + std::to_string(rng() % 5);
        r.session = session;
        auto want = ref.decide(r, inst);
        auto got = policy->decide(r, inst, step);
        ASSERT_EQ(got.instance, want.first) << "n=" << n << " step=" << step;
        ASSERT_EQ(got.reason, want.second) << "n=" << n << " step=" << step;
        ASSERT_EQ(got.scores.size(), inst.size());
        for (size_t i = 0; i < inst.size(); ++i) {
          if (!inst[i].healthy) {
            ASSERT_TRUE(std::isnan(got.scores[i]));
          } else {
            ASSERT_EQ(got.scores[i], (static_cast<double>(inst[i].pending_prefill_tokens) +
                                      support::uncached(r, inst[i], ref.tiers)) *
                                         static_cast<double>(inst[i].running));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvf::policy
