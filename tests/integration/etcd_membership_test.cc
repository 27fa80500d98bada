// Membership in etcd end to end, every piece a process on loopback: Debian's etcd, kvf-router
// with `membership: {source: etcd}`, kvf-engine registering itself, and kvf-fake-engine behind
// the kvf-register sidecar. Registered instances are admitted after a health check and serve;
// a registrant killed with -9 disappears within its TTL (with its index entries), a SIGTERM
// revokes at once; an etcd restart loses nothing and picks up what changed meanwhile; an
// unreachable etcd freezes the membership and the metrics say so.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <thread>

#include "common/http_client.h"
#include "common/json.h"
#include "common/strings.h"
#include "membership/etcd_client.h"
#include "tests/testing/child_process.h"
#include "tests/testing/etcd_server.h"
#include "tests/testing/io_thread.h"
#include "tests/testing/poll.h"
#include "tests/testing/temp_dir.h"

namespace kvf {
namespace {

using namespace std::chrono_literals;
using testing::eventually;
using testing::readLog;
using testing::startLogged;
using testing::waitForLog;
namespace fs = std::filesystem;

constexpr int kTtl = 2;  // seconds: every lease in these tests

struct Fake {
  std::unique_ptr<Process> process;
  std::string port;
  std::string pub;
  std::unique_ptr<Process> registrant;  // its kvf-register, when started with one
};

class EtcdMembershipTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* bin = std::getenv("KVF_BIN_DIR");
    const char* src = std::getenv("KVF_SOURCE_DIR");
    ASSERT_NE(bin, nullptr) << "run through ctest (KVF_BIN_DIR)";
    ASSERT_NE(src, nullptr) << "run through ctest (KVF_SOURCE_DIR)";
    bin_ = bin;
    source_ = src;
    name_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    dir_ = testing::freshTempDir("etcd_membership_" + name_);
    etcd_ = std::make_unique<testing::EtcdServer>(name_);
    etcd_->start();
    membership::EtcdClientOptions options;
    options.endpoints = {etcd_->endpoint()};
    options.request_timeout = 1s;
    etcd_client_ = *membership::EtcdClient::create(io_.executor(), options);
    startRouter();
  }

  void TearDown() override {
    router_.reset();
    children_.clear();
  }

  void startRouter() {
    std::ofstream(dir_ / "router.yaml") << strCat(
        "listen: {port: 0}\nhealth: {interval_s: 0.2, timeout_s: 0.5}\nadmin: {token: adm}\n",
        "membership:\n  source: etcd\n  etcd: {endpoints: [\"", etcd_->endpoint(),
        "\"], probe_interval_s: 0.2, request_timeout_s: 0.5}\n");
    router_ = startLogged(
        {bin_ + "/kvf-router", "--config", (dir_ / "router.yaml").string(), "--port", "0"},
        (dir_ / "router.log").string());
    ASSERT_TRUE(waitForLog(*router_, "listening on port ", 20s)) << readLog(*router_);
    std::string log = readLog(*router_);
    size_t at = log.find("listening on port ") + std::string("listening on port ").size();
    router_http_ = http::HttpClient::create(io_.executor(), "127.0.0.1",
                                            static_cast<uint16_t>(std::stoi(log.substr(at))));
  }

  Fake startFake(const std::string& id) {
    Fake f;
    f.process = testing::startPiped({bin_ + "/../tests/kvf-fake-engine", "--id=" + id});
    std::string ready = f.process->readLine(10s).value_or("");
    auto field = [&](const std::string& key) {
      size_t pos = ready.find(key + "=");
      if (pos == std::string::npos) return std::string();
      size_t start = pos + key.size() + 1;
      return ready.substr(start, ready.find(' ', start) - start);
    };
    f.port = field("port");
    f.pub = field("pub");
    EXPECT_FALSE(f.port.empty()) << "fake engine did not start: " << ready;
    return f;
  }

  Fake startRegisteredFake(const std::string& id) {
    Fake f = startFake(id);
    f.registrant = startRegister(id, f.port, f.pub);
    return f;
  }

