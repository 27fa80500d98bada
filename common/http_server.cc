#include "common/http_server.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "common/error_body.h"
#include "common/http_io.h"
#include "common/json.h"
#include "common/log.h"
#include "common/sse.h"
#include "common/strings.h"

namespace kvf::http {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
constexpr auto kUseTuple = asio::as_tuple(asio::use_awaitable);

// ---------------------------------------------------------------------------------------------
// ResponseWriter helpers shared by every implementation.

asio::awaitable<absl::Status> ResponseWriter::sendJson(int status, std::string body,
                                                       const Headers& extra) {
  co_return co_await send(status, "application/json", std::move(body), extra);
}

asio::awaitable<absl::Status> ResponseWriter::sendError(int status, std::string_view message) {
  co_return co_await sendJson(status,
                              json::errorBody(message, json::errorTypeForStatus(status), status));
}

asio::awaitable<absl::Status> ResponseWriter::sendStatus(const absl::Status& status) {
  int code = httpStatusFor(status);
  std::optional<std::string> param = json::paramOf(status);
  const std::string message(status.message());
  if (!param && code >= 400 && code < 500) param = json::paramFromMessage(message);
  co_return co_await sendJson(
      code,
      json::errorBodyWithParam(message, json::errorTypeForStatus(code), code,
                               param ? std::optional<std::string_view>(*param) : std::nullopt));
}

asio::awaitable<absl::Status> ResponseWriter::writeEvent(std::string_view data) {
  co_return co_await writeChunk(sse::formatData(data));
}

int httpStatusFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kUnimplemented:
      return 501;
    default:
      return 500;
  }
}

namespace {

absl::Status ioError(const boost::system::error_code& ec, std::string_view what) {
  if (ec == beast::error::timeout) {
    return absl::DeadlineExceededError(strCat(what, ": timed out"));
  }
  return absl::UnavailableError(strCat(what, ": ", ec.message()));
}

// The response side of one request on one connection.
class BeastResponseWriter final : public ResponseWriter {
 public:
  // `stopping` (the server's flag) turns keep-alive off for responses that start after a
  // shutdown began, so their clients do not reuse a connection that is about to close.
  BeastResponseWriter(beast::tcp_stream& stream, unsigned version, bool keep_alive,
                      std::chrono::milliseconds write_timeout, const std::atomic<bool>* stopping)
      : stream_(stream),
        version_(version),
        keep_alive_(keep_alive),
        write_timeout_(write_timeout),
        stopping_(stopping) {}

  asio::awaitable<absl::Status> send(int status, std::string_view content_type, std::string body,
                                     const Headers& extra) override {
    if (started_) co_return absl::FailedPreconditionError("response already started");
    started_ = true;
    if (stopping_ && *stopping_) keep_alive_ = false;
    bhttp::response<bhttp::string_body> res{static_cast<bhttp::status>(status), version_};
    res.set(bhttp::field::server, "kvfabric");
    res.set(bhttp::field::content_type, content_type);
    for (const auto& [k, v] : extra) res.set(k, v);
    res.keep_alive(keep_alive_);
    res.body() = std::move(body);
    res.prepare_payload();
    bhttp::response_serializer<bhttp::string_body> serializer{res};
    boost::system::error_code ec =
        co_await internal::writeNowOrAsync(stream_, serializer, write_timeout_);
    if (ec) {
      keep_alive_ = false;
      co_return ioError(ec, "writing response");
    }
    finished_ = true;
    co_return absl::OkStatus();
  }

  asio::awaitable<absl::Status> beginStream(int status, std::string_view content_type,
                                            const Headers& extra) override {
    if (started_) co_return absl::FailedPreconditionError("response already started");
    started_ = true;
    if (stopping_ && *stopping_) keep_alive_ = false;
    bhttp::response<bhttp::empty_body> res{static_cast<bhttp::status>(status), version_};
    res.set(bhttp::field::server, "kvfabric");
    res.set(bhttp::field::content_type, content_type);
    res.set(bhttp::field::cache_control, "no-cache");
    for (const auto& [k, v] : extra) res.set(k, v);
    chunked_ = version_ >= 11;
    if (chunked_) {
      res.chunked(true);
      res.keep_alive(keep_alive_);
    } else {
      keep_alive_ = false;  // HTTP/1.0: the body ends when the connection closes
      res.keep_alive(false);
    }
    bhttp::response_serializer<bhttp::empty_body> serializer{res};
    stream_.expires_after(write_timeout_);
    auto [ec, n] = co_await bhttp::async_write_header(stream_, serializer, kUseTuple);
    if (ec) {
      keep_alive_ = false;
      co_return ioError(ec, "writing stream header");
    }
    co_return absl::OkStatus();
  }

