// Request lifecycle end to end: kvf-router in front of kvf-engine processes on loopback.
// A non-streaming client that hangs up cancels its request on the engine (which aborts it, as
// vLLM does) and frees the router's load accounting; an engine stopped with SIGSTOP is found
// stalled within upstream.stall_timeout_s: its streams with bytes out end with an SSE error
// and [DONE], its requests without a first byte are retried elsewhere, it takes nothing new,
// and once it runs again (SIGCONT) a health check readmits it.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <map>
#include <numeric>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_future.hpp>

#include "common/http_client.h"
#include "common/json.h"
#include "common/process.h"
#include "common/sse.h"
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
namespace bj = boost::json;
using namespace std::chrono_literals;

std::string prompt(int base, int n, int max_tokens, bool stream) {
  std::vector<int> t(n);
  std::iota(t.begin(), t.end(), base);
  return strCat("{\"model\":\"test-model\",\"max_tokens\":", max_tokens,
                ",\"ignore_eos\":true,\"stream\":", stream ? "true" : "false", ",\"prompt\":[",
                strJoin(t, ","), "]}");
}

// The value of the first sample of `series` (full name with labels) in an exposition; -1 if
// absent.
double sample(const std::string& text, const std::string& series) {
  size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

const std::string kRunning = "vllm:num_requests_running{model_name=\"test-model\"}";
const std::string kAborted = "kvfabric_engine_requests_aborted_total{model_name=\"test-model\"}";

using kvf::testing::eventually;

class RouterLifecycleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    source_ = envOr("KVF_SOURCE_DIR", fs::current_path().string());
    bin_ = envOr("KVF_BIN_DIR", source_ + "/build/bin");
    dir_ = freshTempDir("kvf_lifecycle");
  }

  // `workers`: worker servers and KV events on (the router indexes the engines' blocks).
  void startCluster(int n, const std::string& upstream_yaml,
                    const std::string& health_yaml =
                        "{interval_s: 0.2, timeout_s: 0.2, unhealthy_threshold: 1000}",
                    bool workers = false) {
    EngineClusterOptions o;
    o.engines = n;
    o.engine_yaml = "max_model_len: 32768\n";
    o.workers = workers;
    o.router_yaml = strCat("health: ", health_yaml, "\nupstream: ", upstream_yaml, "\n");
    cluster_ = std::make_unique<EngineCluster>(dir_, source_, bin_);
    cluster_->start(std::move(o));
    for (int i = 0; i < n; ++i) {
      engine_clients_.push_back(
          http::HttpClient::create(io_.executor(), "127.0.0.1", cluster_->ports(i).http));
    }
    port_ = cluster_->routerPort();
    client_ = http::HttpClient::create(io_.executor(), "127.0.0.1", port_);
  }

  absl::StatusOr<http::Response> call(const std::shared_ptr<http::HttpClient>& client,
                                      std::string method, std::string target, std::string body = "",
                                      http::Headers headers = {}) {
    return httpCall(io_, *client, std::move(method), std::move(target), std::move(body),
                    std::move(headers));
  }

  std::string routerMetrics() {
    auto r = call(client_, "GET", "/metrics");
    return r.ok() ? r->body : "";
  }
  std::string engineMetrics(int i) {
    auto r = call(engine_clients_[i], "GET", "/metrics");
    return r.ok() ? r->body : "";
  }
  bj::object instanceState(const std::string& id) {
    auto r = call(client_, "GET", "/admin/instances", "", {{"Authorization", "Bearer adm"}});
    if (!r.ok()) return {};
    auto obj = json::parseObject(r->body);
    if (!obj.ok()) return {};
    for (const auto& v : obj->at("instances").as_array()) {
      if (v.as_object().at("id").as_string() == id) return v.as_object();
    }
    return {};
  }

  // One streaming request: "done", "error_event: <message>" (an SSE error then [DONE]), or
  // what went wrong. Counts streams past their first chunk per instance.
  asio::awaitable<std::string> streamOnce(std::string body) {
    http::ClientRequest r;
    r.method = "POST";
    r.target = "/v1/completions";
    r.body = std::move(body);
    auto s = co_await client_->open(r);
    if (!s.ok()) co_return std::string(s.status().message());
    if ((*s)->status() != 200) co_return strCat("status ", (*s)->status());
    std::string instance((*s)->header("x-kvf-instance"));
    sse::Parser parser;
    bool done = false, first = true;
    std::string error;
    for (;;) {
      auto piece = co_await (*s)->next();
      if (!piece.ok()) co_return "broken: " + std::string(piece.status().message());
      if (!piece->has_value()) break;
      if (first) streaming_[instance == "e0" ? 0 : 1]++;
      first = false;
      auto st = parser.feed(**piece, [&](sse::Event&& e) {
        if (e.data == "[DONE]") done = true;
        if (e.data.find("\"error\"") != std::string::npos) error = e.data;
      });
      if (!st.ok()) co_return "bad sse";
    }
    if (!done) co_return "no [DONE]";
    if (!error.empty()) error_at_ = std::chrono::steady_clock::now();
    co_return error.empty() ? "done" : "error_event: " + error;
  }

  std::atomic<int> streaming_[2] = {0, 0};                         // e0, the others
  std::atomic<std::chrono::steady_clock::time_point> error_at_{};  // a stream's error event
  std::string source_, bin_;
  fs::path dir_;
  IoThread io_;
  std::unique_ptr<EngineCluster> cluster_;
  std::vector<std::shared_ptr<http::HttpClient>> engine_clients_;
  std::shared_ptr<http::HttpClient> client_;
  uint16_t port_ = 0;
};

