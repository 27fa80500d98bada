#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/json.hpp>

#include "common/http_client.h"
#include "common/http_server.h"
#include "common/json.h"
#include "common/sse.h"
#include "tests/testing/io_thread.h"
#include "tests/testing/socket_read.h"

namespace kvf::http {
namespace {

using namespace std::chrono_literals;
using tcp = asio::ip::tcp;

using kvf::testing::readUntilClosed;

// Requests are built outside coroutines: GCC 12 miscompiles aggregate initializers holding
// string literals inside a co_await expression ("array used as initializer").
ClientRequest makeRequest(std::string method, std::string target, std::string body = {},
                          Headers headers = {}) {
  ClientRequest r;
  r.method = std::move(method);
  r.target = std::move(target);
  r.body = std::move(body);
  r.headers = std::move(headers);
  return r;
}

class HttpTest : public ::testing::Test {
 protected:
  absl::StatusOr<Response> call(ClientRequest request) {
    return io_.run([&]() -> asio::awaitable<absl::StatusOr<Response>> {
      co_return co_await client_->request(request);
    });
  }

  void startServer(ServerOptions options = {}) {
    auto server = HttpServer::create(io_.context(), options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    server_->route("GET", "/hello", [](const Request&, ResponseWriter& w) -> asio::awaitable<void> {
      co_await w.send(200, "text/plain", "hello");
    });
    server_->route("POST", "/echo",
                   [](const Request& r, ResponseWriter& w) -> asio::awaitable<void> {
                     auto body = json::parseObject(r.body);
                     if (!body.ok()) {
                       co_await w.sendStatus(body.status());
                       co_return;
                     }
                     (*body)["echoed"] = true;
                     (*body)["session"] = std::string(r.header("x-session-id"));
                     co_await w.sendJson(200, json::serialize(*body));
                   });
    server_->routePrefix(
        "GET", "/items/", [](const Request& r, ResponseWriter& w) -> asio::awaitable<void> {
          co_await w.send(200, "text/plain", r.path.substr(7) + "|" + queryParam(r.query, "q"));
        });
    server_->route("GET", "/stream",
                   [this](const Request&, ResponseWriter& w) -> asio::awaitable<void> {
                     co_await streamHandler(w);
                   });
    server_->route("GET", "/big", [](const Request&, ResponseWriter& w) -> asio::awaitable<void> {
      co_await w.send(200, "text/plain", std::string(64u << 20, 'b'));
    });
    server_->route("GET", "/slow", [](const Request&, ResponseWriter& w) -> asio::awaitable<void> {
      asio::steady_timer t(co_await asio::this_coro::executor, 300ms);
      co_await t.async_wait(asio::use_awaitable);
      co_await w.send(200, "text/plain", "late");
    });
    server_->start();
    client_ = HttpClient::create(io_.executor(), "127.0.0.1", server_->port());
  }

  // Produces event i only once the client has received event i-1, so the test can only pass if
  // every event is flushed as it is produced rather than buffered.
  asio::awaitable<void> streamHandler(ResponseWriter& w) {
    auto s = co_await w.beginStream(200, "text/event-stream");
    if (!s.ok()) co_return;
    asio::steady_timer timer(co_await asio::this_coro::executor);
    for (int i = 0; i < kEvents; ++i) {
      auto deadline = std::chrono::steady_clock::now() + 5s;
      while (received_.load() < i) {
        if (std::chrono::steady_clock::now() > deadline) {
          lockstep_failed_ = true;
          co_return;
        }
        timer.expires_after(1ms);
        co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
      }
      s = co_await w.writeEvent("{\"seq\":" + std::to_string(i) + "}");
      if (!s.ok()) co_return;
    }
    s = co_await w.writeEvent("[DONE]");
    if (s.ok()) co_await w.endStream();
  }

  // Sends raw bytes on a fresh connection and returns everything the server sends back until
  // it closes the connection (or 5 s pass).
  std::string rawExchange(const std::string& bytes) {
    return io_.run([&]() -> asio::awaitable<std::string> {
      tcp::socket socket(co_await asio::this_coro::executor);
      co_await socket.async_connect({asio::ip::make_address("127.0.0.1"), server_->port()},
                                    asio::use_awaitable);
      co_await asio::async_write(socket, asio::buffer(bytes), asio::use_awaitable);
      co_return co_await readUntilClosed(socket);
    });
  }

  static constexpr int kEvents = 1000;
  testing::IoThread io_;
  std::unique_ptr<HttpServer> server_;
  std::shared_ptr<HttpClient> client_;
  std::atomic<int> received_{0};
  std::atomic<bool> lockstep_failed_{false};
};

TEST_F(HttpTest, RoundTripAndKeepAlive) {
  startServer();
  auto r = call(makeRequest("GET", "/hello"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "hello");
  EXPECT_EQ(client_->idleConnections(), 1u);

  auto e = call(makeRequest("POST", "/echo", R"({"n": 5})", {{"X-Session-Id", std::string("s1")}}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->status, 200);
  auto obj = json::parseObject(e->body);
  ASSERT_TRUE(obj.ok());
  EXPECT_EQ((*obj)["n"].as_int64(), 5);
  EXPECT_EQ((*obj)["session"].as_string(), "s1");
  EXPECT_EQ(client_->idleConnections(), 1u);  // the same connection was reused
  EXPECT_EQ(server_->activeConnections(), 1u);
}

// A body given as a view is sent as is (no copy), in one request with a large body whose bytes
// arrive over many reads, and the server reads it whole.
TEST_F(HttpTest, BodyViewIsSentWithoutCopyAndLargeBodiesArriveWhole) {
  startServer();
  std::string big = R"({"pad":")" + std::string(3 << 20, 'x') + R"(","n":7})";
  ClientRequest request = makeRequest("POST", "/echo");
  request.body = "ignored when body_view is set";
  request.body_view = big;
  auto r = call(request);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200) << r->body;
  auto obj = json::parseObject(r->body);
  ASSERT_TRUE(obj.ok());
  EXPECT_EQ((*obj)["n"].as_int64(), 7);
  EXPECT_EQ((*obj)["pad"].as_string().size(), 3u << 20);
  EXPECT_EQ(client_->idleConnections(), 1u);  // body fully read: the connection was reused
}

TEST_F(HttpTest, PrefixRoutesQueryAndErrors) {
  startServer();
  auto get = [&](std::string method, std::string target) {
    return call(makeRequest(method, target));
  };
  auto item = get("GET", "/items/abc?q=a+b%21");
  ASSERT_TRUE(item.ok());
  EXPECT_EQ(item->body, "abc|a b!");

  auto missing = get("GET", "/nope");
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(missing->header("content-type"), "application/json");
  auto err = json::parseObject(missing->body);
  ASSERT_TRUE(err.ok());
  EXPECT_EQ((*err)["error"].as_object()["code"].as_int64(), 404);
  EXPECT_EQ((*err)["error"].as_object()["type"].as_string(), "not_found_error");

  auto wrong_method = get("DELETE", "/hello");
  ASSERT_TRUE(wrong_method.ok());
  EXPECT_EQ(wrong_method->status, 405);

  auto bad_json = call(makeRequest("POST", "/echo", "{nope"));
  ASSERT_TRUE(bad_json.ok());
  EXPECT_EQ(bad_json->status, 400);
  EXPECT_NE(bad_json->body.find("malformed JSON"), std::string::npos);
}

TEST_F(HttpTest, ThousandSseEventsArriveInOrderWhileProduced) {
  startServer();
  ClientRequest stream_request = makeRequest("GET", "/stream");
  auto result = io_.run(
      [&]() -> asio::awaitable<absl::Status> {
        auto stream = co_await client_->open(stream_request);
        if (!stream.ok()) co_return stream.status();
        if ((*stream)->header("content-type") != "text/event-stream") {
          co_return absl::InternalError("wrong content type");
        }
        sse::Parser parser;
        bool done = false;
        absl::Status order = absl::OkStatus();
        while (!done) {
          auto piece = co_await (*stream)->next();
          if (!piece.ok()) co_return piece.status();
          if (!piece->has_value()) break;
          auto s = parser.feed(**piece, [&](sse::Event&& e) {
            if (e.data == "[DONE]") {
              done = true;
              return;
            }
            std::string expected = "{\"seq\":" + std::to_string(received_.load()) + "}";
            if (e.data != expected) order = absl::InternalError("out of order: " + e.data);
            received_.fetch_add(1);
          });
          if (!s.ok()) co_return s;
        }
        if (!done) co_return absl::InternalError("stream ended without [DONE]");
        co_return order;
      },
      60s);
  EXPECT_TRUE(result.ok()) << result;
  EXPECT_FALSE(lockstep_failed_.load()) << "server could not observe client progress: buffered";
  EXPECT_EQ(received_.load(), kEvents);
}

TEST_F(HttpTest, OversizedBodyGets413AndServerKeepsServing) {
  ServerOptions options;
  options.max_body_bytes = 1024;
  startServer(options);
  auto big = call(makeRequest("POST", "/echo", std::string(4096, 'x')));
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->status, 413);
  auto err = json::parseObject(big->body);
  ASSERT_TRUE(err.ok()) << big->body;
  EXPECT_EQ((*err)["error"].as_object()["code"].as_int64(), 413);

  // A chunked body over the limit is caught while it streams in.
  std::string chunked = "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 4; ++i) chunked += "200\r\n" + std::string(512, 'y') + "\r\n";
  chunked += "0\r\n\r\n";
  std::string raw = rawExchange(chunked);
  EXPECT_EQ(raw.rfind("HTTP/1.1 413", 0), 0u) << raw;

  auto ok = call(makeRequest("POST", "/echo", "{}"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->status, 200);
}

TEST_F(HttpTest, MalformedRequestLineGets400) {
  startServer();
  std::string raw = rawExchange("GARBAGE\r\n\r\n");
  EXPECT_EQ(raw.rfind("HTTP/1.1 400", 0), 0u) << raw;
  EXPECT_NE(raw.find("\"error\""), std::string::npos) << raw;
  raw = rawExchange("GET /hello HTTP/9.9\r\n\r\n");
  EXPECT_EQ(raw.rfind("HTTP/1.1 400", 0), 0u) << raw;
}

TEST_F(HttpTest, OversizedHeadersGet431) {
  ServerOptions options;
  options.max_header_bytes = 512;
  startServer(options);
  std::string raw = rawExchange(
      "GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(2048, 'a') + "\r\n\r\n");
  EXPECT_EQ(raw.rfind("HTTP/1.1 431", 0), 0u) << raw;
}

TEST_F(HttpTest, IdleConnectionClosedAfterTimeout) {
  ServerOptions options;
  options.idle_timeout = 200ms;
  startServer(options);
  auto start = std::chrono::steady_clock::now();
  std::string raw = rawExchange("");  // connect, send nothing
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(raw, "");
  EXPECT_GE(elapsed, 150ms);
  EXPECT_LT(elapsed, 3s);
}

// A response larger than the socket buffers is written in part at once and the rest
// asynchronously; a client that never reads still meets the write timeout (the connection is
// closed, not left hanging) and the server keeps serving others.
TEST_F(HttpTest, WriteTimeoutAppliesWhenAResponseDoesNotFitTheSocket) {
  ServerOptions options;
  options.write_timeout = 200ms;
  startServer(options);
  // A raw client asks for the big response and never reads it.
  tcp::socket idle_reader(io_.context());
  idle_reader.connect({asio::ip::make_address("127.0.0.1"), server_->port()});
  std::string get = "GET /big HTTP/1.1\r\nHost: x\r\n\r\n";
  asio::write(idle_reader, asio::buffer(get));
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (server_->activeConnections() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(server_->activeConnections(), 1u);
  auto start = std::chrono::steady_clock::now();
  while (server_->activeConnections() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(server_->activeConnections(), 0u) << "the stalled write was not timed out";
  EXPECT_GE(std::chrono::steady_clock::now() - start, 100ms);
  auto hello = call(makeRequest("GET", "/hello"));
  ASSERT_TRUE(hello.ok()) << hello.status();
  EXPECT_EQ(hello->body, "hello");
}

// Headers are parsed as their bytes arrive: one split over several writes is read whole, two
// pipelined requests in one write both get their answer, and a peer that closes mid-header
// gets no answer (the connection just closes).
TEST_F(HttpTest, HeadersSplitAcrossReadsPipelinedAndTruncated) {
  startServer();
  std::string raw = io_.run([&]() -> asio::awaitable<std::string> {
    tcp::socket socket(co_await asio::this_coro::executor);
    co_await socket.async_connect({asio::ip::make_address("127.0.0.1"), server_->port()},
                                  asio::use_awaitable);
    asio::steady_timer pause(co_await asio::this_coro::executor);
    std::string pieces[] = {"GET /hel", "lo HTTP/1.1\r\nHo", "st: x\r\n",
                            "\r\nGET /items/a?q=1 HTTP/1.1\r\nHost: x\r\n\r\n"
                            "GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"};
    for (const auto& piece : pieces) {
      co_await asio::async_write(socket, asio::buffer(piece), asio::use_awaitable);
      pause.expires_after(20ms);  // let the server see each piece on its own
      co_await pause.async_wait(asio::use_awaitable);
    }
    co_return co_await readUntilClosed(socket);
  });
  size_t first = raw.find("\r\n\r\nhello");
  size_t second = raw.find("\r\n\r\na|1");
  size_t third = raw.find("\r\n\r\nhello", second == std::string::npos ? 0 : second);
  EXPECT_NE(first, std::string::npos) << raw;
  EXPECT_NE(second, std::string::npos) << raw;
  EXPECT_NE(third, std::string::npos) << raw;
  EXPECT_LT(first, second);
  EXPECT_EQ(raw.rfind("HTTP/1.1 200", 0), 0u) << raw;

  std::string truncated = io_.run([&]() -> asio::awaitable<std::string> {
    tcp::socket socket(co_await asio::this_coro::executor);
    co_await socket.async_connect({asio::ip::make_address("127.0.0.1"), server_->port()},
                                  asio::use_awaitable);
    std::string partial = "GET /hello HTTP/1.1\r\nHost: x\r\n";
    co_await asio::async_write(socket, asio::buffer(partial), asio::use_awaitable);
    socket.shutdown(tcp::socket::shutdown_send);  // the peer goes away mid-header
    co_return co_await readUntilClosed(socket);
  });
  EXPECT_EQ(truncated, "");  // closed without an answer (not after the 30 s read timeout)
}

// Records what a body observer was shown.
class RecordingObserver final : public BodyObserver {
 public:
  void onBody(std::string_view received, size_t total) override {
    // Each call shows a longer prefix of the same bytes.
    ok = ok && received.size() >= seen.size() && received.substr(0, seen.size()) == seen;
    seen = std::string(received);
    total_seen = total;
    ++calls;
  }
  std::string seen;
  size_t total_seen = 0;
  int calls = 0;
  bool ok = true;
};

// A route's body observer sees a sized body grow while it arrives in pieces, the handler gets
// it whole, bytes after it (a pipelined request) stay for the next request, and a body cut short
// reaches no handler.
TEST_F(HttpTest, BodyObserverSeesSizedBodiesArriveAndPipelinedRequestsSurvive) {
  startServer();
  std::vector<std::shared_ptr<RecordingObserver>> observers;
  std::vector<std::string> bodies;
  server_->route(
      "POST", "/observed",
      [&](const Request& r, ResponseWriter& w) -> asio::awaitable<void> {
        bodies.push_back(r.body);
        EXPECT_EQ(r.body_observer.get(), observers.back().get());
        co_await w.send(200, "text/plain", std::to_string(r.body.size()));
      },
      [&](const Request& head) -> std::shared_ptr<BodyObserver> {
        EXPECT_EQ(head.path, "/observed");
        EXPECT_TRUE(head.body.empty());
        observers.push_back(std::make_shared<RecordingObserver>());
        return observers.back();
      });
  std::string body(200000, 'a');
  for (size_t i = 0; i < body.size(); ++i) body[i] = static_cast<char>('a' + i % 26);
  std::string head =
      "POST /observed HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n\r\n";
  std::string raw = io_.run([&]() -> asio::awaitable<std::string> {
    tcp::socket socket(co_await asio::this_coro::executor);
    co_await socket.async_connect({asio::ip::make_address("127.0.0.1"), server_->port()},
                                  asio::use_awaitable);
    asio::steady_timer pause(co_await asio::this_coro::executor);
    std::string pieces[] = {head + body.substr(0, 1000), body.substr(1000, 50000),
                            body.substr(51000) +
                                "POST /observed HTTP/1.1\r\nHost: x\r\n"
                                "Content-Length: 3\r\nConnection: close\r\n\r\nxyz"};
    for (const auto& piece : pieces) {
      co_await asio::async_write(socket, asio::buffer(piece), asio::use_awaitable);
      pause.expires_after(20ms);
      co_await pause.async_wait(asio::use_awaitable);
    }
    co_return co_await readUntilClosed(socket);
  });
  ASSERT_EQ(bodies.size(), 2u) << raw;
  EXPECT_EQ(bodies[0], body);
  EXPECT_EQ(bodies[1], "xyz");
  ASSERT_EQ(observers.size(), 2u);
  EXPECT_TRUE(observers[0]->ok);
  EXPECT_GE(observers[0]->calls, 3);  // the body arrived in at least three pieces
  EXPECT_EQ(observers[0]->seen, body);
  EXPECT_EQ(observers[0]->total_seen, body.size());
  EXPECT_EQ(observers[1]->seen, "xyz");
  EXPECT_NE(raw.find("\r\n\r\n200000"), std::string::npos) << raw;
  EXPECT_NE(raw.find("\r\n\r\n3"), std::string::npos) << raw;

  std::string cut = io_.run([&]() -> asio::awaitable<std::string> {
    tcp::socket socket(co_await asio::this_coro::executor);
    co_await socket.async_connect({asio::ip::make_address("127.0.0.1"), server_->port()},
                                  asio::use_awaitable);
    std::string partial = head + body.substr(0, 5000);
    co_await asio::async_write(socket, asio::buffer(partial), asio::use_awaitable);
    socket.shutdown(tcp::socket::shutdown_send);  // the peer goes away mid-body
    co_return co_await readUntilClosed(socket);
  });
  EXPECT_EQ(cut, "");
  EXPECT_EQ(bodies.size(), 2u);
  ASSERT_EQ(observers.size(), 3u);
  EXPECT_EQ(observers[2]->seen, body.substr(0, 5000));
}

TEST_F(HttpTest, ClientReadTimeoutAndStaleConnectionRetry) {
  ServerOptions options;
  options.idle_timeout = 100ms;
  startServer(options);
  ClientRequest slow_request = makeRequest("GET", "/slow");
  slow_request.read_timeout = 50ms;
  auto slow = call(slow_request);
  EXPECT_EQ(slow.status().code(), absl::StatusCode::kDeadlineExceeded) << slow.status();

  auto first = call(makeRequest("GET", "/hello"));
  ASSERT_TRUE(first.ok());
  std::this_thread::sleep_for(300ms);  // the server closes the pooled connection meanwhile
  auto second = call(makeRequest("GET", "/hello"));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->body, "hello");
}

TEST_F(HttpTest, ConnectErrorIsUnavailable) {
  startServer();
  uint16_t port = server_->port();
  server_->stop();
  server_.reset();
  std::this_thread::sleep_for(50ms);
  auto client = HttpClient::create(io_.executor(), "127.0.0.1", port);
  ClientRequest hello = makeRequest("GET", "/hello");
  auto r = io_.run([&]() -> asio::awaitable<absl::StatusOr<Response>> {
    co_return co_await client->request(hello);
  });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
}

TEST_F(HttpTest, GracefulShutdownFinishesInFlightRequest) {
  startServer();
  ClientRequest slow = makeRequest("GET", "/slow");
  // The slow request is in flight (the handler waits 300 ms) when shutdown begins.
  auto pending = asio::co_spawn(
      io_.context(),
      [&]() -> asio::awaitable<absl::StatusOr<Response>> {
        co_return co_await client_->request(slow);
      },
      asio::use_future);
  auto deadline_started = std::chrono::steady_clock::now() + 3s;
  while (server_->activeConnections() == 0 && std::chrono::steady_clock::now() < deadline_started) {
    std::this_thread::sleep_for(1ms);
  }
  std::this_thread::sleep_for(50ms);
  asio::co_spawn(io_.context(), server_->shutdown(2s), asio::detached);
  ASSERT_EQ(pending.wait_for(5s), std::future_status::ready);
  auto result = pending.get();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->body, "late");
  EXPECT_EQ(result->header("connection"), "close");
  auto deadline = std::chrono::steady_clock::now() + 3s;
  while (server_->activeConnections() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(server_->activeConnections(), 0u);
  auto after = call(makeRequest("GET", "/hello"));
  EXPECT_FALSE(after.ok());
}

}  // namespace
}  // namespace kvf::http
