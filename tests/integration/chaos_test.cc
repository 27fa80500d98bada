// The chaos test: four kvf-engine processes (worker servers on, so KV moves) behind kvf-router,
// under a steady client load of concurrent streaming and non-streaming requests that share
// prefixes (cache hits) and carry long new parts (the elastic policy offloads their prefill:
// a push from P to D per request). While the load runs: kill -9 of an engine and its restart,
// SIGSTOP/SIGCONT of another, the holder of an in-flight push killed (its pushes stall by a
// test-only knob so the kill lands between claim and write), and one engine's KV-event stream
// cut and restored (a TCP relay between the router and the publisher). Asserted: every request
// answers (complete, or a clean error) within kRequestDeadline; the killed engine is ejected
// within 2 s and re-admitted with an index of what the new process holds; no landed or cached
// block has content other than its hash's (the engines' own byte-for-byte checks and their
// /kv/audit); the router's index equals each engine's cached blocks once the load stops. A
// second test adds tc netem delay and loss on one engine's worker link, in a private network
// namespace, where root and the kernel allow it (else it is skipped with the reason).
#include <gtest/gtest.h>

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include "common/http_client.h"
#include "common/json.h"
#include "common/sse.h"
#include "common/strings.h"
#include "tests/testing/child_process.h"
#include "tests/testing/engine_cluster.h"
#include "tests/testing/http_call.h"
#include "tests/testing/io_thread.h"
#include "tests/testing/poll.h"
#include "tests/testing/tcp_relay.h"
#include "tests/testing/temp_dir.h"