TEST_F(RouterLifecycleTest, NonStreamingClientDisconnectAbortsTheEnginesRequest) {
  startCluster(1, "{}");
  // ~8k output tokens: minutes of decode on the emulated engine unless something stops it.
  std::string body = prompt(0, 512, 8000, false);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port_);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  std::string request =
      strCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: ",
             "application/json\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
  ASSERT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  ASSERT_TRUE(eventually([&] { return sample(engineMetrics(0), kRunning) == 1; }, 10s))
      << engineMetrics(0);
  ::close(fd);  // the client hangs up while the router waits for the whole answer
  // The engine aborts the request (as vLLM does when its client goes) and stops decoding it.
  EXPECT_TRUE(eventually(
      [&] {
        std::string m = engineMetrics(0);
        return sample(m, kAborted) == 1 && sample(m, kRunning) == 0;
      },
      5s))
      << engineMetrics(0);
  EXPECT_TRUE(eventually(
      [&] {
        auto s = instanceState("e0");
        return !s.empty() && s["running"].as_int64() == 0 &&
               sample(routerMetrics(), "kvfabric_router_requests_cancelled_total") == 1;
      },
      5s));
}

TEST_F(RouterLifecycleTest, StalledEngineIsFoundRetriedAroundAndReadmitted) {
  startCluster(3, "{stall_timeout_s: 1, max_attempts: 3}");
  std::vector<std::future<std::string>> streams;
  for (int i = 0; i < 3; ++i) {  // round robin: one per engine
    streams.push_back(asio::co_spawn(io_.context(), streamOnce(prompt(i * 10000, 256, 400, true)),
                                     asio::use_future));
  }
  ASSERT_TRUE(eventually([&] { return streaming_[0] == 1 && streaming_[1] == 2; }, 20s));
  cluster_->signalEngine(0, SIGSTOP);
  const auto stopped_at = std::chrono::steady_clock::now();
  // Sent before the stall is found: the one that lands on e0 gets no byte there.
  std::vector<std::future<absl::StatusOr<http::Response>>> calls;
  for (int i = 0; i < 3; ++i) {
    calls.push_back(std::async(std::launch::async, [this, i] {
      return call(client_, "POST", "/v1/completions", prompt(50000 + i * 1000, 64, 4, false));
    }));
  }
  for (auto& c : calls) {
    ASSERT_EQ(c.wait_for(30s), std::future_status::ready) << "a request hung";
    auto r = c.get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_NE(r->header("x-kvf-instance"), "e0");
  }
  const auto answered_in = std::chrono::steady_clock::now() - stopped_at;
  EXPECT_LT(answered_in, 20s);
  // e0's stream had sent bytes: it ends with an SSE error and [DONE] within the stall window
  // (plus the check period), not after read_timeout_s (600 s).
  std::map<std::string, int> outcomes;
  for (auto& f : streams) {
    ASSERT_EQ(f.wait_for(30s), std::future_status::ready) << "a stream hung";
    std::string outcome = f.get();
    outcomes[outcome.substr(0, outcome.find(':'))]++;
    if (outcome.starts_with("error_event")) {
      EXPECT_NE(outcome.find("stalled"), std::string::npos) << outcome;
      EXPECT_LT(error_at_.load() - stopped_at, 6s);
    }
  }
  EXPECT_EQ(outcomes["error_event"], 1);
  EXPECT_EQ(outcomes["done"], 2);
  std::string m = routerMetrics();
  EXPECT_EQ(sample(m, "kvfabric_router_instance_stalls_total{instance=\"e0\"}"), 1) << m;
  EXPECT_EQ(sample(m, "kvfabric_router_instance_stalled{instance=\"e0\"}"), 1);
  EXPECT_EQ(sample(m, "kvfabric_router_stalled_requests_total{outcome=\"stream_error\"}"), 1);
  EXPECT_GE(sample(m, "kvfabric_router_stalled_requests_total{outcome=\"before_first_byte\"}"), 1);
  EXPECT_EQ(sample(m, "kvfabric_router_instance_stalls_total{instance=\"e1\"}"), 0);
  auto state = instanceState("e0");
  EXPECT_TRUE(state["stalled"].as_bool());
  EXPECT_FALSE(state["admitted"].as_bool());
  // It takes nothing new while stalled.
  for (int i = 0; i < 6; ++i) {
    auto r = call(client_, "POST", "/v1/completions", prompt(70000 + i * 1000, 64, 4, false));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 200);
    EXPECT_NE(r->header("x-kvf-instance"), "e0");
  }
  cluster_->signalEngine(0, SIGCONT);
  // A passing health check readmits it.
  EXPECT_TRUE(eventually(
      [&] {
        auto s = instanceState("e0");
        return !s.empty() && !s["stalled"].as_bool() && s["admitted"].as_bool();
      },
      10s));
}

