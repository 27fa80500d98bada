#include "router/core/config.h"

#include <gtest/gtest.h>

#include "policy/unified.h"

namespace kvf::router {
namespace {

TEST(RouterConfigTest, ParsesFullConfig) {
  auto config = parseRouterConfig(R"(
listen: {host: 0.0.0.0, port: 9000}
instances:
  - id: e0
    url: http://127.0.0.1:8100
    kv_events: {endpoint: "tcp://127.0.0.1:5557", replay_endpoint: "tcp://127.0.0.1:5558"}
  - id: e1
    url: http://127.0.0.1:8101/
policy: {kind: lmetric}
index: {block_size: 32, predicted_ttl_s: 5, table_max_load: 0.5}
health: {interval_s: 0.5, unhealthy_threshold: 3}
upstream: {max_attempts: 2, circuit_failure_threshold: 4}
decision_log: /tmp/decisions.jsonl
admin: {token: secret}
)",
                                  "<test>");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->port, 9000);
  ASSERT_EQ(config->instances.size(), 2u);
  EXPECT_EQ(config->instances[0].host, "127.0.0.1");
  EXPECT_EQ(config->instances[0].port, 8100);
  EXPECT_EQ(config->instances[0].kv_events.topic, "");  // vLLM's default
  EXPECT_EQ(config->instances[0].kv_events.data_parallel_size, 1);
  EXPECT_EQ(config->instances[1].port, 8101);
  EXPECT_TRUE(config->instances[1].kv_events.endpoint.empty());
  EXPECT_EQ(config->policy.kind, "lmetric");
  EXPECT_EQ(config->index.block_size, 32u);
  EXPECT_EQ(config->index.predicted_ttl, 5 * kNanosPerSecond);
  EXPECT_EQ(config->index.table_max_load, 0.5);
  EXPECT_EQ(config->health.interval, kNanosPerSecond / 2);
  EXPECT_EQ(config->health.unhealthy_threshold, 3);
  EXPECT_EQ(config->max_attempts, 2);
  EXPECT_EQ(config->admin_token, "secret");
}

TEST(RouterConfigTest, ReportsEveryProblemWithItsPath) {
  auto config = parseRouterConfig(R"(
instances:
  - id: e0
    url: ftp://x:1
  - id: e0
    url: http://127.0.0.1:99999
    extra: 1
  - url: http://127.0.0.1:80
policy: {kind: nope}
index: {table_max_load: 0.9}
upstream: {max_attempts: 0}
)",
                                  "<test>");
  ASSERT_FALSE(config.ok());
  std::string m(config.status().message());
  EXPECT_NE(m.find("instances[0].url"), std::string::npos) << m;
  EXPECT_NE(m.find("duplicate instance id"), std::string::npos) << m;
  EXPECT_NE(m.find("invalid port"), std::string::npos) << m;
  EXPECT_NE(m.find("instances[1].extra"), std::string::npos) << m;
  EXPECT_NE(m.find("index.table_max_load"), std::string::npos) << m;
  EXPECT_NE(m.find("instances[2].id"), std::string::npos) << m;
  EXPECT_NE(m.find("policy.kind"), std::string::npos) << m;
  EXPECT_NE(m.find("upstream.max_attempts"), std::string::npos) << m;
}

TEST(RouterConfigTest, RequiresInstances) {
  auto config = parseRouterConfig("policy: {kind: hybrid}\n", "<test>");
  ASSERT_FALSE(config.ok());
  EXPECT_NE(std::string(config.status().message()).find("instances"), std::string::npos);
}

}  // namespace
TEST(RouterConfigTest, MembershipFromEtcd) {
  auto config = parseRouterConfig(R"(
membership:
  source: etcd
  etcd: {endpoints: ["http://10.0.0.1:2379", "http://10.0.0.2:2379"], probe_interval_s: 0.5}
)",
                                  "<test>");
  ASSERT_TRUE(config.ok()) << config.status();  // no static instances needed
  EXPECT_EQ(config->membership, MembershipSource::kEtcd);
  EXPECT_EQ(config->etcd.endpoints.size(), 2u);
  EXPECT_EQ(config->etcd.prefix, "/kvfabric/instances/");
  EXPECT_EQ(config->etcd.probe_interval_s, 0.5);
  EXPECT_TRUE(config->instances.empty());

  auto defaults = parseRouterConfig("instances: []\n", "<test>");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->membership, MembershipSource::kStatic);

  auto bad = parseRouterConfig(R"(
membership:
  source: consul
  etcd: {endpoints: ["https://e:2379"], prefix: "", lease_ttl_s: 5}
)",
                               "<test>");
  ASSERT_FALSE(bad.ok());
  std::string message(bad.status().message());
  EXPECT_NE(message.find("membership.source"), std::string::npos) << message;
  EXPECT_NE(message.find("membership.etcd.endpoints"), std::string::npos) << message;
  EXPECT_NE(message.find("membership.etcd.prefix"), std::string::npos) << message;
  // lease_ttl_s belongs to registrants, not to the router.
  EXPECT_NE(message.find("membership.etcd.lease_ttl_s"), std::string::npos) << message;

  auto missing = parseRouterConfig("membership: {source: etcd}\n", "<test>");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(std::string(missing.status().message()).find("membership.etcd"), std::string::npos);
}