namespace kvf::testing {
namespace {

namespace fs = std::filesystem;
namespace bj = boost::json;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kRequestDeadline = 30s;  // every client request answers within this
constexpr int kClients = 12;
constexpr int kPrefixFamilies = 6;
constexpr int kPrefixTokens = 2048;
constexpr const char* kToken = "chaos-token";

// The sum of every sample of `name` whose labels contain `label` ("" for any), in a Prometheus
// text exposition.
double metricSum(const std::string& text, const std::string& name, const std::string& label = "") {
  double sum = 0;
  size_t pos = 0;
  while ((pos = text.find(name, pos)) != std::string::npos) {
    size_t eol = text.find('\n', pos);
    std::string line = text.substr(pos, eol == std::string::npos ? eol : eol - pos);
    bool line_start = pos == 0 || text[pos - 1] == '\n';
    pos += name.size();
    if (!line_start ||
        (line.size() > name.size() && line[name.size()] != '{' && line[name.size()] != ' ')) {
      continue;
    }
    if (!label.empty() && line.find(label) == std::string::npos) continue;
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

// What the load saw; written on the io thread, read by the test thread.
struct LoadStats {
  std::atomic<int64_t> started{0}, finished{0}, ok{0}, clean_errors{0}, bad{0};
  std::atomic<int64_t> max_latency_ms{0};
  std::mutex mutex;
  std::vector<std::string> bad_samples;  // the first few, for the failure message

  void record(const std::string& outcome, Clock::time_point t0) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
    int64_t seen = max_latency_ms.load();
    while (ms > seen && !max_latency_ms.compare_exchange_weak(seen, ms)) {
    }
    if (outcome == "ok") {
      ++ok;
    } else if (outcome.starts_with("clean_error")) {
      ++clean_errors;
    } else {
      ++bad;
      std::lock_guard lock(mutex);
      if (bad_samples.size() < 8) bad_samples.push_back(outcome);
    }
    ++finished;
  }
  std::string badSamples() {
    std::lock_guard lock(mutex);
    return strJoin(bad_samples, "\n");
  }
};

// An OpenAI-style error body: {"error": {"message": "...", ...}}.
bool isErrorBody(std::string_view body) {
  auto obj = json::parseObject(body);
  if (!obj.ok()) return false;
  const auto* error = obj->if_contains("error");
  return error != nullptr && error->is_object() && error->as_object().contains("message") &&
         error->as_object().at("message").is_string();
}

class ChaosTest : public ::testing::Test {
 protected:
  void SetUp() override {
    source_ = envOr("KVF_SOURCE_DIR", fs::current_path().string());
    bin_ = envOr("KVF_BIN_DIR", source_ + "/build/bin");
    dir_ = freshTempDir("kvf_chaos");
    setenv("KVF_WORKER_TOKEN", kToken, 1);  // engines and router inherit it
    io_ = std::make_unique<IoThread>();
  }
  void TearDown() override {
    stopLoad();
    // The clients' pooled connections are sockets of io_'s context: they are closed on its
    // thread while it lives. Left to the fixture's destructor, after io_.reset(), each socket's
    // close wrote into the context's freed socket service (heap corruption at exit).
    if (io_) {
      io_->run([this]() -> asio::awaitable<void> {
        router_client_.reset();
        engine_clients_.clear();
        co_return;
      });
    }
    cluster_.reset();
    io_.reset();
  }

  // 4 engines, elastic policy (HEAVY prefills are offloaded: one push per request), stall
  // detection at 1 s, health checks every 0.2 s. `worker_extra[i]`: engine i's own worker keys.
  void startCluster(std::vector<std::string> worker_extra, TcpRelay* relay_for_e0 = nullptr) {
    EngineClusterOptions o;
    o.engines = 4;
    o.worker_extra = std::move(worker_extra);
    o.engine_yaml =
        "time_scale: 20\nmax_model_len: 32768\n"
        "cache: {block_size: 16, payload_bytes_per_block: 256, num_gpu_blocks: 8192}\n";
    o.policy_yaml =
        "{kind: elastic, classify: {warm_max_new_tokens: 100, medium_max_new_tokens: 1000}}";
    o.router_yaml =
        "health: {interval_s: 0.2, timeout_s: 0.3, unhealthy_threshold: 2}\n"
        "upstream: {stall_timeout_s: 1, max_attempts: 3}\n";
    if (relay_for_e0 != nullptr) {
      o.router_kv_endpoint = [relay_for_e0](int i, const std::string& own) {
        return i == 0 ? strCat("tcp://127.0.0.1:", relay_for_e0->port()) : own;
      };
    }
    cluster_ = std::make_unique<EngineCluster>(dir_, source_, bin_);
    cluster_->start(std::move(o));
    router_client_ = http::HttpClient::create(io_->executor(), "127.0.0.1", cluster_->routerPort());
    for (int i = 0; i < cluster_->size(); ++i) {
      engine_clients_.push_back(
          http::HttpClient::create(io_->executor(), "127.0.0.1", cluster_->ports(i).http));
    }
  }

  // ---- the load ----

  std::string requestBody(int64_t n, bool stream) const {
    const int family = static_cast<int>(n % kPrefixFamilies);
    const bool heavy = n % 3 == 0;  // 1200 new tokens: HEAVY, offloaded; else 64: a cache hit
    std::vector<int> t(kPrefixTokens);
    std::iota(t.begin(), t.end(), 1000 + family * 3000);
    const int suffix = heavy ? 1200 : 64;
    for (int i = 0; i < suffix; ++i) t.push_back(20000 + static_cast<int>((n * 7919 + i) % 120000));
    return strCat("{\"model\":\"test-model\",\"max_tokens\":", 4 + n % 12,
                  ",\"ignore_eos\":true,\"stream\":", stream ? "true" : "false", ",\"prompt\":[",
                  strJoin(t, ","), "]}");
  }

  // One request and its outcome: "ok", "clean_error: ..." or what was wrong with it.
  asio::awaitable<std::string> oneRequest(http::HttpClient& client, int64_t n) {
    const bool stream = n % 2 == 1;
    http::ClientRequest r;
    r.method = "POST";
    r.target = "/v1/completions";
    r.body = requestBody(n, stream);
    r.read_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(2 * kRequestDeadline);
    if (!stream) {
      auto response = co_await client.request(r);
      if (!response.ok()) co_return "transport: " + std::string(response.status().message());
      if (response->status == 200) {
        auto obj = json::parseObject(response->body);
        if (obj.ok() && obj->contains("choices")) co_return "ok";
        co_return "bad 200 body: " + response->body.substr(0, 200);
      }
      if (response->status >= 400 && isErrorBody(response->body)) {
        co_return strCat("clean_error: ", response->status);
      }
      co_return strCat("status ", response->status, " body ", response->body.substr(0, 200));
    }
    auto s = co_await client.open(r);
    if (!s.ok()) co_return "transport: " + std::string(s.status().message());
    const int status = (*s)->status();
    std::string body;
    sse::Parser parser;
    bool done = false, error = false, events_after_done = false;
    for (;;) {
      auto piece = co_await (*s)->next();
      if (!piece.ok()) co_return "stream broken: " + std::string(piece.status().message());
      if (!piece->has_value()) break;
      if (status != 200) {
        body += **piece;
        continue;
      }
      auto st = parser.feed(**piece, [&](sse::Event&& e) {
        if (done) events_after_done = true;
        if (e.data == "[DONE]") done = true;
        if (e.data.find("\"error\"") != std::string::npos) error = true;
      });
      if (!st.ok()) co_return "bad sse: " + std::string(st.message());
    }
    if (status != 200) {
      if (status >= 400 && isErrorBody(body)) co_return strCat("clean_error: ", status);
      co_return strCat("stream status ", status, " body ", body.substr(0, 200));
    }
    if (!done) co_return "stream ended without [DONE]";
    if (events_after_done) co_return "events after [DONE]";
    co_return error ? "clean_error: sse error event" : "ok";
  }

  asio::awaitable<void> clientLoop(int k) {
    auto client = http::HttpClient::create(io_->executor(), "127.0.0.1", cluster_->routerPort());
    for (int64_t i = 0; !stop_load_; ++i) {
      const int64_t n = i * kClients + k;
      ++load_.started;
      const auto t0 = Clock::now();
      std::string outcome = co_await oneRequest(*client, n);
      load_.record(outcome, t0);
    }
  }

  void startLoad() {
    for (int k = 0; k < kClients; ++k)
      asio::co_spawn(io_->context(), clientLoop(k), asio::detached);
  }

  // Stops issuing requests and waits (up to the deadline) for those in flight; returns how many
  // never answered.
  int64_t stopLoad() {
    if (stop_load_.exchange(true)) return 0;
    eventually([&] { return load_.started == load_.finished; }, kRequestDeadline, 50ms);
    return load_.started - load_.finished;
  }

  // ---- views of the router and the engines ----

  absl::StatusOr<http::Response> get(const std::shared_ptr<http::HttpClient>& client,
                                     std::string target, std::string token) {
    http::Headers h;
    if (!token.empty()) h.emplace_back("Authorization", "Bearer " + token);
    return httpCall(*io_, *client, "GET", std::move(target), "", std::move(h));
  }

  bj::object instance(const std::string& id) {
    auto r = get(router_client_, "/admin/instances", cluster_->adminToken());
    if (!r.ok() || r->status != 200) return {};
    auto obj = json::parseObject(r->body);
    if (!obj.ok()) return {};
    for (const auto& v : obj->at("instances").as_array()) {
      if (v.as_object().at("id").as_string() == id) return v.as_object();
    }
    return {};
  }
  bool admitted(int i) {
    auto s = instance(EngineCluster::id(i));
    return !s.empty() && s["admitted"].as_bool();
  }
  int64_t indexBlocks(int i) {
    auto s = instance(EngineCluster::id(i));
    return s.empty() ? -1 : s["index_blocks"].as_int64();
  }
  std::string routerMetrics() {
    auto r = get(router_client_, "/metrics", "");
    return r.ok() ? r->body : "";
  }
  std::string engineMetrics(int i) {
    auto r = get(engine_clients_[static_cast<size_t>(i)], "/metrics", "");
    return r.ok() ? r->body : "";
  }
  // The engine's own audit: {cached_blocks, corrupt_blocks}; empty when it did not answer.
  bj::object audit(int i) {
    auto r = get(engine_clients_[static_cast<size_t>(i)], "/kv/audit", kToken);
    if (!r.ok() || r->status != 200) return {};
    auto obj = json::parseObject(r->body);
    return obj.ok() ? *obj : bj::object{};
  }

  // Adds engine i's landed-block checks to the totals (before it is killed, and at the end).
  void collectBlockChecks(int i) {
    std::string m = engineMetrics(i);
    verified_blocks_ += metricSum(m, "kvfabric_engine_kv_push_verified_blocks_total");
    corrupt_blocks_ += metricSum(m, "kvfabric_engine_kv_push_corrupt_blocks_total");
    checksum_mismatches_ += metricSum(m, "kvfabric_transport_checksum_mismatches_total");
  }

  // After the load: no hung request, only clean answers, no corrupt block, and the router's index
  // equal to each engine's cached blocks.
  void checkInvariants() {
    int64_t hung = stopLoad();
    EXPECT_EQ(hung, 0) << "requests without an answer after " << kRequestDeadline.count() << " s";
    EXPECT_EQ(load_.bad.load(), 0) << load_.badSamples();
    EXPECT_LE(load_.max_latency_ms.load(), std::chrono::milliseconds(kRequestDeadline).count());
    EXPECT_GT(load_.ok.load(), 50);
    std::printf("load: %ld requests, %ld ok, %ld clean errors, %ld bad, max latency %ld ms\n",
                static_cast<long>(load_.started.load()), static_cast<long>(load_.ok.load()),
                static_cast<long>(load_.clean_errors.load()), static_cast<long>(load_.bad.load()),
                static_cast<long>(load_.max_latency_ms.load()));
    for (int i = 0; i < cluster_->size(); ++i) {
      collectBlockChecks(i);
      // Events settle: the router's view converges on what the engine holds.
      int64_t index = -1, cached = -2, corrupt = -1;
      bool consistent = eventually(
          [&] {
            auto a = audit(i);
            if (a.empty()) return false;
            cached = a["cached_blocks"].as_int64();
            corrupt = a["corrupt_blocks"].as_int64();
            index = indexBlocks(i);
            return index == cached;
          },
          10s, 100ms);
      EXPECT_TRUE(consistent) << EngineCluster::id(i) << ": router indexes " << index
                              << " blocks, the engine caches " << cached;
      EXPECT_EQ(corrupt, 0) << EngineCluster::id(i) << "'s cached blocks fail the audit";
    }
    EXPECT_GT(verified_blocks_, 0) << "no KV moved: the test did not exercise pushes";
    EXPECT_EQ(corrupt_blocks_, 0);
    std::printf(
        "landed blocks verified: %.0f, corrupt: %.0f, transport checksum mismatches: %.0f\n",
        verified_blocks_, corrupt_blocks_, checksum_mismatches_);
  }

  std::string source_, bin_;
  fs::path dir_;
  std::unique_ptr<IoThread> io_;  // made in SetUp: after a namespace switch, on its side
  std::unique_ptr<EngineCluster> cluster_;
  std::shared_ptr<http::HttpClient> router_client_;
  std::vector<std::shared_ptr<http::HttpClient>> engine_clients_;
  std::atomic<bool> stop_load_{false};
  LoadStats load_;
  double verified_blocks_ = 0, corrupt_blocks_ = 0, checksum_mismatches_ = 0;
};

TEST_F(ChaosTest, FaultsUnderLoadLeaveNoHungRequestNoCorruptBlockAndAConsistentIndex) {
  // e1 holds every push it serves for 1.5 s between the receiver's grant and the write.
  TcpRelay relay(0);  // its upstream is set once e0's ports are known
  startCluster({"", "fault: stall, fault_stall_ms: 1500", "", ""}, &relay);
  relay.setUpstream(cluster_->ports(0).events);
  startLoad();
  ASSERT_TRUE(eventually([&] { return load_.ok >= 24; }, 60s)) << load_.badSamples();

  // kill -9: ejected within 2 s; restarted on the same ports, re-admitted with an index of what
  // the new process holds (not the dead one's blocks).
  ASSERT_TRUE(eventually([&] { return indexBlocks(3) > 0; }, 20s));
  collectBlockChecks(3);
  const auto killed_at = Clock::now();
  cluster_->killEngine(3);
  // Out of rotation (failed requests open its circuit, failed checks eject it), and ejected by
  // the health checks themselves.
  ASSERT_TRUE(eventually([&] { return !admitted(3); }, 10s, 10ms));
  const auto out_of_rotation = Clock::now() - killed_at;
  ASSERT_TRUE(eventually(
      [&] {
        auto s = instance("e3");
        return !s.empty() && !s["health_check_ok"].as_bool();
      },
      10s, 10ms));
  const auto ejection = Clock::now() - killed_at;
  // Two failed checks (interval 0.2 s, timeout 0.3 s) take about 1 s; the bound adds several
  // seconds for a loaded machine and still catches checks that never eject.
  EXPECT_LT(out_of_rotation, 5s);
  EXPECT_LT(ejection, 5s);
  std::printf(
      "after kill -9: out of rotation in %ld ms, ejected in %ld ms\n",
      static_cast<long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(out_of_rotation).count()),
      static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(ejection).count()));
  std::this_thread::sleep_for(1s);  // the engine stays dead for a while: a fault, not a wait
  cluster_->restartEngine(3);
  ASSERT_TRUE(eventually([&] { return admitted(3); }, 15s, 20ms));
  auto fresh = audit(3);
  ASSERT_FALSE(fresh.empty());
  EXPECT_LE(indexBlocks(3), fresh["cached_blocks"].as_int64())
      << "the router kept the killed process's blocks in its index";