  std::unique_ptr<Process> startRegister(const std::string& id, const std::string& port,
                                         const std::string& pub,
                                         std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {bin_ + "/kvf-register",
                                     "--etcd_endpoints=" + etcd_->endpoint(),
                                     "--id=" + id,
                                     "--url=http://127.0.0.1:" + port,
                                     "--lease_ttl_s=" + std::to_string(kTtl),
                                     "--request_timeout_s=0.5",
                                     "--health_interval_s=0.2"};
    if (!pub.empty()) argv.push_back("--kv_events_endpoint=" + pub);
    argv.insert(argv.end(), extra.begin(), extra.end());
    return startLogged(argv, (dir_ / ("register-" + id + ".log")).string());
  }

  std::unique_ptr<Process> startEngine(const std::string& id) {
    std::ofstream(dir_ / "engine.yaml") << strCat(
        "port: 0\nprofile: ", source_, "/engine/profiles/qwen3-coder-30b-a3b-h20.yaml\n",
        "served_model_name: test-model\ntime_scale: 20\nmax_model_len: 32768\n",
        "cache: {block_size: 16, num_gpu_blocks: 2048}\n",
        "kv_events: {endpoint: 'tcp://127.0.0.1:*', replay_endpoint: 'tcp://127.0.0.1:*'}\n",
        "membership:\n  etcd: {endpoints: [\"", etcd_->endpoint(), "\"], lease_ttl_s: ", kTtl,
        ", request_timeout_s: 0.5}\n");
    auto engine = startLogged(
        {bin_ + "/kvf-engine", "--config", (dir_ / "engine.yaml").string(), "--instance_id", id},
        (dir_ / (id + ".log")).string());
    EXPECT_TRUE(waitForLog(*engine, "registered in etcd", 30s)) << readLog(*engine);
    return engine;
  }

  absl::StatusOr<http::Response> routerCall(std::string method, std::string target,
                                            std::string body = "") {
    http::ClientRequest r;
    r.method = std::move(method);
    r.target = std::move(target);
    r.body = std::move(body);
    r.headers.emplace_back("Authorization", "Bearer adm");
    r.read_timeout = 5s;
    return io_.run([&]() -> asio::awaitable<absl::StatusOr<http::Response>> {
      co_return co_await router_http_->request(r);
    });
  }

  // id -> admitted, as the router's admin API lists its instances.
  std::map<std::string, bool> instances() {
    std::map<std::string, bool> out;
    auto r = routerCall("GET", "/admin/instances");
    if (!r.ok() || r->status != 200) return out;
    auto obj = json::parseObject(r->body);
    if (!obj.ok()) return out;
    for (const auto& v : obj->at("instances").as_array()) {
      const auto& o = v.as_object();
      out[std::string(o.at("id").as_string())] = o.at("admitted").as_bool();
    }
    return out;
  }
  bool admitted(const std::string& id) {
    auto all = instances();
    return all.contains(id) && all[id];
  }
  bool listed(const std::string& id) { return instances().contains(id); }

  // The value of an unlabelled sample in the router's /metrics; NaN when absent.
  double metric(const std::string& name) {
    auto r = routerCall("GET", "/metrics");
    if (!r.ok()) return std::nan("");
    std::string_view text = r->body;
    std::string prefix = "\n" + name + " ";
    size_t at = text.find(prefix);
    if (at == std::string_view::npos) return std::nan("");
    size_t start = at + prefix.size();
    return std::stod(std::string(text.substr(start, text.find('\n', start) - start)));
  }

  int complete(int base) {
    std::vector<int> tokens(256);
    std::iota(tokens.begin(), tokens.end(), base);
    auto r = routerCall(
        "POST", "/v1/completions",
        strCat(R"({"model":"test-model","max_tokens":4,"prompt":[)", strJoin(tokens, ","), "]}"));
    return r.ok() ? r->status : -1;
  }

