#include "common/http_server.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>

#include <sys/socket.h>

#include <cerrno>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
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
#include "common/http_request_parser.h"
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

  ~BeastResponseWriter() override { endWatch(); }

  // The handler returned: its callback may reference its frame, so it must never run now.
  void endWatch() {
    if (!watch_ || !watch_->active) return;
    watch_->active = false;
    watch_->cancel.emit(asio::cancellation_type::terminal);
  }

  void watchClientGone(std::function<void()> on_gone) override {
    if (!watch_) {
      watch_ = std::make_shared<ClientWatch>();
      watch_->on_gone = std::move(on_gone);
      armWatch(watch_, &stream_.socket());
    } else {
      watch_->on_gone = std::move(on_gone);
    }
  }

  bool clientGone() const override { return watch_ && watch_->gone; }

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

  // Shared with the pending wait, which may complete after the writer is gone: `active` says
  // whether the socket may still be touched.
  struct ClientWatch {
    std::function<void()> on_gone;
    asio::cancellation_signal cancel;
    bool active = true;
    bool gone = false;
  };
  std::shared_ptr<ClientWatch> watch_;

  // Waits for the socket to turn readable, then peeks: end of stream or an error means the
  // client left; bytes mean a pipelined request, so the watch ends; nothing yet, wait again.
  static void armWatch(std::shared_ptr<ClientWatch> watch, tcp::socket* socket) {
    auto& slot_owner = *watch;
    socket->async_wait(
        tcp::socket::wait_read,
        asio::bind_cancellation_slot(
            slot_owner.cancel.slot(),
            [watch = std::move(watch), socket](const boost::system::error_code& ec) mutable {
              if (!watch->active || ec == asio::error::operation_aborted) return;
              if (!ec) {
                char byte;
                ssize_t n = ::recv(socket->native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
                if (n > 0) return;
                if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
                  armWatch(std::move(watch), socket);
                  return;
                }
              }
              watch->gone = true;
              watch->active = false;
              if (watch->on_gone) {
                auto on_gone = std::move(watch->on_gone);
                on_gone();
              }
            }));
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  // Where a connection is: which ones another client's connection may displace at the cap.
  enum class Phase { kWaiting, kReading, kHandling };
  struct Connection {
    std::shared_ptr<beast::tcp_stream> stream;
    asio::ip::address client;
    std::atomic<Phase> phase{Phase::kWaiting};
    bool served = false;     // a request was read on it (touched by its own session only)
    bool displaced = false;  // closed to make room; counts already released (guarded by mu)
  };

  Impl(asio::io_context& ioc_in, ServerOptions options_in)
      : ioc(ioc_in), options(std::move(options_in)), acceptor(ioc_in) {
    limits.max_header_bytes = options.max_header_bytes;
    limits.max_body_bytes = options.max_body_bytes;
    limits.max_chunk_extension_bytes = options.max_chunk_extension_bytes;
  }

  asio::io_context& ioc;
  ServerOptions options;
  RequestLimits limits;
  tcp::acceptor acceptor;
  struct Route {
    Handler handler;
    BodyObserverFactory observe;
    HeadCheck check;
  };
  using Methods = std::map<std::string, Route>;
  std::map<std::string, Methods, std::less<>> exact;   // path -> method
  std::map<std::string, Methods, std::less<>> prefix;  // prefix -> method
  std::atomic<bool> stopping{false};
  mutable std::mutex mu;
  std::set<std::shared_ptr<Connection>> connections;
  // Connections per client and in all, not counting displaced ones still closing (mu).
  std::map<asio::ip::address, size_t> per_client;
  size_t counted = 0;
  std::atomic<uint64_t> refused{0};
  std::atomic<uint64_t> displaced{0};
  log::RateLimitedLog refused_log;

  asio::awaitable<void> acceptLoop();
  // Admits a connection from `client` under the caps (mu held); false: close it.
  bool admit(const asio::ip::address& client);
  void release(Connection& conn);  // mu held
  asio::awaitable<void> session(std::shared_ptr<Connection> conn);
  // Reads one request into `parser` (kDone or kFailed on return, or a read error). `route` is
  // its handler (null: none for this path/method); a failed head check fails the parser.
  asio::awaitable<boost::system::error_code> readRequest(Connection& conn,
                                                         beast::flat_buffer& buffer,
                                                         RequestParser& parser,
                                                         const Route** route);
  // After the head: route lookup, head check, body observer, 100 Continue.
  asio::awaitable<void> onHead(beast::tcp_stream& stream, RequestParser& parser,
                               const Route** route);
  asio::awaitable<void> dispatch(const Request& request, const Route* route,
                                 BeastResponseWriter& writer);
  asio::awaitable<void> replyAndClose(beast::tcp_stream& stream, int status,
                                      std::string_view message, bool unread_input);
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
                       BodyObserverFactory observe, HeadCheck check) {
  impl_->exact[std::string(path)][std::string(method)] = {std::move(handler), std::move(observe),
                                                          std::move(check)};
}

