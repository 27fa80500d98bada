// The HTTP server against hostile clients: raw sockets sending what a well-behaved client
// would not (bodies announced and withheld, chunk framing past the body limit, transfer codings
// the server does not read, idle connections by the thousand, headers sent a byte at a time),
// checked by what the server answers, when it closes, and what it costs in memory.
#include <poll.h>

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <thread>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>

#include "common/http_client.h"
#include "common/http_server.h"
#include "tests/testing/io_thread.h"

namespace kvf::http {
namespace {

using namespace std::chrono_literals;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

// Resident memory of this process (the server runs in it), from /proc.
size_t residentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// A blocking TCP client from a chosen source address (all of 127/8 is loopback on Linux, so
// each address is a distinct client to the server).
class RawClient {
 public:
  RawClient(asio::io_context& ioc, uint16_t port, const char* source = "127.0.0.1") : socket_(ioc) {
    socket_.open(tcp::v4());
    socket_.bind({asio::ip::make_address(source), 0});
    socket_.connect({asio::ip::make_address("127.0.0.1"), port});
  }

  // Sends what the server still takes (it may close early); true if all of it went out.
  bool send(std::string_view bytes) {
    boost::system::error_code ec;
    asio::write(socket_, asio::buffer(bytes.data(), bytes.size()), ec);
    return !ec;
  }

  // Reads until the server closes, `until` appears, or `timeout` passes.
  struct Read {
    std::string data;
    bool closed = false;
  };
  Read read(std::chrono::milliseconds timeout, std::string_view until = {}) {
    Read out;
    auto deadline = Clock::now() + timeout;
    char buf[16384];
    while (until.empty() || out.data.find(until) == std::string::npos) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left <= 0ms) break;
      pollfd pfd{socket_.native_handle(), POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) break;
      boost::system::error_code ec;
      size_t n = socket_.read_some(asio::buffer(buf), ec);
      out.data.append(buf, n);
      if (ec) {
        out.closed = true;
        break;
      }
    }
    return out;
  }

 private:
  tcp::socket socket_;
};