  // SIGSTOP: found stalled (stall_timeout_s 1) or ejected, taken back after SIGCONT.
  cluster_->signalEngine(2, SIGSTOP);
  EXPECT_TRUE(eventually(
      [&] {
        auto s = instance("e2");
        return !s.empty() && (s["stalled"].as_bool() || !s["admitted"].as_bool());
      },
      5s, 20ms));
  std::this_thread::sleep_for(2s);  // stopped for a while: a fault, not a wait
  cluster_->signalEngine(2, SIGCONT);
  EXPECT_TRUE(eventually([&] { return admitted(2); }, 10s, 20ms));

  // A push in flight: a receiver holds a landing e1 claimed and has not written yet (e1
  // stalls 1.5 s there). Kill e1 then: the receiver must free the landing and answer.
  int receiver = -1;
  ASSERT_TRUE(eventually(
      [&] {
        for (int i : {0, 2, 3}) {
          if (metricSum(engineMetrics(i), "kvfabric_worker_unresolved_landings") > 0) {
            receiver = i;
            return true;
          }
        }
        return false;
      },
      30s, 10ms))
      << "no push from e1 was in flight";
  collectBlockChecks(1);
  cluster_->killEngine(1);
  EXPECT_TRUE(eventually(
      [&] {
        std::string m = engineMetrics(receiver);
        return metricSum(m, "kvfabric_worker_unresolved_landings") == 0 &&
               metricSum(m, "kvfabric_engine_kv_push_quarantined_blocks") == 0;
      },
      10s, 50ms))
      << "e" << receiver << " kept the dead holder's landing";
  cluster_->restartEngine(1);
  EXPECT_TRUE(eventually([&] { return admitted(1); }, 15s, 20ms));