void HttpServer::routePrefix(std::string_view method, std::string_view prefix, Handler handler,
                             HeadCheck check) {
  impl_->prefix[std::string(prefix)][std::string(method)] = {std::move(handler), nullptr,
                                                             std::move(check)};
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

uint64_t HttpServer::refusedConnections() const { return impl_->refused.load(); }

uint64_t HttpServer::displacedConnections() const { return impl_->displaced.load(); }

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
      if (conn->phase == Impl::Phase::kWaiting) impl->closeConnection(conn);
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

bool HttpServer::Impl::admit(const asio::ip::address& client) {
  size_t& mine = per_client[client];
  if (options.max_connections_per_client > 0 && mine >= options.max_connections_per_client) {
    if (mine == 0) per_client.erase(client);
    return false;
  }
  if (counted >= options.max_connections) {
    // Full: the client holding the most connections, if it holds more than this one, gives up
    // one that is not inside a handler - waiting ahead of reading, never-served first.
    auto biggest =
        std::max_element(per_client.begin(), per_client.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; });
    if (biggest == per_client.end() || biggest->second <= mine) {
      if (mine == 0) per_client.erase(client);
      return false;
    }
    std::shared_ptr<Connection> victim;
    int victim_rank = 3;
    for (const auto& conn : connections) {
      if (conn->displaced || conn->client != biggest->first) continue;
      Phase phase = conn->phase.load();
      int rank = phase == Phase::kWaiting   ? (conn->served ? 1 : 0)
                 : phase == Phase::kReading ? 2
                                            : 3;
      if (rank < victim_rank) {
        victim = conn;
        victim_rank = rank;
        if (rank == 0) break;
      }
    }
    if (victim == nullptr) {
      if (mine == 0) per_client.erase(client);
      return false;
    }
    release(*victim);
    victim->displaced = true;
    closeConnection(victim);
    displaced.fetch_add(1);
  }
  ++per_client[client];
  ++counted;
  return true;
}

