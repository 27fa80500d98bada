// The router in-process in front of fake engines on loopback: cache-aware placement from KV
// events and predictions, streaming pass-through, headers and decision log, retries, mid-stream
// failure, health ejection, admin API and bad input.
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/router/router_fixture.h"
#include "tests/testing/socket_read.h"

namespace kvf::router {
namespace {

class ProxyTest : public RouterFixture {};

TEST_F(ProxyTest, SessionFollowsItsCachedPrefixAndLogsPredictedVsActual) {
  start(4, "{kind: hybrid}");
  waitSubscribed();
  auto first = call(post("/v1/completions", tokenPrompt(0, 4096), {{"X-Session-Id", "s1"}}));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->status, 200) << first->body;
  std::string home(first->header("x-kvf-instance"));
  EXPECT_EQ(first->header("x-kvf-decision"), "local");
  EXPECT_EQ(first->header("x-kvf-predicted-cached-tokens"), "0");
  // Wait until the engine's BlockStored events reached the index (exact, not just predicted).
  ASSERT_TRUE(eventually([&] { return instanceState(home)["index_blocks"].as_int64() == 256; }));
  for (int turn = 0; turn < 3; ++turn) {
    auto next = call(
        post("/v1/completions", tokenPrompt(0, 4096 + 512 * (turn + 1)), {{"X-Session-Id", "s1"}}));
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_EQ(next->header("x-kvf-instance"), home);
    EXPECT_EQ(next->header("x-kvf-reason"), "cache_gate");
    EXPECT_EQ(next->header("x-kvf-predicted-cached-tokens"), std::to_string(4096 + 512 * turn));
  }
  // The line is written once the response is out, so it may trail the client a little.
  ASSERT_TRUE(eventually([&] { return decisionLog().size() == 4; }));
  auto log = decisionLog();
  EXPECT_EQ(log[1]["session"].as_string(), "s1");
  EXPECT_EQ(log[1]["policy"].as_string(), "hybrid");
  EXPECT_EQ(log[1]["instance"].as_string(), home);
  EXPECT_EQ(log[1]["predicted_cached_tokens"].as_int64(), 4096);
  EXPECT_EQ(log[1]["actual_cached_tokens"].as_int64(), 4096);  // the engine agreed
  EXPECT_EQ(log[0]["actual_cached_tokens"].as_int64(), 0);
  EXPECT_EQ(log[1]["scores"].as_object().size(), 4u);
  EXPECT_EQ(log[1]["status"].as_int64(), 200);
  // A different prompt goes by load, not to the busy home (LMetric ties break on cache, then
  // rotate) - and the metrics count every decision.
  auto metrics = call(get("/metrics"));
  ASSERT_TRUE(metrics.ok());
  EXPECT_NE(metrics->body.find("kvfabric_router_decisions_total{policy=\"hybrid\",mode=\"local\","
                               "reason=\"cache_gate\"} 3"),
            std::string::npos)
      << metrics->body;
  EXPECT_NE(metrics->body.find("kvfabric_router_cache_silent_misses_total 0"), std::string::npos);
}

TEST_F(ProxyTest, IndexFollowsEvictionsFromEvents) {
  start(2, "{kind: hybrid}");
  waitSubscribed();
  auto first = call(post("/v1/completions", tokenPrompt(0, 1024)));
  ASSERT_TRUE(first.ok());
  std::string home(first->header("x-kvf-instance"));
  ASSERT_TRUE(eventually([&] { return instanceState(home)["index_blocks"].as_int64() == 64; }));
  engines_[home == "e0" ? 0 : 1]->clearCache();  // AllBlocksCleared
  ASSERT_TRUE(eventually([&] { return instanceState(home)["index_blocks"].as_int64() == 0; }));
  auto again = call(post("/v1/completions", tokenPrompt(0, 1024)));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->header("x-kvf-predicted-cached-tokens"), "0");
}