  asio::awaitable<absl::Status> writeChunk(std::string_view bytes) override {
    if (!started_ || finished_) co_return absl::FailedPreconditionError("no open stream");
    if (bytes.empty()) co_return absl::OkStatus();  // an empty chunk would end the body
    stream_.expires_after(write_timeout_);
    boost::system::error_code ec;
    if (chunked_) {
      std::tie(ec, std::ignore) = co_await asio::async_write(
          stream_, bhttp::make_chunk(asio::buffer(bytes.data(), bytes.size())), kUseTuple);
    } else {
      std::tie(ec, std::ignore) =
          co_await asio::async_write(stream_, asio::buffer(bytes.data(), bytes.size()), kUseTuple);
    }
    if (ec) {
      keep_alive_ = false;
      co_return ioError(ec, "writing stream chunk");
    }
    co_return absl::OkStatus();
  }

  asio::awaitable<absl::Status> endStream() override {
    if (!started_ || finished_) co_return absl::FailedPreconditionError("no open stream");
    if (chunked_) {
      stream_.expires_after(write_timeout_);
      auto [ec, n] = co_await asio::async_write(stream_, bhttp::make_chunk_last(), kUseTuple);
      if (ec) {
        keep_alive_ = false;
        co_return ioError(ec, "ending stream");
      }
    }
    finished_ = true;
    co_return absl::OkStatus();
  }

  bool started() const override { return started_; }
  bool finished() const override { return finished_; }
  bool keepAlive() const { return keep_alive_ && finished_; }
  asio::any_io_executor executor() const override { return stream_.get_executor(); }