void HttpServer::Impl::release(Connection& conn) {
  if (conn.displaced) return;
  auto it = per_client.find(conn.client);
  if (it != per_client.end() && --it->second == 0) per_client.erase(it);
  --counted;
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
    auto peer = socket.remote_endpoint(ec);
    if (ec) continue;  // already gone
    socket.set_option(tcp::no_delay(true), ignored);
    // Synchronous writes return would_block instead of waiting (ResponseWriter::send tries
    // one before going asynchronous); asynchronous operations are unaffected.
    socket.non_blocking(true, ignored);
    auto conn = std::make_shared<Connection>();
    conn->client = peer.address();
    {
      std::lock_guard lock(mu);
      if (!admit(conn->client)) {
        refused.fetch_add(1);
        refused_log.warn("connection refused: cap reached", "client", conn->client.to_string(),
                         "connections", counted, "max_connections", options.max_connections,
                         "max_connections_per_client", options.max_connections_per_client);
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
  writer.endWatch();
  if (!failure.empty()) {
    log::error("handler threw", "path", request.path, "error", failure);
    if (!writer.started()) co_await writer.sendError(500, "internal error");
  } else if (!writer.started()) {
    co_await writer.sendError(500, "handler produced no response");
  }
}

asio::awaitable<void> HttpServer::Impl::replyAndClose(beast::tcp_stream& stream, int status,
                                                      std::string_view message, bool unread_input) {
  BeastResponseWriter writer(stream, 11, false, options.write_timeout, nullptr);
  Headers extra;
  if (status == 401) extra.emplace_back("WWW-Authenticate", "Bearer");
  co_await writer.sendJson(
      status, json::errorBody(message, json::errorTypeForStatus(status), status), extra);
  if (!unread_input) co_return;
  // Closing with unread input makes the kernel reset the connection, which can destroy the
  // answer before the client reads it. Stop sending, then read and drop what the client is
  // still sending for a short, bounded while (a lingering close).
  boost::system::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
  constexpr size_t kLingerBytes = 1 << 20;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  char sink[16 * 1024];
  for (size_t drained = 0; drained < kLingerBytes;) {
    auto [ec, n] =
        co_await internal::readSomeNowOrAsync(stream, asio::buffer(sink, sizeof sink), deadline);
    if (ec) break;
    drained += n;
  }
}

asio::awaitable<void> HttpServer::Impl::onHead(beast::tcp_stream& stream, RequestParser& parser,
                                               const Route** route) {
  Request& request = parser.request();
  *route = findHandler(request);
  if (*route == nullptr) co_return;
  if ((*route)->check) {
    absl::Status allowed = (*route)->check(request);
    if (!allowed.ok()) {
      parser.fail(httpStatusFor(allowed), std::string(allowed.message()));
      co_return;
    }
  }
  if (parser.state() != RequestParser::State::kBody) co_return;
  if (parser.sizedBody() && (*route)->observe) request.body_observer = (*route)->observe(request);
  if (parser.version() >= 11 && equalsIgnoreCase(request.header("expect"), "100-continue")) {
    static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    stream.expires_after(options.write_timeout);
    auto [ec, n] = co_await asio::async_write(
        stream, asio::buffer(kContinue.data(), kContinue.size()), kUseTuple);
    if (ec) parser.fail(0, "writing 100 Continue failed");
  }
}

asio::awaitable<boost::system::error_code> HttpServer::Impl::readRequest(Connection& conn,
                                                                         beast::flat_buffer& buffer,
                                                                         RequestParser& parser,
                                                                         const Route** route) {
  using State = RequestParser::State;
  beast::tcp_stream& stream = *conn.stream;
  // Until the request's first byte the connection waits (a shorter wait on a new connection);
  // from that byte on the whole request must arrive within read_timeout.
  auto now = std::chrono::steady_clock::now();
  auto deadline =
      now + (conn.served ? options.idle_timeout
                         : std::min(options.idle_timeout, options.first_request_timeout));
  auto started = [&] {
    conn.phase = Phase::kReading;
    deadline = std::chrono::steady_clock::now() + options.read_timeout;
  };
  conn.phase = Phase::kWaiting;
  if (buffer.size() > 0) started();
  for (;;) {
    // Parse what is buffered: the head, then (sized or chunked) body bytes that came with it.
    while (buffer.size() > 0 && parser.state() != State::kDone &&
           parser.state() != State::kFailed) {
      const auto& data = buffer.data();
      State before = parser.state();
      size_t used =
          parser.put(std::string_view(static_cast<const char*>(data.data()), data.size()));
      buffer.consume(used);
      if (before == State::kHead && parser.state() != State::kHead &&
          parser.state() != State::kFailed) {
        co_await onHead(stream, parser, route);
      } else if (before == State::kBody && parser.sizedBody() && used > 0 &&
                 parser.request().body_observer) {
        parser.request().body_observer->onBody(parser.bodyReceived(), parser.bodyLength());
      }
      if (used == 0) break;
    }
    if (parser.state() == State::kDone || parser.state() == State::kFailed)
      co_return boost::system::error_code();
    // A sized body is read straight into place; anything else through the buffer.
    bool direct = parser.state() == State::kBody && parser.sizedBody();
    asio::mutable_buffer room;
    if (direct) {
      std::span<char> space = parser.bodySpace();
      room = asio::buffer(space.data(), space.size());
    } else {
      room = buffer.prepare(beast::read_size(buffer, 64 * 1024));
    }
    auto [ec, n] = co_await internal::readSomeNowOrAsync(stream, room, deadline);
    if (ec == asio::error::eof) {
      parser.putEof();
      co_return boost::system::error_code();
    }
    if (ec) co_return ec;
    if (conn.phase == Phase::kWaiting) started();
    if (!direct) {
      buffer.commit(n);
      continue;
    }
    parser.commitBody(n);
    if (parser.request().body_observer) {
      parser.request().body_observer->onBody(parser.bodyReceived(), parser.bodyLength());
    }
  }
}

asio::awaitable<void> HttpServer::Impl::session(std::shared_ptr<Connection> conn) {
  auto self = shared_from_this();
  beast::tcp_stream& stream = *conn->stream;
  beast::flat_buffer buffer;
  // Beast sizes each read by the buffer's spare capacity (512 bytes for a fresh buffer), so
  // large bodies would arrive in 512-byte reads without this.
  buffer.reserve(64 * 1024);
  // The last sized body's memory, reused for the next one: its bytes are overwritten in place
  // rather than allocated (and zeroed) again.
  std::string spare_body;
  constexpr size_t kKeepBodyBytes = 4 << 20;
  std::string remote;
  {
    boost::system::error_code ec;
    auto ep = stream.socket().remote_endpoint(ec);
    if (!ec) remote = strCat(ep.address().to_string(), ":", ep.port());
  }
  while (!stopping) {
    RequestParser parser(limits, std::move(spare_body));
    const Route* route = nullptr;
    boost::system::error_code ec = co_await readRequest(*conn, buffer, parser, &route);
    if (ec) break;  // timed out or reset: nobody to answer
    if (parser.state() == RequestParser::State::kFailed) {
      if (parser.errorStatus() != 0) {
        co_await replyAndClose(stream, parser.errorStatus(), parser.errorMessage(), true);
      }
      break;
    }
    conn->served = true;
    conn->phase = Phase::kHandling;
    Request& request = parser.request();
    request.remote = remote;
    BeastResponseWriter writer(stream, parser.version(), parser.keepAlive() && !stopping,
                               options.write_timeout, &stopping);
    co_await dispatch(request, route, writer);
    spare_body = parser.takeBodyMemory();
    if (spare_body.capacity() > kKeepBodyBytes) spare_body = std::string();
    if (!writer.keepAlive()) break;
  }
  boost::system::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
  stream.socket().close(ignored);
  std::lock_guard lock(mu);
  release(*conn);
  connections.erase(conn);
}

}  // namespace kvf::http