TEST_F(ProxyTest, StreamsChunkByChunkWithHeadersAndUsage) {
  start(2, "{kind: lmetric}");
  auto result = stream(post("/v1/completions", tokenPrompt(0, 256, true)));
  ASSERT_TRUE(result.ok()) << result.status();
  auto& [headers, events] = *result;
  EXPECT_FALSE(http::findHeader(headers, "x-kvf-instance").empty());
  EXPECT_EQ(http::findHeader(headers, "content-type"), "text/event-stream");
  ASSERT_EQ(events.size(), 6u);  // 4 tokens, usage, [DONE]
  EXPECT_NE(events[0].find("\"t0\""), std::string::npos);
  EXPECT_NE(events[4].find("cached_tokens"), std::string::npos);
  EXPECT_EQ(events[5], "[DONE]");
  // Chat streams the same way.
  std::string chat =
      R"({"model":"fake-model","stream":true,"messages":[{"role":"user","content":"hello there"}]})";
  auto chat_result = stream(post("/v1/chat/completions", chat));
  ASSERT_TRUE(chat_result.ok()) << chat_result.status();
  EXPECT_EQ(chat_result->second.back(), "[DONE]");
  EXPECT_NE(chat_result->second[0].find("delta"), std::string::npos);
  ASSERT_TRUE(eventually([&] { return decisionLog().size() == 2; }));
  auto log = decisionLog();
  EXPECT_EQ(log[0]["actual_cached_tokens"].as_int64(), 0);
}

TEST_F(ProxyTest, ConnectionFailureIsRetriedOnAnotherInstance) {
  start(2, "{kind: round_robin}", false, "health: {interval_s: 60}\n");
  engines_[0]->stop();  // refused connections; health checks are too slow to notice
  for (int i = 0; i < 4; ++i) {
    auto r = call(post("/v1/completions", tokenPrompt(i * 100, 64)));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->header("x-kvf-instance"), "e1");
  }
  auto metrics = call(get("/metrics"));
  ASSERT_TRUE(metrics.ok());
  EXPECT_EQ(metrics->body.find("kvfabric_router_retries_total 0"), std::string::npos);
  EXPECT_NE(metrics->body.find("kind=\"connect\""), std::string::npos);
}

TEST_F(ProxyTest, AllInstancesDownGivesBoundedJsonError) {
  start(2, "{kind: round_robin}", false, "health: {interval_s: 60}\nupstream: {max_attempts: 3}\n");
  engines_[0]->stop();
  engines_[1]->stop();
  auto r = call(post("/v1/completions", tokenPrompt(0, 64)));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 502);
  EXPECT_NE(r->body.find("\"error\""), std::string::npos);
}

TEST_F(ProxyTest, MidStreamFailureEndsWithSseErrorEvent) {
  start(1, "{kind: round_robin}", false);
  engines_[0]->cut_stream_after_chunks = 2;
  auto result = stream(post("/v1/completions", tokenPrompt(0, 64, true)));
  ASSERT_TRUE(result.ok()) << result.status();  // the client's stream ends cleanly
  auto& events = result->second;
  ASSERT_EQ(events.size(), 4u);
  EXPECT_NE(events[2].find("\"error\""), std::string::npos) << events[2];
  EXPECT_NE(events[2].find("mid-stream"), std::string::npos);
  EXPECT_EQ(events[3], "[DONE]");
  engines_[0]->cut_stream_after_chunks = -1;
  auto ok = call(post("/v1/completions", tokenPrompt(0, 64)));  // keeps serving
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->status, 200);
  EXPECT_TRUE(eventually([&] {
    auto state = instanceState("e0");
    return state["running"].as_int64() == 0 && state["pending_prefill_tokens"].as_int64() == 0;
  }));
}

TEST_F(ProxyTest, UnhealthyInstanceIsEjectedAndReadmitted) {
  start(2, "{kind: round_robin}", false,
        "health: {interval_s: 0.05, unhealthy_threshold: 2, healthy_threshold: 1}\n");
  engines_[1]->healthy = false;
  ASSERT_TRUE(eventually([&] { return !instanceState("e1")["admitted"].as_bool(); }));
  for (int i = 0; i < 3; ++i) {
    auto r = call(post("/v1/completions", tokenPrompt(0, 32)));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->header("x-kvf-instance"), "e0");
  }
  EXPECT_EQ(instanceState("e0")["waiting"].as_int64(), 3);  // scraped from /metrics
  engines_[1]->healthy = true;
  ASSERT_TRUE(eventually([&] { return instanceState("e1")["admitted"].as_bool(); }));
}

