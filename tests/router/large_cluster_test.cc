// The router with policy::kMaxInstances (1,024) static instances: 1,023 that refuse connections
// and one fake engine in the last slot, far past the holder word. Health checks eject the dead
// ones; requests then go to the engine, its KV events land in the index under slot 1,023, and
// the next request is routed on its cached prefix. One more instance is refused, in YAML and
// through the admin API, with a message naming the limit.
#include "tests/router/router_fixture.h"

#include "policy/holder_set.h"

namespace kvf::router {
namespace {

using namespace std::chrono_literals;

class LargeClusterTest : public RouterFixture {};

// A loopback port with nothing listening: a connection attempt is refused at once.
std::string deadUrl() { return "http://127.0.0.1:1"; }

std::string deadInstancesYaml(int n) {
  std::string yaml;
  for (int i = 0; i < n; ++i) {
    yaml += "  - id: dead" + std::to_string(i) + "\n    url: " + deadUrl() + "\n";
  }
  return yaml;
}

TEST(LargeClusterConfigTest, AcceptsMaxInstancesAndNamesTheLimitPastIt) {
  const int max = policy::kMaxInstances;
  auto ok = parseRouterConfig("instances:\n" + deadInstancesYaml(max), "<test>");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->instances.size(), static_cast<size_t>(max));
  auto over = parseRouterConfig("instances:\n" + deadInstancesYaml(max + 1), "<test>");
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.status().message().find("instances: at most 1024 instances, got 1025"),
            std::string::npos)
      << over.status();
}

TEST_F(LargeClusterTest, RoutesToTheLastOf1024InstancesOnItsCachedPrefix) {
  const int max = policy::kMaxInstances;
  leading_instances_yaml_ = deadInstancesYaml(max - 1);
  start(1, "{kind: hybrid}", true,
        "health: {interval_s: 0.5, timeout_s: 0.5, unhealthy_threshold: 1}\n");
  auto state = instanceState("e0");
  ASSERT_FALSE(state.empty());
  EXPECT_EQ(state.at("slot").to_number<int64_t>(), max - 1);
  EXPECT_EQ(adminInstances().at("instances").as_array().size(), static_cast<size_t>(max));

  // Every dead instance ejected by its health checks.
  ASSERT_TRUE(eventually(
      [&] {
        int admitted = 0;
        const bj::object all = adminInstances();
        for (const auto& v : all.at("instances").as_array()) {
          admitted += v.as_object().at("admitted").as_bool();
        }
        return admitted == 1;
      },
      30s));
  waitSubscribed();

  auto first = call(post("/v1/completions", tokenPrompt(1, 256)));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->status, 200) << first->body;
  // The engine's BlockStored lands in the index under slot 1,023.
  ASSERT_TRUE(
      eventually([&] { return instanceState("e0").at("index_blocks").to_number<int64_t>() > 0; }));
  auto second = call(post("/v1/completions", tokenPrompt(1, 256)));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->status, 200) << second->body;
  ASSERT_TRUE(eventually([&] { return decisionLog().size() == 2; }));
  auto log = decisionLog();
  EXPECT_EQ(log[1].at("instance").as_string(), "e0");
  EXPECT_GE(log[1].at("predicted_cached_tokens").to_number<int64_t>(), 240);

  // A 1,025th instance is refused with the limit in the message; the router keeps serving.
  http::Headers auth = {{"Authorization", "Bearer s3cret"}};
  auto add = call(
      post("/admin/instances", R"({"id": "one-too-many", "url": ")" + deadUrl() + "\"}", auth));
  ASSERT_TRUE(add.ok()) << add.status();
  EXPECT_GE(add->status, 400);
  EXPECT_LT(add->status, 500);
  EXPECT_NE(add->body.find("at most 1024 instances"), std::string::npos) << add->body;
  auto third = call(post("/v1/completions", tokenPrompt(1, 256)));
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->status, 200);
}

}  // namespace
}  // namespace kvf::router