  // The KV-event stream of e0 cut for 2 s and restored: the router notices the gap and
  // recovers (replay) or resets e0's index; checkInvariants() then finds it consistent.
  auto gapsAndResets = [&] {
    std::string m = routerMetrics();
    return metricSum(m, "kvfabric_router_instance_kv_gaps_total", "instance=\"e0\"") +
           metricSum(m, "kvfabric_router_instance_kv_resets_total", "instance=\"e0\"");
  };
  const double before = gapsAndResets();
  relay.cut();
  std::this_thread::sleep_for(2s);  // events published meanwhile are lost: a fault
  relay.restore();
  EXPECT_TRUE(eventually([&] { return gapsAndResets() > before; }, 15s, 100ms)) << routerMetrics();

  std::this_thread::sleep_for(3s);  // the load runs on after the last fault
  checkInvariants();
}

// Runs `command` (sh -c) and returns its exit status; its output (stdout and stderr) in `*out`.
int runCommand(const std::string& command, std::string* out) {
  out->clear();
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[512];
  while (size_t n = std::fread(buf, 1, sizeof(buf), pipe)) out->append(buf, n);
  return ::pclose(pipe);
}

// tc netem on one engine's worker link. The test process moves into a network namespace of
// its own (so the qdisc touches no other process's loopback traffic) before any thread or
// socket exists; the cluster's children inherit it. Needs root, tc, and a kernel with the prio
// and netem qdiscs: without any of them the test is skipped with the reason.
class ChaosNetemTest : public ChaosTest {
 protected:
  void SetUp() override {
    std::string reason = enterNamespaceWithNetem();
    if (!reason.empty()) GTEST_SKIP() << "netem fault skipped: " << reason;
    ChaosTest::SetUp();
  }

