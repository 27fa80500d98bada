// The routing core alone (no I/O, time as an argument): leases that give back exactly what they
// took on every path (and nothing to a slot reused since), the cap on predicted cached tokens,
// retry exclusion, the circuit breaker and health thresholds, routed entries, the decision
// record, and a policy registered outside the built-in list driven from its YAML.
#include "router/core/routing_core.h"

#include <gtest/gtest.h>

#include <numeric>

#include "common/strings.h"
#include "policy/policy_support.h"
#include "policy/registry.h"

namespace kvf::router {
namespace {

RouterConfig configFor(std::string_view policy_yaml, int instances = 3,
                       const policy::PolicyRegistry& registry = policy::PolicyRegistry::builtin()) {
  std::string yaml = "instances:\n";
  for (int i = 0; i < instances; ++i) {
    yaml += strCat("  - {id: e", i, ", url: \"http://127.0.0.1:", 9000 + i, "\"}\n");
  }
  yaml += strCat("policy: ", policy_yaml, "\n",
                 "upstream: {circuit_failure_threshold: 2, circuit_open_s: 10}\n"
                 "health: {unhealthy_threshold: 2, healthy_threshold: 1}\n");
  auto config = parseRouterConfig(yaml, "<test>", registry);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : RouterConfig{};
}

std::unique_ptr<RoutingCore> coreFor(const RouterConfig& config, bool push_capable = false) {
  auto core = RoutingCore::create(config);
  EXPECT_TRUE(core.ok()) << core.status();
  for (size_t i = 0; i < config.instances.size(); ++i) {
    (*core)->addInstance(static_cast<int>(i), config.instances[i].id, push_capable, true);
  }
  return std::move(*core);
}

std::vector<policy::TokenId> tokens(int n, int first = 1000) {
  std::vector<policy::TokenId> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), static_cast<policy::TokenId>(first));
  return t;
}

// A route for a token prompt whose hashes the core computes.
void prepare(RequestRoute& r, const std::vector<policy::TokenId>& prompt, int64_t max_tokens = 8,
             std::string_view session = "") {
  r.tokens = prompt;
  r.prompt_tokens = static_cast<int64_t>(prompt.size());
  r.max_tokens = max_tokens;
  r.session = session;
}

TEST(RoutingCoreTest, LeasesTakeAndGiveBackExactlyTheirLoad) {
  auto core = coreFor(configFor("{kind: lmetric}"));
  auto prompt = tokens(100);
  {
    RequestRoute r;
    prepare(r, prompt);
    ASSERT_TRUE(core->decide(r, 0));
    const InstanceState& s = core->instance(r.instance());
    EXPECT_EQ(s.running, 1);
    EXPECT_EQ(s.ongoing_tokens, 108);
    EXPECT_EQ(s.pending_prefill_tokens, 100);  // nothing cached
    r.endPrefill();
    EXPECT_EQ(s.pending_prefill_tokens, 0);
    EXPECT_EQ(s.running, 1);
    r.endPrefill();  // once only
    EXPECT_EQ(s.pending_prefill_tokens, 0);
  }  // the route goes away: the rest is given back
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(core->instance(i).running, 0);
    EXPECT_EQ(core->instance(i).ongoing_tokens, 0);
    EXPECT_EQ(core->instance(i).pending_prefill_tokens, 0);
  }
  // A lease on an instance removed meanwhile gives nothing to the slot's next instance.
  RequestRoute r;
  prepare(r, prompt);
  ASSERT_TRUE(core->decide(r, 0));
  int slot = r.instance();
  core->removeInstance(slot);
  core->addInstance(slot, "new", false, true);
  r.endAttempt();
  EXPECT_EQ(core->instance(slot).running, 0);
  EXPECT_EQ(core->instance(slot).id, "new");
}

TEST(RoutingCoreTest, PredictionIsCappedAtTheFullBlocksOfPromptMinusOne) {
  auto core = coreFor(configFor("{kind: hybrid}", 1));
  auto prompt = tokens(64);  // four full blocks
  RequestRoute first;
  prepare(first, prompt);
  ASSERT_TRUE(core->decide(first, 0));
  core->predict(first, 0);
  first.endAttempt();
  RequestRoute again;
  prepare(again, prompt);
  ASSERT_TRUE(core->decide(again, 1));
  // All 64 tokens match, but an engine computes the last one: 3 full blocks.
  EXPECT_EQ(again.predictedCachedTokens(), 48);
  EXPECT_EQ(core->instance(0).pending_prefill_tokens, 16);
  // Text prompts (approximate): the estimate caps the same way.
  RequestRoute text;
  text.hashes = policy::hashTextBlocks(std::string(1000, 'x'), 64);
  text.hashes_complete = true;
  text.exact = false;
  text.prompt_tokens = 250;
  ASSERT_TRUE(core->decide(text, 2));
  core->predict(text, 2);
  text.endAttempt();
  ASSERT_TRUE(core->decide(text, 3));
  EXPECT_EQ(text.predictedCachedTokens(), 240);  // 15 blocks of 16, not 249
}