// An instance ejected because it answered too late (SIGSTOP) is the same process when it is
// re-admitted: the router keeps its index. One that could not be reached (SIGKILL) may be a new
// process: its index starts empty.
TEST_F(RouterLifecycleTest, ReadmissionKeepsTheIndexOfALateEngineAndEmptiesARestartedOnes) {
  setenv("KVF_WORKER_TOKEN", "lifecycle-token", 1);
  startCluster(2, "{stall_timeout_s: 30}",
               "{interval_s: 0.2, timeout_s: 0.3, unhealthy_threshold: 2}", true);
  auto r = call(client_, "POST", "/v1/completions", prompt(0, 512, 4, false));
  ASSERT_TRUE(r.ok() && r->status == 200);
  const std::string id(r->header("x-kvf-instance"));
  const int i = id == "e0" ? 0 : 1;
  auto cached = [&] {
    auto a = call(engine_clients_[static_cast<size_t>(i)], "GET", "/kv/audit", "",
                  {{"Authorization", "Bearer lifecycle-token"}});
    if (!a.ok() || a->status != 200) return int64_t{-1};
    return json::parseObject(a->body)->at("cached_blocks").as_int64();
  };
  auto index = [&] {
    auto s = instanceState(id);
    return s.empty() ? int64_t{-2} : s["index_blocks"].as_int64();
  };
  auto admitted = [&] {
    auto s = instanceState(id);
    return !s.empty() && s["admitted"].as_bool();
  };
  ASSERT_TRUE(eventually([&] { return index() == 32; }, 10s)) << index();
  ASSERT_EQ(cached(), 32);

  cluster_->signalEngine(i, SIGSTOP);
  ASSERT_TRUE(eventually([&] { return !admitted(); }, 10s));
  cluster_->signalEngine(i, SIGCONT);
  ASSERT_TRUE(eventually(admitted, 10s));
  EXPECT_EQ(index(), 32) << "the index of a process that never went away was dropped";

  cluster_->killEngine(i);
  ASSERT_TRUE(eventually([&] { return !admitted(); }, 10s));
  cluster_->restartEngine(i);
  ASSERT_TRUE(eventually(admitted, 10s));
  EXPECT_EQ(index(), 0) << "the killed process's blocks stayed in the index";
  EXPECT_EQ(cached(), 0);
}

}  // namespace
}  // namespace kvf::testing