TEST_F(ProxyTest, AdminApiNeedsTokenAndManagesInstances) {
  start(2, "{kind: round_robin}", false);
  auto no_token = call(get("/admin/instances"));
  ASSERT_TRUE(no_token.ok());
  EXPECT_EQ(no_token->status, 401);
  auto wrong = call(get("/admin/instances", {{"Authorization", "Bearer nope"}}));
  EXPECT_EQ(wrong->status, 401);
  http::Headers auth = {{"Authorization", "Bearer s3cret"}};
  auto drain = call(post("/admin/instances/e0/drain", "", auth));
  ASSERT_TRUE(drain.ok());
  EXPECT_EQ(drain->status, 200);
  for (int i = 0; i < 3; ++i) {
    auto r = call(post("/v1/completions", tokenPrompt(0, 32)));
    EXPECT_EQ(r->header("x-kvf-instance"), "e1");
  }
  auto unknown = call(post("/admin/instances/e9/drain", "", auth));
  EXPECT_EQ(unknown->status, 404);
  EXPECT_NE(unknown->body.find("e9"), std::string::npos);
  auto bad_add = call(post("/admin/instances", R"({"id": "e2", "url": "nope"})", auth));
  EXPECT_EQ(bad_add->status, 400);
  EXPECT_NE(bad_add->body.find("url"), std::string::npos);
  auto add = call(
      post("/admin/instances", R"({"id": "e2", "url": ")" + engines_[0]->url() + R"("})", auth));
  EXPECT_EQ(add->status, 201) << add->body;
  auto remove = call(http::ClientRequest{"DELETE", "/admin/instances/e1", auth, "",
                                         "application/json", std::nullopt});
  EXPECT_EQ(remove->status, 200);
  auto r = call(post("/v1/completions", tokenPrompt(0, 32)));
  EXPECT_EQ(r->header("x-kvf-instance"), "e2");
  auto decisions = call(get("/admin/decisions", auth));
  auto obj = json::parseObject(decisions->body);
  ASSERT_TRUE(obj.ok());
  EXPECT_EQ((*obj)["decisions"].as_array().size(), 4u);
}

// A removed instance's series leave /metrics: a cluster that churns instances must not grow
// the exposition (and the router's memory) without bound.
TEST_F(ProxyTest, RemovedInstancesLeaveNoMetricSeries) {
  start(1, "{kind: round_robin}", false);
  http::Headers auth = {{"Authorization", "Bearer s3cret"}};
  for (int i = 0; i < 300; ++i) {
    std::string id = "churn-" + std::to_string(i);
    auto add =
        call(post("/admin/instances",
                  R"({"id": ")" + id + R"(", "url": ")" + engines_[0]->url() + R"("})", auth));
    ASSERT_TRUE(add.ok());
    ASSERT_EQ(add->status, 201) << add->body;
    if (i == 0) {  // one of them served a request and failed one, so every kind of series exists
      auto drain = call(post("/admin/instances/e0/drain", "", auth));
      ASSERT_EQ(drain->status, 200);
      auto r = call(post("/v1/completions", tokenPrompt(0, 32)));
      ASSERT_TRUE(r.ok());
      EXPECT_EQ(r->header("x-kvf-instance"), id);
      auto undrain = call(post("/admin/instances/e0/undrain", "", auth));
      ASSERT_EQ(undrain->status, 200);
    }
    auto remove = call(http::ClientRequest{"DELETE", "/admin/instances/" + id, auth, "",
                                           "application/json", std::nullopt});
    ASSERT_EQ(remove->status, 200);
  }
  auto m = call(get("/metrics"));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->body.find("churn-"), std::string::npos);
  EXPECT_NE(m->body.find("instance=\"e0\""), std::string::npos);  // the live one stays
  // The router still serves, and a re-added id starts fresh series.
  auto again = call(post("/admin/instances",
                         R"({"id": "churn-0", "url": ")" + engines_[0]->url() + R"("})", auth));
  EXPECT_EQ(again->status, 201);
  m = call(get("/metrics"));
  EXPECT_NE(m->body.find("kvfabric_router_instance_requests_total{instance=\"churn-0\"} 0"),
            std::string::npos);
}