TEST(RoutingCoreTest, LargeClusterRecordsTheChosenAndTheBestScores) {
  // 40 instances, least_request: e5 carries no load, the others 1..39 requests each except e39
  // (the chosen one is whichever scores lowest; the record must hold it and the 15 best others).
  auto core = coreFor(configFor("{kind: least_request}", 40));
  std::vector<std::unique_ptr<RequestRoute>> load;
  for (int i = 0; i < 60; ++i) {
    auto r = std::make_unique<RequestRoute>();
    prepare(*r, tokens(32, 5000 + 100 * i));
    ASSERT_TRUE(core->decide(*r, 0));
    load.push_back(std::move(r));
  }
  RequestRoute r;
  prepare(r, tokens(32));
  ASSERT_TRUE(core->decide(r, 1));
  DecisionRecord record;
  core->fillRecord(r, &record);
  ASSERT_EQ(record.scores.size(), DecisionRecord::kMaxScores);
  EXPECT_EQ(record.scores_omitted, 40 - static_cast<int64_t>(DecisionRecord::kMaxScores));
  bool has_chosen = false;
  double worst_kept = -1;
  for (const auto& [id, score] : record.scores) {
    has_chosen |= id == record.instance;
    worst_kept = std::max(worst_kept, score);
  }
  EXPECT_TRUE(has_chosen);
  // Nothing omitted scores lower than the worst score kept.
  int lower_elsewhere = 0;
  for (int i = 0; i < 40; ++i) {
    if (r.decision().scores[static_cast<size_t>(i)] < worst_kept) ++lower_elsewhere;
  }
  EXPECT_LE(lower_elsewhere, static_cast<int>(DecisionRecord::kMaxScores) - 1);
  // A small cluster still records every instance.
  auto small = coreFor(configFor("{kind: least_request}", 3));
  RequestRoute s;
  prepare(s, tokens(32));
  ASSERT_TRUE(small->decide(s, 0));
  DecisionRecord small_record;
  small->fillRecord(s, &small_record);
  EXPECT_EQ(small_record.scores.size(), 3u);
  EXPECT_EQ(small_record.scores_omitted, 0);
}

TEST(RoutingCoreTest, FailedAttemptsAreExcludedAndOpenTheCircuit) {
  auto core = coreFor(configFor("{kind: round_robin}"));
  RequestRoute r;
  auto prompt = tokens(40);
  prepare(r, prompt);
  ASSERT_TRUE(core->decide(r, 0));
  EXPECT_EQ(r.instance(), 0);
  EXPECT_FALSE(core->upstreamFailure(0, 0));
  r.exclude();
  ASSERT_TRUE(core->decide(r, 0));
  EXPECT_EQ(r.attempt(), 2);
  EXPECT_EQ(r.excluded(), policy::HolderSet{0});
  EXPECT_EQ(r.instance(), 1);
  EXPECT_TRUE(std::isnan(r.decision().scores[0]));  // excluded: not eligible
  DecisionRecord record;
  core->fillRecord(r, &record);
  EXPECT_EQ(record.excluded, std::vector<std::string>{"e0"});
  EXPECT_EQ(record.instance, "e1");
  EXPECT_EQ(record.attempt, 2);
  // The second consecutive failure opens e0's circuit for 10 s; then half-open.
  EXPECT_TRUE(core->upstreamFailure(0, 5));
  EXPECT_FALSE(core->admitted(0, 5));
  EXPECT_FALSE(core->reachable(0, 5));
  EXPECT_TRUE(core->admitted(0, 5 + 10 * kNanosPerSecond));
  EXPECT_TRUE(core->upstreamFailure(0, 5 + 10 * kNanosPerSecond));  // one more reopens it
  core->upstreamSuccess(0);
  EXPECT_EQ(core->instance(0).request_failures, 0);
}