TEST(RouterConfigTest, WorkerUrlAndMigrationPolicies) {
  auto config = parseRouterConfig(R"(
instances:
  - {id: a, url: "http://127.0.0.1:8100", worker_url: "http://127.0.0.1:9100/"}
  - {id: b, url: "http://127.0.0.1:8101"}
policy: {kind: unified, unified: {link_bandwidth_gbps: 100}}
)",
                                  "<test>");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->instances[0].worker_url, "http://127.0.0.1:9100");
  EXPECT_EQ(config->instances[1].worker_url, "");
  EXPECT_EQ(config->policy.kind, "unified");
  EXPECT_DOUBLE_EQ(config->policy.params<policy::UnifiedParams>("unified").link_bandwidth_gbps,
                   100);
  auto bad = parseRouterConfig(
      "instances:\n  - {id: a, url: \"http://127.0.0.1:1\", worker_url: \"tcp://x\"}\n", "<test>");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("instances[0].worker_url"), std::string::npos)
      << bad.status();
}

TEST(RouterConfigTest, BusyPollWindow) {
  constexpr std::string_view kInstances = "instances: [{id: e0, url: \"http://127.0.0.1:8100\"}]\n";
  auto plain = parseRouterConfig(kInstances, "<test>");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->busy_poll, 0);  // off unless asked for
  auto set = parseRouterConfig(std::string(kInstances) + "io: {busy_poll_us: 250}\n", "<test>");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->busy_poll, 250 * 1000);
  for (std::string_view bad : {"io: {busy_poll_us: -1}\n", "io: {busy_poll_us: 200000}\n",
                               "io: {busy_poll_us: 5, spin: true}\n"}) {
    auto r = parseRouterConfig(std::string(kInstances) + std::string(bad), "<test>");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(std::string(r.status().message()).find("io."), std::string::npos)
        << r.status().message();
  }
}

}  // namespace kvf::router

namespace kvf::router {
namespace {

// vLLM's data-parallel ranks publish on port + rank; LoRA adapters, capacity and the
// KV-event limits are read and checked.
TEST(RouterConfigTest, VllmEventOptions) {
  auto config = parseRouterConfig(R"(
lora_adapters: [sql-lora, chat-lora]
kv_events: {max_message_bytes: 1048576, silent_after_s: 5}
requests: {default_max_tokens: 256, max_tokens_limit: 4096, max_model_len: 32768}
instances:
  - id: e0
    url: http://127.0.0.1:8100
    kv_capacity_blocks: 17618
    kv_events: {endpoint: "tcp://10.0.0.5:5557", replay_endpoint: "tcp://10.0.0.5:5567",
                data_parallel_size: 4, topic: "kv@pod"}
)",
                                  "<test>");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->lora_adapters, (std::vector<std::string>{"sql-lora", "chat-lora"}));
  EXPECT_EQ(config->max_kv_event_bytes, 1048576u);
  EXPECT_EQ(config->kv_events_silent_after, 5 * kNanosPerSecond);
  EXPECT_EQ(config->default_max_tokens, 256);
  EXPECT_EQ(config->max_tokens_limit, 4096);
  EXPECT_EQ(config->max_model_len, 32768);
  EXPECT_EQ(config->instances[0].kv_capacity_blocks, 17618u);
  EXPECT_EQ(config->instances[0].kv_events.data_parallel_size, 4);
  EXPECT_EQ(rankEndpoint("tcp://10.0.0.5:5557", 0), "tcp://10.0.0.5:5557");
  EXPECT_EQ(rankEndpoint("tcp://10.0.0.5:5557", 3), "tcp://10.0.0.5:5560");
  EXPECT_EQ(rankEndpoint("tcp://[::1]:5567", 1), "tcp://[::1]:5568");

  auto bad = parseRouterConfig(R"(
instances:
  - id: e0
    url: http://127.0.0.1:8100
    kv_events: {endpoint: "ipc:///tmp/kv", data_parallel_size: 2}
)",
                               "<test>");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("data_parallel_size"), std::string::npos)
      << bad.status();
}

}  // namespace
TEST(RouterConfigTest, StallTimeoutMustExceedTheHealthInterval) {
  auto config = parseRouterConfig(
      "instances: [{id: a, url: \"http://127.0.0.1:1\"}]\nhealth: {interval_s: 2}\nupstream: "
      "{stall_timeout_s: 1}\n",
      "<test>");
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("stall_timeout_s"), std::string::npos);
  auto unset = parseRouterConfig(
      "instances: [{id: a, url: \"http://127.0.0.1:1\"}]\nhealth: {interval_s: 4}\n", "<test>");
  ASSERT_TRUE(unset.ok()) << unset.status();
  EXPECT_EQ(unset->stall_timeout, 12 * kNanosPerSecond);  // three health intervals
}

}  // namespace kvf::router
