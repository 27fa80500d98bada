// Router replicas under a replica's death: two kvf-engine processes behind three kvf-router
// replicas that exchange their in-flight load over ZMQ (replicas: in the router config), and
// client coroutines that round-robin their requests across the replicas, skipping one that
// refused a connection (client-side round robin). While the load runs, kill -9 of one replica.
// Asserted: the replicas saw each other's load before the kill; only requests in flight on the
// killed replica fail (at most as many as were in flight on it at the kill); the survivors
// serve on with no error; and each survivor drops the dead peer, with its load, within
// peer_timeout (plus scheduling slack) of the kill.
#include <gtest/gtest.h>

#include <signal.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include "common/http_client.h"
#include "common/json.h"
#include "common/strings.h"
#include "tests/testing/child_process.h"
#include "tests/testing/engine_cluster.h"
#include "tests/testing/http_call.h"
#include "tests/testing/io_thread.h"
#include "tests/testing/poll.h"
#include "tests/testing/temp_dir.h"

namespace kvf::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using SteadyTime = std::chrono::steady_clock;

constexpr int kReplicas = 3;
constexpr int kVictim = 2;
constexpr int kClients = 9;
constexpr auto kPeerTimeout = 600ms;
constexpr const char* kToken = "replica-token";

struct ReplicaStats {
  std::atomic<int64_t> in_flight{0}, ok{0}, failed{0};
  // Requests on the victim that failed and had started before the kill.
  std::atomic<int64_t> failed_in_flight_at_kill{0};
};

class ReplicaFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    source_ = envOr("KVF_SOURCE_DIR", fs::current_path().string());
    bin_ = envOr("KVF_BIN_DIR", source_ + "/build/bin");
    dir_ = freshTempDir("kvf_replicas");
    setenv("KVF_WORKER_TOKEN", kToken, 1);  // the key of the replicas' messages
    io_ = std::make_unique<IoThread>();
  }
  void TearDown() override {
    stop_load_ = true;
    eventually([&] { return running_clients_ == 0; }, 30s, 20ms);
    routers_.clear();
    cluster_.reset();
    io_.reset();
  }

  static std::string replicasYaml(int r, const std::vector<uint16_t>& ports) {
    std::vector<std::string> peers;
    for (int p = 0; p < kReplicas; ++p) {
      if (p != r) peers.push_back(strCat("'tcp://127.0.0.1:", ports[static_cast<size_t>(p)], "'"));
    }
    return strCat("replicas: {id: r", r,
                  ", publish: 'tcp://127.0.0.1:", ports[static_cast<size_t>(r)], "', peers: [",
                  strJoin(peers, ", "),
                  "], sync_interval_ms: 5, snapshot_interval_ms: 100, peer_timeout_ms: ",
                  kPeerTimeout.count(), "}\n");
  }

  // Two engines (KV events on) and replica r0 from EngineCluster; r1 and r2 from the same
  // router config with their own replicas: block.
  void startCluster() {
    std::vector<uint16_t> ports;
    for (int r = 0; r < kReplicas; ++r) ports.push_back(*pickFreePort());
    EngineClusterOptions o;
    o.engines = 2;
    o.engine_yaml = "time_scale: 1\nmax_model_len: 32768\n";
    o.policy_yaml = "{kind: lmetric}";
    o.router_yaml = "health: {interval_s: 0.2}\n" + replicasYaml(0, ports);
    cluster_ = std::make_unique<EngineCluster>(dir_, source_, bin_);
    cluster_->start(std::move(o));
    router_ports_.push_back(cluster_->routerPort());
    std::ifstream in(dir_ / "router.yaml");
    const std::string base((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string own = replicasYaml(0, ports);
    ASSERT_NE(base.find(own), std::string::npos);
    for (int r = 1; r < kReplicas; ++r) {
      std::string yaml = base;
      yaml.replace(yaml.find(own), own.size(), replicasYaml(r, ports));
      const fs::path path = dir_ / strCat("router-r", r, ".yaml");
      std::ofstream(path) << yaml;
      auto router =
          startLogged({bin_ + "/kvf-router", "--config", path.string(), "--log_level", "warn"},
                      (dir_ / strCat("router-r", r, ".log")).string());
      ASSERT_TRUE(waitForLog(*router, "listening on port ", 20s)) << readLog(*router);
      router_ports_.push_back(routerPort(*router).value_or(0));
      routers_.push_back(std::move(router));
    }
    for (uint16_t port : router_ports_) {
      admin_.push_back(http::HttpClient::create(io_->executor(), "127.0.0.1", port));
    }
  }

  // Replica r's view of its peers: id -> running requests it counts for that peer.
  std::map<std::string, int64_t> peers(int r) {
    http::Headers h{{"Authorization", "Bearer " + cluster_->adminToken()}};
    auto response =
        httpCall(*io_, *admin_[static_cast<size_t>(r)], "GET", "/admin/replicas", "", std::move(h));
    std::map<std::string, int64_t> out;
    if (!response.ok() || response->status != 200) return out;
    auto obj = json::parseObject(response->body);
    if (!obj.ok()) return out;
    for (const auto& p : obj->at("peers").as_array()) {
      const auto& peer = p.as_object();
      out[std::string(peer.at("id").as_string())] = peer.at("running").as_int64();
    }
    return out;
  }

  std::string body(int64_t n) const {
    std::vector<int> t(512);
    std::iota(t.begin(), t.end(), 1000 + static_cast<int>(n % 4) * 3000);
    for (int i = 0; i < 64; ++i) t.push_back(20000 + static_cast<int>((n * 7919 + i) % 120000));
    return strCat("{\"model\":\"test-model\",\"max_tokens\":", 24 + n % 16,
                  ",\"ignore_eos\":true,\"prompt\":[", strJoin(t, ","), "]}");
  }

  // Client k sends request i to replica (k + i) mod N, skipping replicas it found dead: a
  // refused connection marks one dead and the request goes to the next (it never reached a
  // router, so it is not a failure).
  asio::awaitable<void> clientLoop(int k) {
    std::vector<std::shared_ptr<http::HttpClient>> clients;
    for (uint16_t port : router_ports_) {
      clients.push_back(http::HttpClient::create(io_->executor(), "127.0.0.1", port));
    }
    for (int64_t i = 0; !stop_load_; ++i) {
      int r = static_cast<int>((k + i) % kReplicas);
      while (dead_[static_cast<size_t>(r)]) r = (r + 1) % kReplicas;
      ReplicaStats& s = stats_[static_cast<size_t>(r)];
      ++s.in_flight;
      http::ClientRequest request;
      request.method = "POST";
      request.target = "/v1/completions";
      request.body = body(i * kClients + k);
      request.read_timeout = 30s;
      auto response = co_await clients[static_cast<size_t>(r)]->request(request);
      --s.in_flight;
      if (response.ok() && response->status == 200) {
        ++s.ok;
        continue;
      }
      if (!response.ok() && killed_ && r == kVictim) {
        // Refused: it never reached the replica, and goes to the next one. Otherwise it was in
        // flight on the replica when it died.
        dead_[static_cast<size_t>(r)] = true;
        if (response.status().message().find("connecting to") == std::string_view::npos) {
          ++s.failed_in_flight_at_kill;
        }
        continue;
      }
      ++s.failed;
      ADD_FAILURE() << "replica r" << r << ": "
                    << (response.ok() ? strCat("status ", response->status, " ", response->body)
                                      : response.status().ToString());
    }
    --running_clients_;
  }

  std::string source_, bin_;
  fs::path dir_;
  std::unique_ptr<IoThread> io_;
  std::unique_ptr<EngineCluster> cluster_;
  std::vector<std::unique_ptr<Process>> routers_;  // r1, r2 (r0 is the cluster's)
  std::vector<uint16_t> router_ports_;
  std::vector<std::shared_ptr<http::HttpClient>> admin_;
  std::array<ReplicaStats, kReplicas> stats_;
  std::array<std::atomic<bool>, kReplicas> dead_{};
  std::atomic<bool> killed_{false}, stop_load_{false};
  std::atomic<int> running_clients_{0};
};

TEST_F(ReplicaFaultTest, KillingAReplicaFailsOnlyItsInFlightRequests) {
  ASSERT_NO_FATAL_FAILURE(startCluster());
  // Each replica hears both peers.
  for (int r = 0; r < kReplicas; ++r) {
    ASSERT_TRUE(eventually([&] { return peers(r).size() == kReplicas - 1; }, 10s)) << "r" << r;
  }
  running_clients_ = kClients;
  for (int k = 0; k < kClients; ++k) asio::co_spawn(io_->context(), clientLoop(k), asio::detached);

  // The survivors count the victim's in-flight requests (its deltas arrive).
  for (int r = 0; r < kReplicas; ++r) {
    if (r == kVictim) continue;
    ASSERT_TRUE(eventually([&] { return peers(r)["r2"] > 0; }, 20s, 5ms))
        << "r" << r << " never saw r2's load";
  }
  ASSERT_TRUE(eventually([&] { return stats_[kVictim].ok > 5 && stats_[0].ok > 5; }, 30s));

  // On the io thread, so no client starts a request between the count and the kill.
  const pid_t victim = routers_[kVictim - 1]->pid();
  const int64_t in_flight_at_kill = io_->run([&]() -> asio::awaitable<int64_t> {
    killed_ = true;
    ::kill(victim, SIGKILL);
    co_return stats_[kVictim].in_flight.load();
  });
  const auto kill_time = SteadyTime::now();
  routers_[kVictim - 1]->kill();  // reaps it

  // Each survivor drops r2 and its load within peer_timeout (+ slack for a loaded machine).
  for (int r = 0; r < kReplicas; ++r) {
    if (r == kVictim) continue;
    ASSERT_TRUE(eventually([&] { return !peers(r).contains("r2"); }, 10s)) << "r" << r;
    const auto dropped_after = SteadyTime::now() - kill_time;
    EXPECT_LT(dropped_after, kPeerTimeout + 4s) << "r" << r;
    EXPECT_EQ(peers(r).size(), 1u) << "r" << r << " lost its live peer";
  }

  // The survivors keep serving.
  const int64_t ok0 = stats_[0].ok, ok1 = stats_[1].ok;
  ASSERT_TRUE(eventually([&] { return stats_[0].ok > ok0 + 10 && stats_[1].ok > ok1 + 10; }, 30s));
  stop_load_ = true;
  ASSERT_TRUE(eventually([&] { return running_clients_ == 0; }, 30s));

  EXPECT_EQ(stats_[0].failed, 0);
  EXPECT_EQ(stats_[1].failed, 0);
  EXPECT_EQ(stats_[kVictim].failed, 0);  // nothing failed on it but what was in flight
  EXPECT_LE(stats_[kVictim].failed_in_flight_at_kill, in_flight_at_kill);
  EXPECT_TRUE(dead_[kVictim]);
  std::printf("in flight on r2 at the kill: %lld, failed: %lld\n",
              static_cast<long long>(in_flight_at_kill),
              static_cast<long long>(stats_[kVictim].failed_in_flight_at_kill.load()));
}

}  // namespace
}  // namespace kvf::testing
