// HTTP/1.1 client with a keep-alive connection pool for one upstream (host:port), buffered
// and streaming responses, connect/read/write timeouts and cancellation by closing.
// Threading: an HttpClient and the ResponseStreams it opens are used from one executor (one
// thread or one strand); the pool itself is guarded so create() may be called anywhere.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/http.h"

namespace kvf::http {

struct ClientOptions {
  std::chrono::milliseconds connect_timeout{2'000};
  std::chrono::milliseconds write_timeout{10'000};
  std::chrono::milliseconds read_timeout{60'000};  // per read: longest gap between bytes
  size_t max_idle_connections = 64;
  std::chrono::milliseconds idle_ttl{30'000};  // pooled connections older than this are dropped
  size_t max_header_bytes = 64 * 1024;
  size_t max_body_bytes = 64 * 1024 * 1024;  // buffered responses (request()/readAll())
};

class Connection;

// Lets code on the client's executor abort one request from outside the coroutine that waits
// on it (its client left, its upstream stalled): cancel() closes the request's connection, so
// a pending open() or ResponseStream::next() completes with Cancelled at once, and a request
// not yet sent is not sent. Shared by the caller and the client; one request per canceller.
class RequestCanceller {
 public:
  void cancel();  // idempotent
  bool cancelled() const { return cancelled_; }

 private:
  friend class HttpClient;
  friend class ResponseStream;
  bool cancelled_ = false;
  Connection* conn_ = nullptr;  // the request's connection, from open() to the stream's end
};

struct ClientRequest {
  std::string method = "GET";
  std::string target = "/";
  Headers headers;
  std::string body;
  std::string content_type = "application/json";
  // Overrides ClientOptions::read_timeout for this request.
  std::optional<std::chrono::milliseconds> read_timeout;
  // When non-empty, sent as the body instead of `body`, without a copy (a proxy forwarding a
  // large body it received). The bytes must stay valid until open()/request() returns.
  std::string_view body_view;
  // Optional: aborts the request from elsewhere (see RequestCanceller).
  std::shared_ptr<RequestCanceller> canceller;
};

class HttpClient;

// A response whose body is read as it arrives. Destroying it returns the connection to the
// pool when the body was read to the end and the server allows keep-alive, else closes it.
class ResponseStream {
 public:
  ~ResponseStream();
  ResponseStream(const ResponseStream&) = delete;
  ResponseStream& operator=(const ResponseStream&) = delete;

  int status() const { return status_; }
  const Headers& headers() const { return headers_; }
  std::string_view header(std::string_view name) const { return findHeader(headers_, name); }

  // The next body bytes as they arrive (chunk framing removed); nullopt at the end of the body.
  asio::awaitable<absl::StatusOr<std::optional<std::string>>> next();
  // Reads the rest of the body (at most `limit` bytes, else ResourceExhausted).
  asio::awaitable<absl::StatusOr<std::string>> readAll(size_t limit);
  // Aborts: closes the connection; a pending next() completes with an error.
  void cancel();
  bool done() const { return done_; }

 private:
  friend class HttpClient;
  struct State;
  ResponseStream(std::shared_ptr<HttpClient> client, std::unique_ptr<State> state);

  std::shared_ptr<HttpClient> client_;
  std::unique_ptr<State> state_;
  std::shared_ptr<RequestCanceller> canceller_;
  int status_ = 0;
  Headers headers_;
  bool done_ = false;
  bool failed_ = false;
};

class HttpClient : public std::enable_shared_from_this<HttpClient> {
 public:
  static std::shared_ptr<HttpClient> create(asio::any_io_executor executor, std::string host,
                                            uint16_t port, ClientOptions options = {});
  ~HttpClient();

  // Sends a request and reads the whole response.
  asio::awaitable<absl::StatusOr<Response>> request(ClientRequest request);
  // Sends a request and returns once the response headers arrived.
  asio::awaitable<absl::StatusOr<std::unique_ptr<ResponseStream>>> open(ClientRequest request);

  const std::string& host() const { return host_; }
  uint16_t port() const { return port_; }
  size_t idleConnections() const;
  // Closes every pooled connection (e.g. after the upstream restarted).
  void closeIdle();

 private:
  friend class ResponseStream;
  struct Pool;
  HttpClient(asio::any_io_executor executor, std::string host, uint16_t port,
             ClientOptions options);
  void release(std::unique_ptr<Connection> conn);
  asio::awaitable<absl::StatusOr<std::unique_ptr<Connection>>> connect();
  std::unique_ptr<Connection> takeIdle();

  asio::any_io_executor executor_;
  std::string host_;
  uint16_t port_;
  ClientOptions options_;
  std::unique_ptr<Pool> pool_;
};

}  // namespace kvf::http