TEST_F(ProxyTest, BadInputGets4xxJsonAndRouterKeepsServing) {
  start(1, "{kind: hybrid}", false, "listen: {port: 0, max_body_bytes: 65536}\n");
  struct Case {
    std::string body;
    std::string mentions;
  };
  std::vector<Case> cases = {{"{not json", "JSON"},
                             {R"({"prompt":[1,2]})", "model"},
                             {R"({"model":"m","prompt":{"a":1}})", "prompt"},
                             {R"({"model":"m","prompt":[1],"max_tokens":"x"})", "max_tokens"},
                             {R"([1,2,3])", "object"}};
  for (const auto& c : cases) {
    auto r = call(post("/v1/completions", c.body));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->status, 400) << c.body;
    EXPECT_NE(r->body.find(c.mentions), std::string::npos) << r->body;
    auto err = json::parseObject(r->body);
    ASSERT_TRUE(err.ok());
    EXPECT_TRUE(err->contains("error"));
  }
  auto big = call(post("/v1/completions", std::string(200000, ' ')));
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->status, 413);
  auto models = call(get("/v1/models"));
  ASSERT_TRUE(models.ok());
  EXPECT_NE(models->body.find("fake-model"), std::string::npos);
  auto health = call(get("/health"));
  EXPECT_EQ(health->status, 200);
  auto ok = call(post("/v1/completions", tokenPrompt(0, 32)));
  EXPECT_EQ(ok->status, 200);
}

// A large token-id body that arrives in pieces is read (and hashed) while it arrives: the
// decision and headers are the same as for a body read whole, and an invalid body still gets
// the 400 naming the field, after which the connection and router keep serving.
TEST_F(ProxyTest, PromptArrivingInPiecesIsReadAheadAndRoutedTheSame) {
  start(4, "{kind: hybrid}");
  waitSubscribed();
  // The prefix is cached on e2 by a request straight to the engine, so the index learns it
  // from the engine's events alone (no prediction made from the router's own hashes).
  auto engine = http::HttpClient::create(engine_io_.executor(), "127.0.0.1", engines_[2]->port());
  auto seeded = engine_io_.run([&]() -> asio::awaitable<absl::StatusOr<http::Response>> {
    co_return co_await engine->request(post("/v1/completions", tokenPrompt(0, 20000)));
  });
  ASSERT_TRUE(seeded.ok()) << seeded.status();
  ASSERT_EQ(seeded->status, 200);
  std::string home = "e2";
  ASSERT_TRUE(eventually([&] { return instanceState(home)["index_blocks"].as_int64() == 1250; }));
  auto inPieces = [&](const std::string& body) {
    return engine_io_.run([&]() -> asio::awaitable<std::string> {
      asio::ip::tcp::socket socket(co_await asio::this_coro::executor);
      co_await socket.async_connect({asio::ip::make_address("127.0.0.1"), router_->port()},
                                    asio::use_awaitable);
      std::string head =
          "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Session-Id: s1\r\n"
          "Connection: close\r\nContent-Length: " +
          std::to_string(body.size()) + "\r\n\r\n";
      asio::steady_timer pause(co_await asio::this_coro::executor);
      std::string pieces[] = {head + body.substr(0, 3000), body.substr(3000, 40000),
                              body.substr(43000)};
      for (const auto& piece : pieces) {
        co_await asio::async_write(socket, asio::buffer(piece), asio::use_awaitable);
        pause.expires_after(30ms);
        co_await pause.async_wait(asio::use_awaitable);
      }
      co_return co_await kvf::testing::readUntilClosed(socket);
    });
  };
  std::string body = tokenPrompt(0, 24000);
  std::string raw = inPieces(body);
  ASSERT_EQ(raw.rfind("HTTP/1.1 200", 0), 0u) << raw.substr(0, 300);
  EXPECT_NE(raw.find("x-kvf-instance: " + home + "\r\n"), std::string::npos) << raw;
  EXPECT_NE(raw.find("x-kvf-reason: cache_gate\r\n"), std::string::npos) << raw;
  EXPECT_NE(raw.find("x-kvf-predicted-cached-tokens: 20000\r\n"), std::string::npos) << raw;
  std::string bad = body;
  bad.replace(bad.rfind(",23990,"), 7, ",-23990,");  // an invalid id late in the prompt
  std::string rejected = inPieces(bad);
  EXPECT_EQ(rejected.rfind("HTTP/1.1 400", 0), 0u) << rejected.substr(0, 300);
  EXPECT_NE(rejected.find("prompt[23990]"), std::string::npos) << rejected;
  auto after = call(post("/v1/completions", tokenPrompt(0, 32)));
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->status, 200);
}