 private:
  beast::tcp_stream& stream_;
  unsigned version_;
  bool keep_alive_;
  std::chrono::milliseconds write_timeout_;
  bool started_ = false;
  bool finished_ = false;
  bool chunked_ = false;
  const std::atomic<bool>* stopping_;
};

// Maps a request-parsing error to the status we answer with; 0 means "just close".
int statusForParseError(const boost::system::error_code& ec) {
  if (ec == bhttp::error::body_limit) return 413;
  if (ec == bhttp::error::header_limit) return 431;
  if (ec == bhttp::error::end_of_stream || ec == beast::error::timeout ||
      ec == asio::error::operation_aborted || ec == asio::error::eof ||
      ec == asio::error::connection_reset || ec == bhttp::error::partial_message) {
    return 0;
  }
  if (ec.category() == bhttp::make_error_code(bhttp::error::bad_method).category()) return 400;
  return 0;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  struct Connection {
    std::shared_ptr<beast::tcp_stream> stream;
    std::atomic<bool> idle{true};
  };

  Impl(asio::io_context& ioc_in, ServerOptions options_in)
      : ioc(ioc_in), options(std::move(options_in)), acceptor(ioc_in) {}

  asio::io_context& ioc;
  ServerOptions options;
  tcp::acceptor acceptor;
  struct Route {
    Handler handler;
    BodyObserverFactory observe;
  };
  using Methods = std::map<std::string, Route>;
  std::map<std::string, Methods, std::less<>> exact;   // path -> method
  std::map<std::string, Methods, std::less<>> prefix;  // prefix -> method
  std::atomic<bool> stopping{false};
  mutable std::mutex mu;
  std::set<std::shared_ptr<Connection>> connections;

  asio::awaitable<void> acceptLoop();
  asio::awaitable<void> session(std::shared_ptr<Connection> conn);
  // One request's head and body; `route` is its handler (null: none for this path/method).
  asio::awaitable<boost::system::error_code> readRequest(
      Connection& conn, beast::flat_buffer& buffer,
      bhttp::request_parser<bhttp::string_body>& parser, Request& request, const Route** route,
      std::string& spare_body);
  asio::awaitable<void> dispatch(const Request& request, const Route* route,
                                 BeastResponseWriter& writer);
  asio::awaitable<void> replyAndClose(beast::tcp_stream& stream, int status,
                                      std::string_view message);
  const Methods* findRoute(std::string_view path) const;
  const Route* findHandler(const Request& head) const;
  void closeConnection(const std::shared_ptr<Connection>& conn);
};

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::create(asio::io_context& ioc,
                                                               ServerOptions options) {
  auto impl = std::make_shared<Impl>(ioc, std::move(options));
  boost::system::error_code ec;
  auto address = asio::ip::make_address(impl->options.host, ec);
  if (ec) return absl::InvalidArgumentError(strCat("bad listen host ", impl->options.host));
  tcp::endpoint endpoint(address, impl->options.port);
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(strCat("cannot listen on ", impl->options.host, ":",
                                         impl->options.port, ": ", ec.message()));
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::route(std::string_view method, std::string_view path, Handler handler,
                       BodyObserverFactory observe) {
  impl_->exact[std::string(path)][std::string(method)] = {std::move(handler), std::move(observe)};
}

void HttpServer::routePrefix(std::string_view method, std::string_view prefix, Handler handler) {
  impl_->prefix[std::string(prefix)][std::string(method)] = {std::move(handler), nullptr};
}

uint16_t HttpServer::port() const {
  boost::system::error_code ec;
  auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

void HttpServer::start() {
  asio::co_spawn(impl_->acceptor.get_executor(), impl_->acceptLoop(), asio::detached);
}

size_t HttpServer::activeConnections() const {
  std::lock_guard lock(impl_->mu);
  return impl_->connections.size();
}

void HttpServer::stop() {
  impl_->stopping = true;
  asio::post(impl_->acceptor.get_executor(), [impl = impl_] {
    boost::system::error_code ignored;
    impl->acceptor.close(ignored);
  });
  std::lock_guard lock(impl_->mu);
  for (const auto& conn : impl_->connections) impl_->closeConnection(conn);
}

asio::awaitable<void> HttpServer::shutdown(std::chrono::milliseconds grace) {
  auto impl = impl_;
  impl->stopping = true;
  asio::post(impl->acceptor.get_executor(), [impl] {
    boost::system::error_code ignored;
    impl->acceptor.close(ignored);
  });
  {
    std::lock_guard lock(impl->mu);
    for (const auto& conn : impl->connections) {
      if (conn->idle) impl->closeConnection(conn);
    }
  }
  asio::steady_timer timer(co_await asio::this_coro::executor);
  auto deadline = std::chrono::steady_clock::now() + grace;
  bool forced = false;
  for (;;) {
    {
      std::lock_guard lock(impl->mu);
      if (impl->connections.empty()) break;
      if (!forced && std::chrono::steady_clock::now() >= deadline) {
        for (const auto& conn : impl->connections) impl->closeConnection(conn);
        forced = true;
      }
    }
    timer.expires_after(std::chrono::milliseconds(5));
    co_await timer.async_wait(kUseTuple);
  }
}

void HttpServer::Impl::closeConnection(const std::shared_ptr<Connection>& conn) {
  asio::post(conn->stream->get_executor(), [stream = conn->stream] {
    boost::system::error_code ignored;
    stream->socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream->socket().close(ignored);
  });
}

asio::awaitable<void> HttpServer::Impl::acceptLoop() {
  auto self = shared_from_this();
  while (!stopping) {
    asio::any_io_executor conn_ex = ioc.get_executor();
    if (options.strand_per_connection) conn_ex = asio::make_strand(ioc);
    auto [ec, socket] = co_await acceptor.async_accept(conn_ex, kUseTuple);
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) break;
      log::warn("accept failed", "error", ec.message());
      continue;
    }
    if (stopping) break;
    boost::system::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    // Synchronous writes return would_block instead of waiting (ResponseWriter::send tries
    // one before going asynchronous); asynchronous operations are unaffected.
    socket.non_blocking(true, ignored);
    auto conn = std::make_shared<Connection>();
    {
      std::lock_guard lock(mu);
      if (connections.size() >= options.max_connections) {
        socket.close(ignored);
        continue;
      }
      conn->stream = std::make_shared<beast::tcp_stream>(std::move(socket));
      connections.insert(conn);
    }
    asio::co_spawn(conn->stream->get_executor(), session(conn), asio::detached);
  }
}

const HttpServer::Impl::Methods* HttpServer::Impl::findRoute(std::string_view path) const {
  if (auto it = exact.find(path); it != exact.end()) return &it->second;
  const Methods* best = nullptr;
  size_t best_len = 0;
  for (const auto& [p, methods] : prefix) {
    if (path.substr(0, p.size()) == p && p.size() >= best_len) {
      best = &methods;
      best_len = p.size();
    }
  }
  return best;
}

const HttpServer::Impl::Route* HttpServer::Impl::findHandler(const Request& head) const {
  const Methods* methods = findRoute(head.path);
  if (methods == nullptr) return nullptr;
  auto it = methods->find(head.method);
  return it == methods->end() ? nullptr : &it->second;
}

asio::awaitable<void> HttpServer::Impl::dispatch(const Request& request, const Route* route,
                                                 BeastResponseWriter& writer) {
  if (route == nullptr) {
    if (findRoute(request.path) == nullptr) {
      co_await writer.sendError(404, strCat("no route for ", request.path));
    } else {
      co_await writer.sendError(405, strCat(request.method, " not allowed on ", request.path));
    }
    co_return;
  }
  std::string failure;
  try {
    co_await route->handler(request, writer);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (!failure.empty()) {
    log::error("handler threw", "path", request.path, "error", failure);
    if (!writer.started()) co_await writer.sendError(500, "internal error");
  } else if (!writer.started()) {
    co_await writer.sendError(500, "handler produced no response");
  }
}

asio::awaitable<void> HttpServer::Impl::replyAndClose(beast::tcp_stream& stream, int status,
                                                      std::string_view message) {
  BeastResponseWriter writer(stream, 11, false, options.write_timeout, nullptr);
  co_await writer.sendError(status, message);
}

asio::awaitable<boost::system::error_code> HttpServer::Impl::readRequest(
    Connection& conn, beast::flat_buffer& buffer, bhttp::request_parser<bhttp::string_body>& parser,
    Request& request, const Route** route, std::string& spare_body) {
  beast::tcp_stream& stream = *conn.stream;
  conn.idle = true;
  stream.expires_after(buffer.size() == 0 ? options.idle_timeout : options.read_timeout);
  auto [ec, n] = co_await internal::readHeader(stream, buffer, parser);
  conn.idle = false;
  if (ec) co_return ec;
  const auto& head = parser.get();
  request.method = std::string(head.method_string());
  request.target = std::string(head.target());
  size_t q = request.target.find('?');
  request.path = request.target.substr(0, q);
  if (q != std::string::npos) request.query = request.target.substr(q + 1);
  for (const auto& field : head) {
    request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  *route = findHandler(request);
  if (parser.is_done()) co_return ec;
  if (!parser.chunked() && parser.content_length()) {
    // Sized bodies are read straight into the request's body (not through Beast's buffer and
    // body copy), in reads as large as what has arrived, shown to the route's observer as
    // they come. The header parser already refused a length over the limit.
    if (*route != nullptr && (*route)->observe) request.body_observer = (*route)->observe(request);
    request.body = std::move(spare_body);
    co_return co_await internal::readSizedBody(
        stream, buffer, static_cast<size_t>(*parser.content_length()), options.read_timeout,
        request.body, request.body_observer.get());
  }
  stream.expires_after(options.read_timeout);
  std::tie(ec, n) = co_await bhttp::async_read(stream, buffer, parser, kUseTuple);
  if (!ec) request.body = std::move(parser.get().body());
  co_return ec;
}

asio::awaitable<void> HttpServer::Impl::session(std::shared_ptr<Connection> conn) {
  auto self = shared_from_this();
  beast::tcp_stream& stream = *conn->stream;
  beast::flat_buffer buffer;
  // Beast sizes each read by the buffer's spare capacity (512 bytes for a fresh buffer), so
  // large bodies would arrive in 512-byte reads without this.
  buffer.reserve(64 * 1024);
  // The last sized body's memory, reused for the next one: resizing it down (or up to where it
  // was) writes nothing, where a fresh string would zero the whole body before the read.
  std::string spare_body;
  constexpr size_t kKeepBodyBytes = 4 << 20;
  std::string remote;
  {
    boost::system::error_code ec;
    auto ep = stream.socket().remote_endpoint(ec);
    if (!ec) remote = strCat(ep.address().to_string(), ":", ep.port());
  }
  while (!stopping) {
    bhttp::request_parser<bhttp::string_body> parser;
    parser.header_limit(static_cast<std::uint32_t>(options.max_header_bytes));
    parser.body_limit(options.max_body_bytes);
    Request request;
    request.remote = remote;
    const Route* route = nullptr;
    boost::system::error_code ec =
        co_await readRequest(*conn, buffer, parser, request, &route, spare_body);
    if (ec) {
      int status = statusForParseError(ec);
      if (status == 413) {
        co_await replyAndClose(stream, 413,
                               strCat("request body exceeds ", options.max_body_bytes, " bytes"));
      } else if (status == 431) {
        co_await replyAndClose(stream, 431, "request headers too large");
      } else if (status != 0) {
        co_await replyAndClose(stream, status, strCat("malformed request: ", ec.message()));
      }
      break;
    }
    const auto& message = parser.get();
    BeastResponseWriter writer(stream, message.version(), message.keep_alive() && !stopping,
                               options.write_timeout, &stopping);
    co_await dispatch(request, route, writer);
    size_t capacity = request.body.capacity();
    if (capacity > spare_body.capacity() && capacity <= kKeepBodyBytes) {
      spare_body = std::move(request.body);
    }
    if (!writer.keepAlive()) break;
  }
  boost::system::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
  stream.socket().close(ignored);
  std::lock_guard lock(mu);
  connections.erase(conn);
}

}  // namespace kvf::http