TEST(RoutingCoreTest, HealthChecksEjectAndReadmitAndDrainKeepsPeersReachable) {
  auto core = coreFor(configFor("{kind: hybrid}"));
  using Change = RoutingCore::HealthChange;
  EXPECT_EQ(core->healthCheck(1, false), Change::kNone);
  EXPECT_EQ(core->healthCheck(1, false), Change::kEjected);
  EXPECT_FALSE(core->admitted(1, 0));
  EXPECT_EQ(core->healthCheck(1, true), Change::kReadmitted);
  EXPECT_TRUE(core->admitted(1, 0));
  core->setDraining(2, true);
  EXPECT_FALSE(core->admitted(2, 0));
  EXPECT_TRUE(core->reachable(2, 0));
  core->reportEngineLoad(2, 7, std::nullopt);
  EXPECT_EQ(core->instance(2).waiting, 7);
  EXPECT_EQ(core->instance(2).kv_usage, 0);
}

// A removed instance leaves a hole: the others keep their slots (a session pinned to slot 2
// stays pinned to the same instance) and the hole is never chosen.
TEST(RoutingCoreTest, RemovedInstancesLeaveStableSlots) {
  auto core = coreFor(configFor("{kind: linear}"));
  auto prompt = tokens(40);
  RequestRoute r;
  prepare(r, prompt, 8, "s");
  ASSERT_TRUE(core->decide(r, 0));
  int pinned = r.instance();
  r.endAttempt();
  core->removeInstance(pinned == 0 ? 1 : 0);
  EXPECT_EQ(core->slotEnd(), 3);
  ASSERT_TRUE(core->decide(r, 1));
  EXPECT_EQ(r.instance(), pinned);
  EXPECT_EQ(r.decision().reason, "session_affinity");
  DecisionRecord record;
  core->fillRecord(r, &record);
  EXPECT_EQ(record.scores.size(), 2u);  // the present instances only
  core->removeInstance(2);
  EXPECT_EQ(core->slotEnd(), pinned == 0 ? 1 : 2);
}

TEST(RoutingCoreTest, OffloadHoldsThePeerAndThePolicysSlotUntilReleased) {
  auto core = coreFor(configFor("{kind: elastic, elastic: {max_concurrent_offloads: 1}}"),
                      /*push_capable=*/true);
  auto prompt = tokens(30000);
  RequestRoute r;
  prepare(r, prompt);
  ASSERT_TRUE(core->decide(r, 0));
  ASSERT_EQ(r.decision().mode, policy::Mode::kPrefillOffload);
  int d = r.instance(), p = r.peer();
  EXPECT_EQ(r.predictedCachedTokens(), 29984);  // every full block of prompt - 1, from P
  EXPECT_EQ(core->instance(d).pending_prefill_tokens, 16);
  EXPECT_EQ(core->instance(p).running, 1);
  EXPECT_EQ(core->instance(p).pending_prefill_tokens, 30000);
  EXPECT_EQ(core->policy().offloadsInFlight(), 1);
  // P failed: its load goes, D prefills what it holds not itself (all of it), and the cap is
  // given back once.
  r.endPeerLoad();
  r.peerFailed("error");
  EXPECT_EQ(core->instance(p).running, 0);
  EXPECT_EQ(core->instance(d).pending_prefill_tokens, 30000);
  EXPECT_EQ(r.predictedCachedTokens(), 0);
  EXPECT_EQ(r.offloadOutcome(), "error");
  r.releaseOffload();
  r.releaseOffload();
  EXPECT_EQ(core->policy().offloadsInFlight(), 0);
  // A route that goes away mid-offload gives the cap back too.
  {
    RequestRoute other;
    prepare(other, prompt);
    ASSERT_TRUE(core->decide(other, 1));
    EXPECT_EQ(core->policy().offloadsInFlight(), 1);
  }
  EXPECT_EQ(core->policy().offloadsInFlight(), 0);
}

// A migration from a holder in vLLM's NIXL dialect: its first leg is a request on the holder
// (running, and the prompt tokens it lacks as pending prefill) until the leg's answer, and D
// then reads every full block, so D's lease counts only what no block covers.
TEST(RoutingCoreTest, NixlMigrationLeasesTheHoldersLeg) {
  auto core = coreFor(configFor("{kind: unified}"), /*push_capable=*/true);
  auto turn1 = tokens(25000);
  RequestRoute first;
  prepare(first, turn1);
  ASSERT_TRUE(core->decide(first, 0));
  const int holder = first.instance();
  core->predict(first, 0);
  first.endAttempt();
  core->setDraining(holder, true);
  core->setNixl(holder, true);
  auto turn2 = tokens(28000);
  RequestRoute r;
  prepare(r, turn2);
  ASSERT_TRUE(core->decide(r, 1));
  ASSERT_EQ(r.decision().mode, policy::Mode::kPushMigrate);
  EXPECT_EQ(r.decision().reason, "nixl_pull");
  ASSERT_EQ(r.peer(), holder);
  EXPECT_EQ(core->instance(holder).running, 1);
  EXPECT_EQ(core->instance(holder).pending_prefill_tokens, 28000 - 24992);  // 1562 blocks held
  EXPECT_EQ(r.predictedCachedTokens(), 27984);  // every full block of prompt - 1
  EXPECT_EQ(core->instance(r.instance()).pending_prefill_tokens, 16);
  // The leg answered: C's load goes; D keeps its own.
  r.endPeerLoad();
  EXPECT_EQ(core->instance(holder).running, 0);
  EXPECT_EQ(core->instance(holder).pending_prefill_tokens, 0);
  EXPECT_EQ(core->instance(r.instance()).running, 1);
  // The same holder in kvfabric's dialect pushes with no load of its own.
  core->setNixl(holder, false);
  RequestRoute pushed;
  prepare(pushed, turn2);
  ASSERT_TRUE(core->decide(pushed, 2));
  ASSERT_EQ(pushed.decision().reason, "push_migrate");
  EXPECT_EQ(core->instance(holder).running, 0);
  EXPECT_EQ(pushed.predictedCachedTokens(), 24992);
}