TEST_F(ProxyTest, ChatPromptsTokenizedThroughTheEngineHashExactly) {
  start(3, "{kind: hybrid}", true, "tokenize: {enabled: true}\n");
  waitSubscribed();
  std::string history(1000, 'a');
  auto turn = [&](const std::string& messages) {
    std::string body = R"({"model":"fake-model","user":"chat-1","messages":[)" + messages + "]}";
    return call(post("/v1/chat/completions", body));
  };
  auto first = turn(R"({"role":"user","content":")" + history + R"("})");
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->status, 200) << first->body;
  std::string home(first->header("x-kvf-instance"));
  // The engine's tokenizer (one token per byte here) gives the router exact token ids, so the
  // prediction matches what the engine's prefix cache reports: 62 full blocks of 16.
  auto second = turn(R"({"role":"user","content":")" + history +
                     R"("},{"role":"assistant","content":"ok"},{"role":"user","content":"more"})");
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->header("x-kvf-instance"), home);
  EXPECT_EQ(second->header("x-kvf-predicted-cached-tokens"), "992");
  ASSERT_TRUE(eventually([&] { return decisionLog().size() == 2; }));
  auto log = decisionLog();
  EXPECT_EQ(log[1]["actual_cached_tokens"].as_int64(), 992);
  EXPECT_EQ(log[1]["prompt_tokens"].as_int64(), 1006);
  EXPECT_EQ(log[1]["session"].as_string(), "chat-1");
}

TEST_F(ProxyTest, StreamIsPassedThroughAsProducedNotBuffered) {
  start(1, "{kind: round_robin}", false, "", [](fakes::FakeEngineOptions& o) {
    o.output_tokens = 3;
    o.token_delay = 400ms;
  });
  http::ClientRequest request = post("/v1/completions", tokenPrompt(0, 64, true));
  auto gaps = engine_io_.run(
      [&]() -> asio::awaitable<absl::StatusOr<std::pair<double, double>>> {
        auto begin = std::chrono::steady_clock::now();
        auto s = co_await client_->open(request);
        if (!s.ok()) co_return s.status();
        double first = -1;
        for (;;) {
          auto piece = co_await (*s)->next();
          if (!piece.ok()) co_return piece.status();
          if (!piece->has_value()) break;
          if (first < 0) {
            first = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
          }
        }
        double end =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
        co_return std::make_pair(first, end);
      },
      20s);
  ASSERT_TRUE(gaps.ok()) << gaps.status();
  // The engine spends ~1.2 s on three tokens; the first must reach the client long before the
  // end (a buffering proxy would deliver everything at once).
  EXPECT_GT(gaps->second - gaps->first, 0.6) << gaps->first << " " << gaps->second;
}

TEST_F(ProxyTest, ClientDisconnectCancelsUpstreamAndReleasesLoad) {
  start(1, "{kind: round_robin}", false, "", [](fakes::FakeEngineOptions& o) {
    o.output_tokens = 50;
    o.token_delay = 100ms;
  });
  http::ClientRequest request = post("/v1/completions", tokenPrompt(0, 64, true));
  auto first = engine_io_.run([&]() -> asio::awaitable<absl::Status> {
    auto s = co_await client_->open(request);
    if (!s.ok()) co_return s.status();
    auto piece = co_await (*s)->next();  // one chunk, then hang up
    (*s)->cancel();
    co_return piece.status();
  });
  ASSERT_TRUE(first.ok()) << first;
  // The router notices on its next write, cancels the engine's stream and releases the load.
  EXPECT_TRUE(eventually([&] { return engines_[0]->running.load() == 0; }, 15s));
  EXPECT_TRUE(eventually([&] {
    auto state = instanceState("e0");
    return state["running"].as_int64() == 0 && state["pending_prefill_tokens"].as_int64() == 0;
  }));
}

// Sends a whole HTTP request for `body` on a new blocking connection to the router and
// returns the socket, left open (the caller closes it: a client that hangs up).
int sendRaw(uint16_t port, const std::string& body) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return -1;
  std::string request =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
      "application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return -1;
  }
  return fd;
}

