// Overload control in the routing core: saturation from the engine's queue, its KV usage and
// the router's own pending prefill; a request queued (not committed to a saturated instance)
// while every instance is saturated and sent on when one frees up; saturated instances hidden
// from the policy; fairness across sessions (deficit round robin charged by uncached tokens,
// a bounded per-session share); sheds by reason; cancel; the config block; the metrics text.
#include "router/core/admission.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "common/strings.h"
#include "router/core/routing_core.h"

namespace kvf::router {
namespace {

constexpr Nanos kSecond = kNanosPerSecond;

RouterConfig overloadConfig(std::string_view overload_yaml, int instances = 2,
                            std::string_view policy = "{kind: least_request}") {
  std::string yaml = "instances:\n";
  for (int i = 0; i < instances; ++i) {
    yaml += strCat("  - {id: e", i, ", url: \"http://127.0.0.1:", 9000 + i, "\"}\n");
  }
  yaml += strCat("policy: ", policy, "\noverload: ", overload_yaml, "\n");
  auto config = parseRouterConfig(yaml, "<test>");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : RouterConfig{};
}

std::unique_ptr<RoutingCore> coreFor(const RouterConfig& config) {
  auto core = RoutingCore::create(config);
  EXPECT_TRUE(core.ok()) << core.status();
  for (size_t i = 0; i < config.instances.size(); ++i) {
    (*core)->addInstance(static_cast<int>(i), config.instances[i].id, false, true);
  }
  return std::move(*core);
}

// A token prompt (the route keeps a span into it).
struct Prompt {
  explicit Prompt(int n, int first = 1000) : tokens(static_cast<size_t>(n)) {
    std::iota(tokens.begin(), tokens.end(), static_cast<policy::TokenId>(first));
  }
  void into(RequestRoute& r, std::string_view session = "") const {
    r.tokens = tokens;
    r.prompt_tokens = static_cast<int64_t>(tokens.size());
    r.max_tokens = 8;
    r.session = session;
  }
  std::vector<policy::TokenId> tokens;
};

TEST(OverloadConfigTest, ParsesAndRejectsOutOfRange) {
  RouterConfig c = overloadConfig(
      "{enabled: true, max_pending_prefill_tokens: 1000, max_waiting: 3, max_kv_usage: 0.9, "
      "max_running: 5, steer: true, max_queue: 10, max_per_session: 2, max_wait_s: 2.5, "
      "quantum_tokens: 64, "
      "retry_after_s: 7}");
  EXPECT_TRUE(c.overload.enabled);
  EXPECT_EQ(c.overload.max_pending_prefill_tokens, 1000);
  EXPECT_EQ(c.overload.max_waiting, 3);
  EXPECT_DOUBLE_EQ(c.overload.max_kv_usage, 0.9);
  EXPECT_EQ(c.overload.max_running, 5);
  EXPECT_TRUE(c.overload.steer);
  EXPECT_EQ(c.overload.max_queue, 10);
  EXPECT_EQ(c.overload.max_per_session, 2);
  EXPECT_EQ(c.overload.max_wait, Nanos{2500} * 1000 * 1000);
  EXPECT_EQ(c.overload.quantum_tokens, 64);
  EXPECT_EQ(c.overload.retry_after_s, 7);
  auto bad = parseRouterConfig(
      "instances: [{id: a, url: \"http://h:1\"}]\noverload: {max_kv_usage: 1.5, bogus: 1}\n",
      "<test>");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("overload.max_kv_usage"), std::string_view::npos)
      << bad.status();
  EXPECT_NE(bad.status().message().find("overload.bogus"), std::string_view::npos) << bad.status();
}

TEST(OverloadTest, SaturationFollowsEachSignal) {
  auto core = coreFor(overloadConfig(
      "{enabled: true, max_pending_prefill_tokens: 100, max_waiting: 4, max_kv_usage: 0.9, "
      "max_running: 2}"));
  EXPECT_FALSE(core->saturated(0));
  core->reportEngineLoad(0, 4, std::nullopt);
  EXPECT_TRUE(core->saturated(0));
  core->reportEngineLoad(0, 3, 0.95);
  EXPECT_TRUE(core->saturated(0));
  core->reportEngineLoad(0, 3, 0.5);
  EXPECT_FALSE(core->saturated(0));
  auto full_ok = coreFor(overloadConfig("{enabled: true}"));
  full_ok->reportEngineLoad(0, 0, 1.0);  // a full cache of idle blocks is no queue
  EXPECT_FALSE(full_ok->saturated(0));
  // The router's own accounting: a decided prompt of 100 uncached tokens saturates at once.
  Prompt p(100);
  RequestRoute r;
  p.into(r);
  ASSERT_TRUE(core->decide(r, 0));
  EXPECT_TRUE(core->saturated(r.instance()));
  r.endPrefill();  // first token: the prefill backlog goes, one request still runs
  EXPECT_FALSE(core->saturated(r.instance()));
}

TEST(OverloadTest, DisabledAlwaysDispatches) {
  auto core = coreFor(overloadConfig("{enabled: false, max_waiting: 1}"));
  core->reportEngineLoad(0, 10, std::nullopt);
  core->reportEngineLoad(1, 10, std::nullopt);
  Prompt p(32);
  RequestRoute r;
  p.into(r);
  ShedReason why{};
  EXPECT_EQ(core->admit(r, 1, 0, &why), RoutingCore::Admission::kDispatch);
  EXPECT_EQ(core->queueDepth(), 0);
}

// Every instance saturated: requests wait in the router instead of going to a busy engine, and
// leave in order as capacity returns; a saturated instance is not offered to the policy.
TEST(OverloadTest, QueuesWhileSaturatedAndSendsToTheInstanceThatFreesUp) {
  auto core = coreFor(overloadConfig("{enabled: true, max_waiting: 2, steer: true}"));
  core->reportEngineLoad(0, 2, std::nullopt);
  core->reportEngineLoad(1, 2, std::nullopt);
  Prompt a(64, 1), b(64, 5000);
  RequestRoute ra, rb;
  a.into(ra, "s1");
  b.into(rb, "s2");
  ShedReason why{};
  EXPECT_EQ(core->admit(ra, 1, 0, &why), RoutingCore::Admission::kQueued);
  EXPECT_EQ(core->admit(rb, 2, 0, &why), RoutingCore::Admission::kQueued);
  EXPECT_EQ(core->queueDepth(), 2);
  EXPECT_FALSE(core->nextDispatch(kSecond).has_value());  // still saturated
  core->reportEngineLoad(1, 0, std::nullopt);             // instance 1 drained its queue
  std::optional<uint64_t> first = core->nextDispatch(2 * kSecond);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(*first, 1u);
  ASSERT_TRUE(core->decide(ra, 2 * kSecond));
  EXPECT_EQ(ra.instance(), 1);  // instance 0 is saturated and hidden from the policy
  // A request that arrives while others wait does not overtake them.
  Prompt c(64, 9000);
  RequestRoute rc;
  c.into(rc, "s3");
  EXPECT_EQ(core->admit(rc, 3, 2 * kSecond, &why), RoutingCore::Admission::kQueued);
  std::optional<uint64_t> second = core->nextDispatch(2 * kSecond);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(*second, 2u);
  const OverloadStats& s = core->overloadStats();
  EXPECT_EQ(s.queued, 3u);
  EXPECT_EQ(s.dispatched, 2u);
  EXPECT_EQ(s.wait_count, 2u);
  EXPECT_DOUBLE_EQ(s.wait_sum_s, 4.0);
  EXPECT_EQ(s.max_depth, 2);
}

TEST(OverloadTest, NothingQueuesWhileAnInstanceHasRoom) {
  auto core = coreFor(overloadConfig("{enabled: true, max_waiting: 2, steer: true}"));
  core->reportEngineLoad(0, 5, std::nullopt);
  Prompt p(64);
  RequestRoute r;
  p.into(r);
  ShedReason why{};
  EXPECT_EQ(core->admit(r, 1, 0, &why), RoutingCore::Admission::kDispatch);
  ASSERT_TRUE(core->decide(r, 0));
  EXPECT_EQ(r.instance(), 1);
  EXPECT_EQ(core->overloadStats().admitted_at_once, 1u);
}

// Without steer the policy still sees a saturated instance (round robin starts at the
// saturated instance 0); with it, a retry that excluded the only unsaturated instance still
// finds a saturated one.
TEST(OverloadTest, WithoutSteerThePolicySeesSaturatedInstances) {
  auto core = coreFor(overloadConfig("{enabled: true, max_waiting: 2}", 2, "{kind: round_robin}"));
  core->reportEngineLoad(0, 5, std::nullopt);
  Prompt p(64);
  RequestRoute r;
  p.into(r);
  ShedReason why{};
  EXPECT_EQ(core->admit(r, 1, 0, &why), RoutingCore::Admission::kDispatch);
  ASSERT_TRUE(core->decide(r, 0));
  EXPECT_EQ(r.instance(), 0);
}

TEST(OverloadTest, RetryFallsBackToSaturatedInstances) {
  auto core = coreFor(overloadConfig("{enabled: true, max_waiting: 2, steer: true}"));
  core->reportEngineLoad(0, 5, std::nullopt);
  Prompt p(64);
  RequestRoute r;
  p.into(r);
  ASSERT_TRUE(core->decide(r, 0));
  EXPECT_EQ(r.instance(), 1);
  r.exclude();
  ASSERT_TRUE(core->decide(r, 0));
  EXPECT_EQ(r.instance(), 0);
}

TEST(OverloadTest, ShedsPastTheQueueBoundsAndTheWaitLimit) {
  auto core = coreFor(overloadConfig(
      "{enabled: true, max_waiting: 1, max_queue: 3, max_per_session: 2, max_wait_s: 5}"));
  core->reportEngineLoad(0, 1, std::nullopt);
  core->reportEngineLoad(1, 1, std::nullopt);
  Prompt p(32);
  std::vector<RequestRoute> routes(5);
  const char* sessions[] = {"a", "a", "a", "b", "c"};
  for (size_t i = 0; i < routes.size(); ++i) p.into(routes[i], sessions[i]);
  ShedReason why{};
  EXPECT_EQ(core->admit(routes[0], 0, 0, &why), RoutingCore::Admission::kQueued);
  EXPECT_EQ(core->admit(routes[1], 1, 0, &why), RoutingCore::Admission::kQueued);
  EXPECT_EQ(core->admit(routes[2], 2, 0, &why), RoutingCore::Admission::kShed);
  EXPECT_EQ(why, ShedReason::kSessionShare);
  EXPECT_EQ(core->admit(routes[3], 3, 0, &why), RoutingCore::Admission::kQueued);
  EXPECT_EQ(core->admit(routes[4], 4, 0, &why), RoutingCore::Admission::kShed);
  EXPECT_EQ(why, ShedReason::kQueueFull);
  EXPECT_TRUE(core->expireQueued(0, 5 * kSecond));
  EXPECT_FALSE(core->expireQueued(0, 5 * kSecond));  // already gone
  EXPECT_TRUE(core->cancelQueued(3));
  EXPECT_FALSE(core->cancelQueued(3));
  EXPECT_EQ(core->queueDepth(), 1);
  const OverloadStats& s = core->overloadStats();
  EXPECT_EQ(s.shed[static_cast<size_t>(ShedReason::kSessionShare)], 1u);
  EXPECT_EQ(s.shed[static_cast<size_t>(ShedReason::kQueueFull)], 1u);
  EXPECT_EQ(s.shed[static_cast<size_t>(ShedReason::kWaitTimeout)], 1u);
  EXPECT_EQ(s.cancelled, 1u);
  std::string text = s.prometheusText(core->queueDepth());
  EXPECT_NE(text.find("kvfabric_router_queue_depth 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("kvfabric_router_shed_total{reason=\"wait_timeout\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("kvfabric_router_queue_wait_seconds_bucket{le=\"5\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("kvfabric_router_queue_wait_seconds_bucket{le=\"+Inf\"} 1\n"),
            std::string::npos);
}

// One session sends many expensive requests; another sends cheap ones later. Deficit round
// robin charged by cost lets the cheap session through instead of behind the whole backlog.
TEST(AdmissionQueueTest, DeficitRoundRobinKeepsALongSessionFromStarvingOthers) {
  OverloadConfig config;
  config.quantum_tokens = 1000;
  AdmissionQueue q(config);
  for (uint64_t t = 0; t < 4; ++t) ASSERT_FALSE(q.push(t, "long", 4000, 0).has_value());
  for (uint64_t t = 10; t < 14; ++t) ASSERT_FALSE(q.push(t, "short", 500, 1).has_value());
  std::vector<uint64_t> order;
  while (auto p = q.pop()) order.push_back(p->ticket);
  ASSERT_EQ(order.size(), 8u);
  // The cheap session's four requests (2,000 tokens) all go before the long session's second.
  auto pos = [&](uint64_t t) { return std::find(order.begin(), order.end(), t) - order.begin(); };
  EXPECT_LT(pos(13), pos(1));
  EXPECT_LT(pos(0), pos(1));  // FIFO within a session
  EXPECT_TRUE(q.empty());
}

TEST(AdmissionQueueTest, EqualCostsAlternateBetweenSessions) {
  OverloadConfig config;
  config.quantum_tokens = 100;
  AdmissionQueue q(config);
  for (uint64_t t = 0; t < 3; ++t) ASSERT_FALSE(q.push(t, "a", 100, 0).has_value());
  for (uint64_t t = 10; t < 13; ++t) ASSERT_FALSE(q.push(t, "b", 100, 0).has_value());
  std::vector<uint64_t> order;
  while (auto p = q.pop()) order.push_back(p->ticket);
  EXPECT_EQ(order, (std::vector<uint64_t>{0, 10, 1, 11, 2, 12}));
}

TEST(AdmissionQueueTest, SessionlessRequestsAreEachTheirOwnSession) {
  OverloadConfig config;
  config.max_per_session = 1;
  AdmissionQueue q(config);
  EXPECT_FALSE(q.push(1, "", 10, 0).has_value());
  EXPECT_FALSE(q.push(2, "", 10, 0).has_value());
  EXPECT_EQ(q.push(3, "x", 10, 0), std::nullopt);
  EXPECT_EQ(q.push(4, "x", 10, 0), ShedReason::kSessionShare);
  EXPECT_EQ(q.remove(2), 0);
  EXPECT_EQ(q.size(), 2);
  EXPECT_EQ(q.pop()->ticket, 1u);
  EXPECT_EQ(q.pop()->ticket, 3u);
  EXPECT_FALSE(q.pop().has_value());
}

}  // namespace
}  // namespace kvf::router