// A policy defined here, outside the built-in list, registered in a registry of its own: its
// block parsed from the router YAML (unknown keys refused, bad values named by path), created
// by the core, and deciding.
struct LowestIndexParams final : policy::PolicyParams {
  int skip = 0;
};

class LowestIndexPolicy final : public policy::Policy {
 public:
  explicit LowestIndexPolicy(const policy::PolicyConfig& c)
      : classify_(c.classify), skip_(c.params<LowestIndexParams>("lowest_index").skip) {}
  std::string_view name() const override { return "lowest_index"; }
  policy::Decision decide(const policy::RouteRequest& r,
                          std::span<const policy::InstanceSnapshot> inst, Nanos) override {
    int chosen = -1;
    int skipped = 0;
    for (size_t i = 0; i < inst.size() && chosen < 0; ++i) {
      if (inst[i].healthy && skipped++ >= skip_) chosen = static_cast<int>(i);
    }
    return policy::support::finish(r, inst, chosen, "lowest_index",
                                   std::vector<double>(inst.size(), 0.0), classify_);
  }

 private:
  policy::ClassifyConfig classify_;
  int skip_;
};

const policy::PolicyDefinition kLowestIndex{
    "lowest_index",
    [](config::ConfigMap& block) -> std::shared_ptr<const policy::PolicyParams> {
      auto p = std::make_shared<LowestIndexParams>();
      block.get("skip", &p->skip, 0, 63);
      return p;
    },
    [](const policy::PolicyConfig& c) -> std::unique_ptr<policy::Policy> {
      return std::make_unique<LowestIndexPolicy>(c);
    }};

TEST(RoutingCoreTest, APolicyRegisteredOutsideTheBuiltInsRunsEndToEnd) {
  policy::PolicyRegistry registry = policy::PolicyRegistry::builtin();
  ASSERT_TRUE(registry.add(kLowestIndex).ok());
  EXPECT_FALSE(registry.add(kLowestIndex).ok());  // one name, one policy
  // Unknown to the built-in registry.
  auto unknown = parseRouterConfig(
      "instances: [{id: e0, url: \"http://127.0.0.1:9000\"}]\npolicy: {kind: lowest_index}\n",
      "<test>");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(std::string(unknown.status().message()).find("policy.kind"), std::string::npos);
  // Bad values and unknown keys in its block are named by field path.
  auto bad = parseRouterConfig(
      "instances: [{id: e0, url: \"http://127.0.0.1:9000\"}]\n"
      "policy: {kind: lowest_index, lowest_index: {skip: 99, typo: 1}}\n",
      "<test>", registry);
  ASSERT_FALSE(bad.ok());
  std::string message(bad.status().message());
  EXPECT_NE(message.find("policy.lowest_index.skip"), std::string::npos) << message;
  EXPECT_NE(message.find("policy.lowest_index.typo"), std::string::npos) << message;

  RouterConfig config = configFor("{kind: lowest_index, lowest_index: {skip: 1}}", 3, registry);
  auto core = coreFor(config);
  EXPECT_EQ(core->policy().name(), "lowest_index");
  EXPECT_FALSE(core->policy().movesKv());
  RequestRoute r;
  auto prompt = tokens(40);
  prepare(r, prompt);
  ASSERT_TRUE(core->decide(r, 0));
  EXPECT_EQ(r.instance(), 1);  // the second admitted one
  EXPECT_EQ(r.decision().reason, "lowest_index");
  DecisionRecord record;
  core->fillRecord(r, &record);
  EXPECT_EQ(record.policy, "lowest_index");
}

}  // namespace
}  // namespace kvf::router