TEST_F(ProxyTest, NonStreamingClientDisconnectCancelsUpstreamWhileWaiting) {
  start(1, "{kind: round_robin}", false, "", [](fakes::FakeEngineOptions&) {});
  engines_[0]->first_byte_delay_ms = 30'000;  // a prefill far longer than the test
  int fd = sendRaw(router_->port(), tokenPrompt(0, 64));
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(eventually([&] { return engines_[0]->waiting_first_byte.load() == 1; }));
  ::close(fd);  // the client gives up while the router waits for the engine's answer
  // The router noticed the closed socket without writing to it, and closed its upstream
  // connection: the engine saw its client go long before its answer was due.
  EXPECT_TRUE(eventually([&] { return engines_[0]->abandoned.load() == 1; }, 5s));
  EXPECT_TRUE(eventually([&] {
    auto state = instanceState("e0");
    return state["running"].as_int64() == 0 && state["pending_prefill_tokens"].as_int64() == 0 &&
           state["requests_in_flight"].as_int64() == 0;
  }));
  EXPECT_TRUE(eventually([&] {
    auto m = call(get("/metrics"));
    return m.ok() &&
           m->body.find("kvfabric_router_requests_cancelled_total 1\n") != std::string::npos;
  }));
  ASSERT_TRUE(eventually([&] { return decisionLog().size() == 1; }));
  EXPECT_EQ(decisionLog()[0]["status"].as_int64(), 499);
  EXPECT_EQ(engines_[0]->requests.load(), 1);  // and it was not retried anywhere
}

TEST_F(ProxyTest, StreamingClientDisconnectBeforeFirstTokenCancelsUpstream) {
  start(1, "{kind: round_robin}", false);
  engines_[0]->first_byte_delay_ms = 30'000;
  int fd = sendRaw(router_->port(), tokenPrompt(0, 64, true));
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(eventually([&] { return engines_[0]->waiting_first_byte.load() == 1; }));
  ::close(fd);  // nothing was written to it yet: only a watch on the socket can tell
  EXPECT_TRUE(eventually([&] { return engines_[0]->abandoned.load() == 1; }, 5s));
  EXPECT_TRUE(eventually([&] { return instanceState("e0")["running"].as_int64() == 0; }));
}

TEST_F(ProxyTest, ClientThatLeftWhileQueuedIsNeverSentUpstream) {
  start(1, "{kind: round_robin}", false,
        "overload: {enabled: true, max_running: 1, max_wait_s: 60}\n");
  engines_[0]->first_byte_delay_ms = 30'000;
  int busy = sendRaw(router_->port(), tokenPrompt(0, 64));  // takes the only slot
  ASSERT_GE(busy, 0);
  ASSERT_TRUE(eventually([&] { return engines_[0]->waiting_first_byte.load() == 1; }));
  int queued = sendRaw(router_->port(), tokenPrompt(1000, 64));
  ASSERT_GE(queued, 0);
  ASSERT_TRUE(eventually([&] {
    auto m = call(get("/metrics"));
    return m.ok() && m->body.find("kvfabric_router_queue_depth 1\n") != std::string::npos;
  }));
  ::close(queued);
  EXPECT_TRUE(eventually([&] {
    auto m = call(get("/metrics"));
    return m.ok() && m->body.find("kvfabric_router_queue_depth 0\n") != std::string::npos &&
           m->body.find("kvfabric_router_requests_cancelled_total 1\n") != std::string::npos;
  }));
  ::close(busy);  // frees the slot: the orphaned request must not take it
  EXPECT_TRUE(eventually([&] { return engines_[0]->abandoned.load() == 1; }, 5s));
  EXPECT_TRUE(eventually([&] { return instanceState("e0")["running"].as_int64() == 0; }));
  EXPECT_EQ(engines_[0]->requests.load(), 1);
}

