// The router in-process in front of in-process fake engines on loopback, shared by the router
// tests: start N engines and a router with a policy, call it, stream from it, read the decision
// log, the admin API and metrics. Engines and the test client run on one io thread, the router
// on another.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <numeric>
#include <thread>

#include <boost/json.hpp>

#include "common/http_client.h"
#include "common/json.h"
#include "common/sse.h"
#include "common/strings.h"
#include "router/router.h"
#include "tests/fakes/fake_engine.h"
#include "tests/testing/io_thread.h"

namespace kvf::router {

using namespace std::chrono_literals;
namespace bj = boost::json;

inline http::ClientRequest post(std::string target, std::string body, http::Headers headers = {}) {
  http::ClientRequest r;
  r.method = "POST";
  r.target = std::move(target);
  r.body = std::move(body);
  r.headers = std::move(headers);
  return r;
}

inline http::ClientRequest get(std::string target, http::Headers headers = {}) {
  http::ClientRequest r;
  r.method = "GET";
  r.target = std::move(target);
  r.headers = std::move(headers);
  return r;
}

inline std::string tokenPrompt(int first, int n, bool stream = false, std::string extra = "") {
  std::vector<int> t(n);
  std::iota(t.begin(), t.end(), first);
  return "{\"model\":\"fake-model\",\"max_tokens\":4,\"stream\":" +
         std::string(stream ? "true,\"stream_options\":{\"include_usage\":true}" : "false") +
         extra + ",\"prompt\":[" + kvf::strJoin(t, ",") + "]}";
}

class RouterFixture : public ::testing::Test {
 protected:
  void start(int engines, std::string policy_yaml, bool events = true, std::string extra_yaml = "",
             std::function<void(fakes::FakeEngineOptions&)> tweak = {}) {
    for (int i = 0; i < engines; ++i) {
      fakes::FakeEngineOptions o;
      o.id = "e" + std::to_string(i);
      o.publish_kv_events = events;
      if (tweak) tweak(o);
      engines_.push_back(std::make_unique<fakes::FakeEngine>(engine_io_.context(), o));
    }
    log_path_ = ::testing::TempDir() + "/router_decisions_" +
                std::to_string(reinterpret_cast<uintptr_t>(this)) + ".jsonl";
    std::remove(log_path_.c_str());
    std::string yaml = extra_yaml.find("listen:") == std::string::npos ? "listen: {port: 0}\n" : "";
    yaml += "instances:\n" + leading_instances_yaml_;
    for (auto& e : engines_) {
      yaml += "  - id: " + e->options().id + "\n    url: " + e->url() + "\n";
      if (workers_) yaml += "    worker_url: " + e->workerUrl() + "\n";
      if (events) {
        yaml += "    kv_events: {endpoint: \"" + e->publisher()->endpoint() +
                "\", replay_endpoint: \"" + e->publisher()->replayEndpoint() + "\"}\n";
      }
    }
    yaml += "policy: " + policy_yaml + "\ndecision_log: " + log_path_ +
            "\nadmin: {token: s3cret}\n" + extra_yaml;
    auto config = parseRouterConfig(yaml, "<test>");
    ASSERT_TRUE(config.ok()) << config.status();
    auto router = Router::create(router_io_.context(), *config, clock_);
    ASSERT_TRUE(router.ok()) << router.status();
    router_ = *router;
    client_ = http::HttpClient::create(engine_io_.executor(), "127.0.0.1", router_->port());
  }

  void TearDown() override {
    router_io_.stop();  // no handler runs once the router is gone
    router_.reset();
    engine_io_.stop();
    if (!log_path_.empty()) std::remove(log_path_.c_str());  // the decision log dies with the test
  }

  absl::StatusOr<http::Response> call(http::ClientRequest request) {
    return engine_io_.run([&]() -> asio::awaitable<absl::StatusOr<http::Response>> {
      co_return co_await client_->request(request);
    });
  }

  // Streams a request and returns its SSE events' data, in order.
  absl::StatusOr<std::pair<http::Headers, std::vector<std::string>>> stream(
      http::ClientRequest request) {
    return engine_io_.run(
        [&]()
            -> asio::awaitable<absl::StatusOr<std::pair<http::Headers, std::vector<std::string>>>> {
          auto s = co_await client_->open(request);
          if (!s.ok()) co_return s.status();
          std::vector<std::string> events;
          sse::Parser parser;
          for (;;) {
            auto piece = co_await (*s)->next();
            if (!piece.ok()) co_return piece.status();
            if (!piece->has_value()) break;
            auto st = parser.feed(**piece, [&](sse::Event&& e) { events.push_back(e.data); });
            if (!st.ok()) co_return st;
          }
          co_return std::make_pair((*s)->headers(), events);
        },
        20s);
  }

  std::vector<bj::object> decisionLog() {
    std::vector<bj::object> out;
    std::ifstream in(log_path_);
    std::string line;
    while (std::getline(in, line)) {
      auto obj = json::parseObject(line);
      EXPECT_TRUE(obj.ok()) << line;
      if (obj.ok()) out.push_back(*obj);
    }
    return out;
  }

  bj::object adminInstances() {
    auto r = call(get("/admin/instances", {{"Authorization", "Bearer s3cret"}}));
    EXPECT_TRUE(r.ok());
    auto obj = json::parseObject(r.ok() ? r->body : "{}");
    return obj.ok() ? *obj : bj::object{};
  }

  bj::object instanceState(const std::string& id) {
    bj::object all = adminInstances();
    if (!all.contains("instances")) return {};
    for (auto& v : all["instances"].as_array()) {
      if (v.as_object().at("id").as_string() == id) return v.as_object();
    }
    return {};
  }

  // ZMQ drops what is published before a subscription is in place (and a missed first batch
  // is only noticed at the next one), so tests that count on events publish empty batches
  // until each engine's subscriber has delivered one.
  void waitSubscribed() {
    for (auto& e : engines_) {
      std::string series =
          "kvfabric_router_instance_kv_batches_total{instance=\"" + e->options().id + "\"} ";
      bool ok = eventually([&] {
        e->publisher()->publish({});
        auto m = call(get("/metrics"));
        return m.ok() && m->body.find(series + "0\n") == std::string::npos &&
               m->body.find(series) != std::string::npos;
      });
      ASSERT_TRUE(ok) << e->options().id;
    }
  }

  template <class P>
  bool eventually(P pred, std::chrono::milliseconds timeout = 10s) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (pred()) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

  bool workers_ = false;  // give every instance a worker_url (push-capable)
  // Instances listed before the engines (so the engines take the slots after theirs).
  std::string leading_instances_yaml_;
  SteadyClock clock_;
  testing::IoThread engine_io_;
  testing::IoThread router_io_;
  std::vector<std::unique_ptr<fakes::FakeEngine>> engines_;
  std::shared_ptr<Router> router_;
  std::shared_ptr<http::HttpClient> client_;
  std::string log_path_;
};

}  // namespace kvf::router
