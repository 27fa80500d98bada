// HTTP/1.1 server on Boost.Beast with C++20 coroutines. Routes by method and path (exact or
// prefix), keeps connections alive, bounds header and body sizes, times out idle and slow
// connections, answers errors with OpenAI-style JSON bodies, streams responses (chunked,
// Server-Sent Events flushed per event) and shuts down gracefully.
// Threading: each connection runs on its own strand of the io_context given to create(); the
// server object itself is driven from the thread that created it (route/start/stop).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <boost/asio/io_context.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/http.h"

namespace kvf::http {

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;                         // 0 picks a free port
  size_t max_header_bytes = 16 * 1024;       // request line + headers (and trailers) -> 431
  size_t max_body_bytes = 16 * 1024 * 1024;  // -> 413; a chunked body counts its framing
  size_t max_chunk_extension_bytes = 4096;   // extensions on one chunk line -> 400
  // A new connection must send the first byte of its first request within this (or within
  // idle_timeout when that is shorter).
  std::chrono::milliseconds first_request_timeout{10'000};
  std::chrono::milliseconds idle_timeout{60'000};   // keep-alive wait for the next request
  std::chrono::milliseconds read_timeout{30'000};   // a request, from its first byte, whole
  std::chrono::milliseconds write_timeout{30'000};  // one write (one chunk) must finish in this
  // Open connections, in all and per client (source IP address). At the global cap a new
  // connection takes the place of one not inside a handler (waiting or still sending its
  // request) of the client holding the most connections, when that client holds more than the
  // newcomer's; otherwise, and above the per-client cap, it is closed at accept.
  size_t max_connections = 4096;
  size_t max_connections_per_client = 1024;
  // Each connection's handlers run on a strand. A server whose io_context is run by a single
  // thread can turn this off: the strand only adds dispatch work there.
  bool strand_per_connection = true;
};

class ResponseWriter;
using Handler = std::function<asio::awaitable<void>(const Request&, ResponseWriter&)>;

// How a handler answers. Exactly one of send*/(beginStream ... endStream) per request. If the
// handler returns without answering, the server sends a 500. Methods return a non-OK status
// when the client is gone or a write timed out; the handler should then stop producing.
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;

  virtual asio::awaitable<absl::Status> send(int status, std::string_view content_type,
                                             std::string body, const Headers& extra = {}) = 0;
  asio::awaitable<absl::Status> sendJson(int status, std::string body, const Headers& extra = {});
  // `{"error": {"message", "type", "code"}}` with the type chosen from the status.
  asio::awaitable<absl::Status> sendError(int status, std::string_view message);
  // Maps an absl::Status code to an HTTP status and sends it as an error.
  asio::awaitable<absl::Status> sendStatus(const absl::Status& status);

  // Starts a chunked response; each writeChunk()/writeEvent() is sent and flushed at once.
  virtual asio::awaitable<absl::Status> beginStream(int status, std::string_view content_type,
                                                    const Headers& extra = {}) = 0;
  virtual asio::awaitable<absl::Status> writeChunk(std::string_view bytes) = 0;
  // One SSE event with `data` (see sse::formatData).
  asio::awaitable<absl::Status> writeEvent(std::string_view data);
  virtual asio::awaitable<absl::Status> endStream() = 0;

  // Calls `on_gone` once, on the connection's executor, when the client closes or resets its
  // connection while the handler still runs: noticed while the handler waits (for an upstream,
  // a queue, a first token), not only when it next writes. Bytes the client sends meanwhile (a
  // pipelined request) end the watch, as a closed connection can no longer be told apart. A
  // second call replaces the callback. The watch ends when the handler returns. Writers that
  // cannot watch never call it.
  virtual void watchClientGone(std::function<void()> on_gone) { (void)on_gone; }
  // The watch saw the client go (false without a watch).
  virtual bool clientGone() const { return false; }

  virtual bool started() const = 0;   // any byte of the response was written
  virtual bool finished() const = 0;  // the response is complete
  virtual asio::any_io_executor executor() const = 0;
};

// Runs on a request's head (method, target, headers; body not read yet) before any body byte is
// taken, on the connection's thread. A non-OK status is answered at once (httpStatusFor; 401
// adds `WWW-Authenticate: Bearer`) and the connection closed with the body unread: e.g. an
// authentication check that costs an unauthenticated peer no body buffer.
using HeadCheck = std::function<absl::Status(const Request& head)>;

// Maps absl status codes to HTTP status codes (InvalidArgument -> 400, NotFound -> 404, ...).
int httpStatusFor(const absl::Status& status);

class HttpServer {
 public:
  // Binds and listens (not yet accepting). Fails if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> create(asio::io_context& ioc,
                                                            ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Registers a handler for an exact path. Must be called before start(). With `observe`, each
  // request with a sized body gets an observer that sees the body while it arrives
  // (Request::body_observer). With `check`, every request's head passes it before its body is
  // read. A request that sends `Expect: 100-continue` gets `100 Continue` once its head passed.
  void route(std::string_view method, std::string_view path, Handler handler,
             BodyObserverFactory observe = nullptr, HeadCheck check = nullptr);
  // Registers a handler for every path starting with `prefix` (longest prefix wins).
  void routePrefix(std::string_view method, std::string_view prefix, Handler handler,
                   HeadCheck check = nullptr);

  uint16_t port() const;
  void start();
  // Stops accepting at once; idle connections close now, busy ones after finishing their
  // current response; any left after `grace` are closed. Returns when all are gone.
  asio::awaitable<void> shutdown(std::chrono::milliseconds grace);
  // Immediate stop: closes the listener and every connection.
  void stop();
  size_t activeConnections() const;
  // Connections closed at accept (a cap reached) or displaced by another client's, so far.
  uint64_t refusedConnections() const;
  uint64_t displacedConnections() const;

 private:
  struct Impl;
  explicit HttpServer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvf::http