TEST_F(ProxyTest, LongPrefillOnALiveEngineIsNotAStall) {
  // Nothing comes back for 1.5 s, three stall windows; health checks answer throughout.
  start(2, "{kind: round_robin}", false,
        "health: {interval_s: 0.1}\nupstream: {stall_timeout_s: 0.5}\n");
  engines_[0]->first_byte_delay_ms = 1500;
  engines_[1]->first_byte_delay_ms = 1500;
  auto r = call(post("/v1/completions", tokenPrompt(0, 64)));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(engines_[0]->requests.load() + engines_[1]->requests.load(), 1);  // no retry
  auto m = call(get("/metrics"));
  ASSERT_TRUE(m.ok());
  EXPECT_NE(m->body.find("kvfabric_router_instance_stalls_total{instance=\"e0\"} 0"),
            std::string::npos);
  EXPECT_NE(m->body.find("kvfabric_router_instance_stalls_total{instance=\"e1\"} 0"),
            std::string::npos);
}

TEST_F(ProxyTest, ConsecutiveFailuresOpenTheCircuit) {
  start(2, "{kind: round_robin}", false,
        "health: {interval_s: 60}\nupstream: {circuit_failure_threshold: 2, circuit_open_s: 60}\n");
  engines_[0]->stop();
  for (int i = 0; i < 6; ++i) {
    auto r = call(post("/v1/completions", tokenPrompt(i, 32)));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->status, 200);
  }
  EXPECT_TRUE(instanceState("e0")["circuit_open"].as_bool());
  EXPECT_FALSE(instanceState("e0")["admitted"].as_bool());
  auto metrics = call(get("/metrics"));
  ASSERT_TRUE(metrics.ok());
  EXPECT_NE(metrics->body.find("kvfabric_router_instance_circuit_opens_total{instance=\"e0\"} 1"),
            std::string::npos);
  // With the circuit open, e0 is no longer tried: exactly two connect failures were seen.
  EXPECT_NE(metrics->body.find(
                "kvfabric_router_upstream_errors_total{instance=\"e0\",kind=\"connect\"} 2"),
            std::string::npos)
      << metrics->body;
}

TEST_F(ProxyTest, SilentMissIsCountedWhenTheEngineLostThePrediction) {
  start(1, "{kind: hybrid}", false);  // no events: approximate index entries
  auto first = call(post("/v1/completions", tokenPrompt(0, 1024)));
  ASSERT_TRUE(first.ok());
  engine_io_.run([&]() -> asio::awaitable<void> {
    engines_[0]->clearCache();  // on the engine's thread; no event reaches the router
    co_return;
  });
  auto again = call(post("/v1/completions", tokenPrompt(0, 1024)));
  ASSERT_TRUE(again.ok());
  // The whole block-aligned prompt is indexed, but the engine computes its last token.
  EXPECT_EQ(again->header("x-kvf-predicted-cached-tokens"), "1008");
  ASSERT_TRUE(eventually([&] { return decisionLog().size() == 2; }));
  auto log = decisionLog();
  EXPECT_EQ(log[1]["actual_cached_tokens"].as_int64(), 0);
  auto metrics = call(get("/metrics"));
  ASSERT_TRUE(metrics.ok());
  EXPECT_NE(metrics->body.find("kvfabric_router_cache_silent_misses_total 1"), std::string::npos);
  EXPECT_NE(metrics->body.find("kvfabric_router_cache_prediction_error_tokens_count 2"),
            std::string::npos);
}

// An unset max_tokens gets the router's default and a larger one its cap: the engine sees the
// value the router accounts for. Request ids carry the process's random prefix, and an error
// names its field (param) and status (code) as vLLM's do.
TEST_F(ProxyTest, MaxTokensDefaultAndCapReachTheEngineAndIdsAreUnique) {
  start(1, "{kind: hybrid}", false, "requests: {default_max_tokens: 7, max_tokens_limit: 20}\n");
  std::vector<std::string> ids;
  for (const char* extra : {"", R"(,"max_tokens":500)", R"(,"max_tokens":5)"}) {
    auto r = call(
        post("/v1/completions", std::string(R"({"model":"m","prompt":[1,2,3])") + extra + "}"));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->status, 200) << r->body;
    ids.emplace_back(r->header("x-kvf-request-id"));
  }
  std::vector<int64_t> seen;
  for (const std::string& body : engines_[0]->receivedBodies()) {
    auto obj = json::parseObject(body);
    ASSERT_TRUE(obj.ok()) << body;
    seen.push_back(obj->at("max_tokens").as_int64());
  }
  EXPECT_EQ(seen, (std::vector<int64_t>{7, 20, 5}));
  // "kvf-<8 hex digits>-<n>": the prefix differs between router processes.
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[0].size(), 14u) << ids[0];
  EXPECT_EQ(ids[0].substr(0, 13), ids[1].substr(0, 13));
  EXPECT_NE(ids[0], ids[1]);

  auto bad = call(post("/v1/completions", R"({"model":"m","prompt":[1],"max_tokens":"x"})"));
  ASSERT_TRUE(bad.ok());
  auto err = json::parseObject(bad->body);
  ASSERT_TRUE(err.ok()) << bad->body;
  const auto& e = err->at("error").as_object();
  EXPECT_EQ(e.at("param"), "max_tokens") << bad->body;
  EXPECT_EQ(e.at("code"), 400) << bad->body;
}