  std::optional<std::string> etcdValue(const std::string& key) {
    auto r = io_.run([&]() -> asio::awaitable<absl::StatusOr<membership::RangeResult>> {
      co_return co_await etcd_client_->range(key, "", 0, 0);
    });
    if (!r.ok() || r->kvs.empty()) return std::nullopt;
    return r->kvs[0].value;
  }

  std::string bin_, source_, name_;
  fs::path dir_;
  testing::IoThread io_;
  std::unique_ptr<testing::EtcdServer> etcd_;
  std::shared_ptr<membership::EtcdClient> etcd_client_;
  std::unique_ptr<Process> router_;
  std::shared_ptr<http::HttpClient> router_http_;
  std::vector<std::unique_ptr<Process>> children_;
};

TEST_F(EtcdMembershipTest, RegisteredInstancesAreAdmittedAfterAHealthCheckAndServe) {
  // The emulated engine registers itself; a fake engine registers through the sidecar once its
  // /health answers.
  children_.push_back(startEngine("engine-a"));
  Fake fake = startRegisteredFake("fake-b");
  // A sidecar for an instance that never answers /health: never registered.
  auto dead_port = pickFreePort();
  ASSERT_TRUE(dead_port.ok());
  children_.push_back(startRegister("dead-c", std::to_string(*dead_port), ""));
  // Registered without waiting for health: listed by the router, but never admitted.
  children_.push_back(
      startRegister("dead-d", std::to_string(*dead_port), "", {"--wait_healthy=false"}));

  ASSERT_TRUE(eventually([&] { return admitted("engine-a") && admitted("fake-b"); }, 20s))
      << readLog(*router_);
  ASSERT_TRUE(eventually([&] { return listed("dead-d"); }, 10s));
  EXPECT_FALSE(admitted("dead-d"));
  EXPECT_FALSE(listed("dead-c"));
  EXPECT_FALSE(etcdValue("/kvfabric/instances/dead-c").has_value());

  // What the engine registered: its real port and connectable KV-event endpoints.
  auto value = etcdValue("/kvfabric/instances/engine-a");
  ASSERT_TRUE(value.has_value());
  auto record = json::parseObject(*value);
  ASSERT_TRUE(record.ok()) << *value;
  EXPECT_EQ(record->at("id"), "engine-a");
  std::string url(record->at("url").as_string());
  EXPECT_EQ(url,
            "http://127.0.0.1:" + testing::logValue(*children_[0], "kvf-engine ready", "port"));
  std::string events(record->at("kv_events").at("endpoint").as_string());
  EXPECT_TRUE(events.starts_with("tcp://127.0.0.1:")) << events;
  EXPECT_EQ(events.find('*'), std::string::npos) << events;

  for (int i = 0; i < 8; ++i) EXPECT_EQ(complete(i * 1000), 200);
  EXPECT_EQ(metric("kvfabric_router_membership_instances"), 3);
  EXPECT_EQ(metric("kvfabric_router_membership_etcd_up"), 1);
}