  std::string enterNamespaceWithNetem() {
    if (::geteuid() != 0) return "not running as root";
    if (!fs::exists("/usr/sbin/tc") && !fs::exists("/sbin/tc")) return "tc is not installed";
    if (::unshare(CLONE_NEWNET) != 0) return strCat("unshare(CLONE_NEWNET): errno ", errno);
    std::string out;
    // Everything goes to band 1:1 except what the filter sends to 1:3, which netem delays and
    // drops.
    for (const char* command :
         {"ip link set lo up",
          "tc qdisc add dev lo root handle 1: prio bands 3 priomap 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0",
          "tc qdisc add dev lo parent 1:3 handle 30: netem delay 20ms 5ms loss 2%"}) {
      if (runCommand(command, &out) != 0) return strCat("`", command, "` failed: ", out);
    }
    return "";
  }

  // Sends TCP traffic to and from `port` through the netem band; the reason when the kernel
  // cannot (no u32 classifier), else "".
  std::string impair(uint16_t port) {
    std::string out;
    for (const char* dir : {"dport", "sport"}) {
      std::string command =
          strCat("tc filter add dev lo parent 1:0 protocol ip prio 1 u32 match ip ", dir, " ", port,
                 " 0xffff flowid 1:3");
      if (runCommand(command, &out) != 0) return strCat("`", command, "` failed: ", out);
    }
    return "";
  }

  // Packets netem has seen (its qdisc's "Sent N bytes M pkt" line).
  int64_t netemPackets() {
    std::string out;
    if (runCommand("tc -s qdisc show dev lo", &out) != 0) return -1;
    size_t at = out.find("netem");
    if (at == std::string::npos) return -1;
    at = out.find("bytes ", out.find("Sent ", at));
    if (at == std::string::npos) return -1;
    return std::stoll(out.substr(at + 6));
  }
};

TEST_F(ChaosNetemTest, DelayAndLossOnAWorkerLinkLeaveNoHungRequestAndNoCorruptBlock) {
  startCluster({"", "", "", ""});
  // e2's worker link: claims and push requests to and from it.
  std::string reason = impair(cluster_->ports(2).worker);
  if (!reason.empty()) GTEST_SKIP() << "netem fault skipped: " << reason;
  startLoad();
  ASSERT_TRUE(eventually([&] { return load_.ok >= 24; }, 60s)) << load_.badSamples();
  std::this_thread::sleep_for(10s);  // the load runs under the impaired link: the fault
  EXPECT_GT(netemPackets(), 0) << "no traffic went through the impaired link";
  checkInvariants();
}

}  // namespace
}  // namespace kvf::testing