// Text prompts without tokenize are indexed approximately and counted as such. Their length
// is only estimated (4 bytes per token) while a real tokenizer takes more bytes per token (8
// here), so the engine's own count caps the prediction as a token prompt's length does: at most
// the full blocks of its prompt_tokens - 1, in the header of a response read whole and in
// every decision-log line.
TEST_F(ProxyTest, ApproximatePredictionsStayWithinTheEnginesPromptAndFallbacksAreCounted) {
  start(1, "{kind: hybrid}", true, "",
        [](fakes::FakeEngineOptions& o) { o.text_bytes_per_token = 8; });
  std::string text;
  for (int i = 0; text.size() < 4000; ++i) text += "word" + std::to_string(i % 97) + " ";
  text.resize(4000);
  auto body = [&](bool stream) {
    return R"({"model":"fake-model","max_tokens":4,"stream":)" +
           std::string(stream ? R"(true,"stream_options":{"include_usage":true})" : "false") +
           R"(,"prompt":")" + text + R"("})";
  };
  for (int i = 0; i < 12; ++i) {
    auto r = call(post("/v1/completions", body(i % 3 == 2)));
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->status, 200) << r->body;
    if (i > 0 && i % 3 != 2) {
      // The index matches 62 text blocks of 64 bytes (992 estimated tokens); the engine counts
      // 500 tokens: at most 496 can be cached.
      EXPECT_EQ(r->header("x-kvf-predicted-cached-tokens"), "496") << i;
    }
  }
  ASSERT_TRUE(eventually([&] { return decisionLog().size() == 12; }));
  for (auto& record : decisionLog()) {
    EXPECT_EQ(record["prompt_tokens"].as_int64(), 500);
    EXPECT_LE(record["predicted_cached_tokens"].as_int64(), 496);
  }
  auto m = call(get("/metrics"));
  ASSERT_TRUE(m.ok());
  EXPECT_NE(m->body.find("kvfabric_router_tokenize_fallbacks_total{reason=\"disabled\"} 12\n"),
            std::string::npos)
      << m->body;
  EXPECT_NE(m->body.find("kvfabric_router_tokenize_fallbacks_total{reason=\"failed\"} 0\n"),
            std::string::npos);
}

TEST_F(ProxyTest, FailedTokenizeFallsBackToTheApproximateIndexAndIsCounted) {
  start(1, "{kind: hybrid}", true, "tokenize: {enabled: true}\n");
  engines_[0]->tokenize_fails = true;
  for (int i = 0; i < 3; ++i) {
    auto r = call(post("/v1/completions", R"({"model":"fake-model","max_tokens":2,"prompt":")" +
                                              std::string(200, 'x') + R"("})"));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->status, 200);
  }
  engines_[0]->tokenize_fails = false;
  ASSERT_TRUE(
      call(post("/v1/completions", R"({"model":"fake-model","max_tokens":2,"prompt":"tokenized"})"))
          .ok());
  auto m = call(get("/metrics"));
  ASSERT_TRUE(m.ok());
  EXPECT_NE(m->body.find("kvfabric_router_tokenize_fallbacks_total{reason=\"failed\"} 3\n"),
            std::string::npos)
      << m->body;
  EXPECT_NE(m->body.find("kvfabric_router_tokenize_fallbacks_total{reason=\"disabled\"} 0\n"),
            std::string::npos);
}

}  // namespace
}  // namespace kvf::router