TEST_F(EtcdMembershipTest, AKilledRegistrantLeavesWithinItsTtlTogetherWithItsIndexEntries) {
  Fake fake = startRegisteredFake("fake-a");
  Fake other = startRegisteredFake("fake-b");
  ASSERT_TRUE(eventually([&] { return admitted("fake-a") && admitted("fake-b"); }, 20s));
  // Requests leave KV events behind: the index holds blocks of the instances.
  for (int i = 0; i < 8; ++i) ASSERT_EQ(complete(i * 1000), 200);
  ASSERT_TRUE(eventually([&] { return metric("kvfabric_router_index_blocks") > 0; }, 10s));

  // SIGTERM revokes the lease: gone at once, well before the TTL.
  auto t0 = std::chrono::steady_clock::now();
  other.registrant->stop(5s);
  ASSERT_TRUE(eventually([&] { return !listed("fake-b"); }, 10s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(kTtl));

  // kill -9: the lease runs out, the router drops the instance and its index entries.
  t0 = std::chrono::steady_clock::now();
  fake.registrant->kill();
  ASSERT_TRUE(listed("fake-a"));
  ASSERT_TRUE(eventually([&] { return !listed("fake-a"); }, std::chrono::seconds(kTtl + 10)));
  auto took = std::chrono::steady_clock::now() - t0;
  // etcd checks expiry every 500 ms and may grant up to the TTL again on the last refresh.
  EXPECT_LT(took, std::chrono::seconds(kTtl + 2)) << "lease expiry must remove the instance";
  EXPECT_EQ(metric("kvfabric_router_index_blocks"), 0);
  EXPECT_EQ(metric("kvfabric_router_membership_instances"), 0);
  EXPECT_EQ(complete(1), 503) << "no instance left";
  // The engine itself kept running: only its registration ended.
  EXPECT_TRUE(fake.process->running());
}

TEST_F(EtcdMembershipTest, AnEtcdRestartLosesNothingAndPicksUpWhatChanged) {
  Fake a = startRegisteredFake("fake-a");
  Fake b = startRegisteredFake("fake-b");
  ASSERT_TRUE(eventually([&] { return admitted("fake-a") && admitted("fake-b"); }, 20s));
  ASSERT_TRUE(eventually([&] { return metric("kvfabric_router_membership_etcd_up") == 1; }, 5s));

  etcd_->stop();
  ASSERT_TRUE(eventually([&] { return metric("kvfabric_router_membership_etcd_up") == 0; }, 5s));
  // While etcd is down: B's registrant dies, C's starts (and waits for etcd).
  b.registrant->kill();
  Fake c = startRegisteredFake("fake-c");
  std::this_thread::sleep_for(std::chrono::seconds(kTtl + 1));  // longer than any lease
  EXPECT_TRUE(admitted("fake-a") && admitted("fake-b")) << "nothing dropped while etcd is away";
  EXPECT_EQ(complete(7), 200);

  etcd_->start();
  ASSERT_TRUE(eventually([&] { return listed("fake-c"); }, 15s)) << readLog(*router_);
  ASSERT_TRUE(eventually([&] { return admitted("fake-c"); }, 10s));
  // B's lease runs out after the restart (etcd extends leases when it comes back).
  ASSERT_TRUE(eventually([&] { return !listed("fake-b"); }, std::chrono::seconds(kTtl + 10)));
  ASSERT_TRUE(eventually([&] { return metric("kvfabric_router_membership_etcd_up") == 1; }, 5s));
  EXPECT_TRUE(admitted("fake-a"));
  // A was never removed, even for a moment: exactly one removal (B) happened.
  auto r = routerCall("GET", "/metrics");
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->body.find("kvfabric_router_membership_changes_total{change=\"remove\"} 1\n"),
            std::string::npos)
      << r->body;
  EXPECT_EQ(complete(9), 200);
}

TEST_F(EtcdMembershipTest, AnUnreachableEtcdFreezesTheMembershipAndTheMetricsSaySo) {
  Fake a = startRegisteredFake("fake-a");
  ASSERT_TRUE(eventually([&] { return admitted("fake-a"); }, 20s));
  ASSERT_TRUE(eventually([&] { return metric("kvfabric_router_membership_etcd_up") == 1; }, 5s));
  EXPECT_LT(metric("kvfabric_router_membership_last_sync_age_seconds"), 2);

  etcd_->stop();
  ASSERT_TRUE(eventually([&] { return metric("kvfabric_router_membership_etcd_up") == 0; }, 5s));
  // Several lease lifetimes with etcd gone: the instance stays and serves.
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3 * kTtl);
  while (std::chrono::steady_clock::now() < until) {
    ASSERT_TRUE(admitted("fake-a"));
    ASSERT_EQ(complete(3), 200);
    std::this_thread::sleep_for(200ms);
  }
  EXPECT_EQ(metric("kvfabric_router_membership_etcd_up"), 0);
  EXPECT_GT(metric("kvfabric_router_membership_last_sync_age_seconds"), 3 * kTtl - 1);
  EXPECT_EQ(metric("kvfabric_router_membership_instances"), 1);
}

}  // namespace
}  // namespace kvf