bool waitFor(const std::function<bool()>& condition, std::chrono::milliseconds timeout = 10s) {
  auto deadline = Clock::now() + timeout;
  while (!condition()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

class HttpLimitsTest : public ::testing::Test {
 protected:
  void startServer(ServerOptions options) {
    auto server = HttpServer::create(io_.context(), options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    server_->route("GET", "/hello", [](const Request&, ResponseWriter& w) -> asio::awaitable<void> {
      co_await w.send(200, "text/plain", "hello");
    });
    // Answers the body's size; counts its calls.
    server_->route("POST", "/size",
                   [this](const Request& r, ResponseWriter& w) -> asio::awaitable<void> {
                     handled_ += 1;
                     co_await w.send(200, "text/plain", "size=" + std::to_string(r.body.size()));
                   });
    server_->start();
  }

  std::string exchange(const std::string& bytes, const char* source = "127.0.0.1") {
    RawClient client(io_.context(), server_->port(), source);
    client.send(bytes);
    return client.read(5s).data;
  }

  // `n` connections from `source`, each sending nothing.
  std::vector<std::unique_ptr<RawClient>> connectMany(int n, const char* source) {
    std::vector<std::unique_ptr<RawClient>> clients;
    for (int i = 0; i < n; ++i) {
      clients.push_back(std::make_unique<RawClient>(io_.context(), server_->port(), source));
    }
    return clients;
  }

  testing::IoThread io_;
  std::unique_ptr<HttpServer> server_;
  std::atomic<int> handled_{0};
};

// Counts body observers that have seen body bytes.
class FirstBytesSeen final : public BodyObserver {
 public:
  explicit FirstBytesSeen(std::atomic<int>* seen) : seen_(seen) {}
  void onBody(std::string_view received, size_t) override {
    if (!counted_ && !received.empty()) {
      counted_ = true;
      seen_->fetch_add(1);
    }
  }

 private:
  std::atomic<int>* seen_;
  bool counted_ = false;
};

// 12 connections announce a 32 MiB body (the router's limit) and send 100 bytes of it: the
// server must not hold 12 x 32 MiB while it waits for the rest.
TEST_F(HttpLimitsTest, AnnouncedBodyIsNotAllocatedBeforeItArrives) {
  ServerOptions options;
  options.max_body_bytes = 32u << 20;
  startServer(options);
  std::atomic<int> seen{0};
  server_->route(
      "POST", "/observed",
      [](const Request&, ResponseWriter& w) -> asio::awaitable<void> {
        co_await w.send(200, "text/plain", "done");
      },
      [&](const Request&) -> std::shared_ptr<BodyObserver> {
        return std::make_shared<FirstBytesSeen>(&seen);
      });
  size_t before = residentBytes();
  std::string head =
      "POST /observed HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string((32u << 20) - 1) +
      "\r\n\r\n" + std::string(100, 'a');
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < 12; ++i) {
    clients.push_back(std::make_unique<RawClient>(io_.context(), server_->port()));
    ASSERT_TRUE(clients.back()->send(head));
  }
  ASSERT_TRUE(waitFor([&] { return seen.load() == 12; })) << seen.load();
  size_t grown = residentBytes() - std::min(before, residentBytes());
  EXPECT_LT(grown, 48u << 20) << "12 withheld bodies cost " << (grown >> 20) << " MiB";
}

// Chunk extensions and chunk framing cannot carry bytes past the body limit.
TEST_F(HttpLimitsTest, ChunkFramingCountsAgainstTheBodyLimit) {
  ServerOptions options;
  options.max_body_bytes = 64 * 1024;
  startServer(options);
  std::string head = "POST /size HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  std::string ext;
  while (ext.size() < (1u << 20)) ext += ";name=value";
  std::string raw = exchange(head + "1" + ext + "\r\nx\r\n0\r\n\r\n");
  EXPECT_EQ(raw.rfind("HTTP/1.1 431", 0), 0u) << raw.substr(0, 200);

  raw = exchange(head + "1" + ext.substr(0, 8000) + "\r\nx\r\n0\r\n\r\n");
  EXPECT_EQ(raw.rfind("HTTP/1.1 400", 0), 0u) << raw.substr(0, 200);
  EXPECT_NE(raw.find("chunk extensions"), std::string::npos) << raw;

  std::string tiny;  // 40,000 data bytes in 1-byte chunks: 240,000 bytes on the wire
  for (int i = 0; i < 40000; ++i) tiny += "1\r\nx\r\n";
  raw = exchange(head + tiny + "0\r\n\r\n");
  EXPECT_EQ(raw.rfind("HTTP/1.1 413", 0), 0u) << raw.substr(0, 200);
  EXPECT_EQ(handled_.load(), 0);

  // And the server keeps serving.
  raw = exchange(
      "POST /size HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
      "Connection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
  EXPECT_NE(raw.find("size=3"), std::string::npos) << raw;
}

// RFC 9112 6.1/6.3: a transfer coding the server does not read, or chunked not last, is a 400
// (501 for an unsupported coding before chunked) and the connection closes: the body is never
// read as a next request.
TEST_F(HttpLimitsTest, TransferCodingsOtherThanChunkedAreRefusedAndTheConnectionClosed) {
  startServer({});
  const std::string smuggled = "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n";
  for (std::string coding : {"identity", "gzip", "chunked, identity", "gzip, chunked"}) {
    RawClient client(io_.context(), server_->port());
    client.send("POST /size HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: " + coding + "\r\n\r\n" +
                smuggled);
    auto got = client.read(5s);
    EXPECT_TRUE(got.closed) << coding;
    int expected = coding == "gzip, chunked" ? 501 : 400;
    EXPECT_EQ(got.data.rfind("HTTP/1.1 " + std::to_string(expected), 0), 0u)
        << coding << ": " << got.data;
    EXPECT_EQ(got.data.find("hello"), std::string::npos) << coding << ": " << got.data;
  }
  EXPECT_EQ(handled_.load(), 0);
}

// One client's idle connections fill the server: another client is still served, at the cost
// of one of the idle ones, and the filling client cannot take more.
TEST_F(HttpLimitsTest, IdleConnectionsOfOneClientDoNotLockOthersOut) {
  ServerOptions options;
  options.max_connections = 8;
  startServer(options);
  auto idle = connectMany(8, "127.0.0.2");
  ASSERT_TRUE(waitFor([&] { return server_->activeConnections() == 8; }));
  RawClient other(io_.context(), server_->port(), "127.0.0.3");
  other.send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string raw = other.read(5s, "hello").data;
  EXPECT_EQ(raw.rfind("HTTP/1.1 200", 0), 0u) << raw;
  EXPECT_NE(raw.find("hello"), std::string::npos) << raw;
  EXPECT_EQ(server_->displacedConnections(), 1u);
  int closed = 0;
  for (auto& c : idle) closed += c->read(50ms).closed ? 1 : 0;
  EXPECT_EQ(closed, 1);
  // The filling client gets no more than it has while the other one stays.
  RawClient more(io_.context(), server_->port(), "127.0.0.2");
  ASSERT_TRUE(waitFor([&] { return server_->refusedConnections() == 1; }));
  EXPECT_TRUE(more.read(5s).closed);
}

TEST_F(HttpLimitsTest, PerClientCapClosesConnectionsPastIt) {
  ServerOptions options;
  options.max_connections_per_client = 3;
  startServer(options);
  auto clients = connectMany(5, "127.0.0.4");
  ASSERT_TRUE(waitFor([&] { return server_->refusedConnections() == 2; }));
  EXPECT_EQ(server_->activeConnections(), 3u);
  // Another client is not affected.
  std::string raw =
      exchange("GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", "127.0.0.5");
  EXPECT_NE(raw.find("hello"), std::string::npos) << raw;
}

// A request's head must arrive within read_timeout of its first byte, whatever the keep-alive
// wait (before: the head of a request had the idle timeout, 60 s, where 30 s is documented).
TEST_F(HttpLimitsTest, HeadMustArriveWithinTheReadTimeout) {
  ServerOptions options;
  options.idle_timeout = 20s;
  options.read_timeout = 300ms;
  startServer(options);
  RawClient client(io_.context(), server_->port());
  auto start = Clock::now();
  client.send("GET /hel");
  auto got = client.read(5s);
  EXPECT_TRUE(got.closed) << "a partial head held the connection past the read timeout";
  EXPECT_LT(Clock::now() - start, 5s);
}

// A new connection that sends nothing is closed after first_request_timeout; a connection that
// was served waits idle_timeout for its next request.
TEST_F(HttpLimitsTest, FirstRequestTimeoutIsShorterThanKeepAlive) {
  ServerOptions options;
  options.first_request_timeout = 200ms;
  options.idle_timeout = 20s;
  startServer(options);
  RawClient silent(io_.context(), server_->port());
  auto start = Clock::now();
  EXPECT_TRUE(silent.read(5s).closed);
  EXPECT_LT(Clock::now() - start, 5s);

  RawClient served(io_.context(), server_->port());
  served.send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(served.read(5s, "hello").data.find("hello"), std::string::npos);
  auto quiet = served.read(600ms);  // well past first_request_timeout
  EXPECT_FALSE(quiet.closed);
  served.send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(served.read(5s, "hello").data.find("hello"), std::string::npos);
}

// A route's head check answers before the body is read: an unauthenticated peer announcing a
// large body gets 401 without sending it, and the handler never runs; an authenticated one that
// asks for `100 Continue` gets it, then sends its body.
TEST_F(HttpLimitsTest, HeadCheckAnswersBeforeTheBodyIsRead) {
  ServerOptions options;
  options.max_body_bytes = 8u << 20;
  startServer(options);
  std::atomic<int> pushes{0};
  server_->route(
      "POST", "/kv/push",
      [&](const Request& r, ResponseWriter& w) -> asio::awaitable<void> {
        pushes += 1;
        co_await w.send(200, "text/plain", "pushed=" + std::to_string(r.body.size()));
      },
      nullptr,
      [](const Request& head) -> absl::Status {
        if (head.header("authorization") != "Bearer secret") {
          return absl::UnauthenticatedError("missing or wrong bearer token");
        }
        return absl::OkStatus();
      });
  std::string length = std::to_string(5u << 20);
  RawClient intruder(io_.context(), server_->port());
  intruder.send("POST /kv/push HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + "\r\n\r\n");
  auto got = intruder.read(5s);
  EXPECT_EQ(got.data.rfind("HTTP/1.1 401", 0), 0u) << got.data;
  EXPECT_NE(got.data.find("WWW-Authenticate: Bearer"), std::string::npos) << got.data;
  EXPECT_TRUE(got.closed);

  RawClient peer(io_.context(), server_->port());
  peer.send(
      "POST /kv/push HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\n"
      "Expect: 100-continue\r\nContent-Length: 5\r\n\r\n");
  EXPECT_EQ(peer.read(5s, "\r\n\r\n").data, "HTTP/1.1 100 Continue\r\n\r\n");
  peer.send("abcde");
  EXPECT_NE(peer.read(5s, "pushed=5").data.find("pushed=5"), std::string::npos);
  EXPECT_EQ(pushes.load(), 1);
}

// The client side: an upstream that sends an endless chunk line cannot make the client buffer
// it (before: the client kept reading it into memory until its read timeout).
TEST(HttpClientLimitsTest, EndlessChunkLineFromUpstreamFailsFastWithBoundedMemory) {
  testing::IoThread io;
  tcp::acceptor acceptor(io.context(), {asio::ip::make_address("127.0.0.1"), 0});
  uint16_t port = acceptor.local_endpoint().port();
  std::atomic<bool> stop{false};
  std::thread upstream([&] {
    tcp::socket socket(io.context());
    acceptor.accept(socket);
    char buf[4096];
    boost::system::error_code ec;
    socket.read_some(asio::buffer(buf), ec);  // the request
    std::string head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1";
    asio::write(socket, asio::buffer(head), ec);
    std::string ext(64 * 1024, ';');
    for (int i = 0; i < 256 && !ec && !stop; ++i) asio::write(socket, asio::buffer(ext), ec);
    // Hold the connection open (no end of the line, no close) until the client gives up.
    while (!ec && !stop) socket.read_some(asio::buffer(buf), ec);
  });
  ClientOptions options;
  options.read_timeout = 20s;
  auto client = HttpClient::create(io.executor(), "127.0.0.1", port, options);
  ClientRequest request;
  auto start = Clock::now();
  auto result = io.run([&]() -> asio::awaitable<absl::StatusOr<Response>> {
    co_return co_await client->request(request);
  });
  stop = true;
  upstream.join();
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().code(), absl::StatusCode::kDeadlineExceeded) << result.status();
  EXPECT_LT(Clock::now() - start, 10s);
}

}  // namespace
}  // namespace kvf::http
