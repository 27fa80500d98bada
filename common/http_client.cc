#include "common/http_client.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <limits>
#include <mutex>
#include <vector>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "common/http_io.h"
#include "common/strings.h"

namespace kvf::http {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
constexpr auto kUseTuple = asio::as_tuple(asio::use_awaitable);

class Connection {
 public:
  // Beast sizes each read by the buffer's spare capacity; reserve so bodies arrive in large reads.
  // The buffer only ever holds a response head or an incomplete chunk line / trailer section
  // (body bytes are parsed out of it as they come), so `max_buffered` bounds what an upstream
  // can make us hold there.
  Connection(asio::any_io_executor executor, size_t max_buffered)
      : stream(std::move(executor)), buffer(max_buffered) {
    buffer.reserve(64 * 1024);
  }

  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  // Response body bytes land here before ResponseStream::next() copies them out. One per
  // connection, reused by every request on it, and left uninitialised: a fresh 64 KiB block
  // per request (allocated, zeroed or consolidated by malloc) was a visible share of the
  // proxy's CPU and evicted hot cache lines.
  static constexpr size_t kBodyBufBytes = 64 * 1024;
  std::unique_ptr<char[]> body_buf = std::make_unique_for_overwrite<char[]>(kBodyBufBytes);
  std::chrono::steady_clock::time_point last_used{};

  void close() {
    boost::system::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream.socket().close(ignored);
  }

  // True if the idle socket has neither pending bytes nor a pending close from the peer.
  bool looksAlive() {
    if (!stream.socket().is_open()) return false;
    char byte;
    ssize_t r = ::recv(stream.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
};

struct HttpClient::Pool {
  mutable std::mutex mu;
  std::deque<std::unique_ptr<Connection>> idle;
  std::optional<tcp::resolver::results_type> resolved;
};

struct ResponseStream::State {
  std::unique_ptr<Connection> conn;
  bhttp::response_parser<bhttp::buffer_body> parser;
  std::chrono::milliseconds read_timeout{};
};

namespace {

absl::Status ioError(const boost::system::error_code& ec, std::string_view what,
                     const std::string& host, uint16_t port) {
  std::string where = strCat(what, " ", host, ":", port);
  if (ec == beast::error::timeout) return absl::DeadlineExceededError(where + ": timed out");
  return absl::UnavailableError(strCat(where, ": ", ec.message()));
}

bool isStaleConnectionError(const boost::system::error_code& ec) {
  return ec == bhttp::error::end_of_stream || ec == asio::error::eof ||
         ec == asio::error::connection_reset || ec == asio::error::broken_pipe ||
         ec == bhttp::error::partial_message;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

ResponseStream::ResponseStream(std::shared_ptr<HttpClient> client, std::unique_ptr<State> state)
    : client_(std::move(client)), state_(std::move(state)) {}

void RequestCanceller::cancel() {
  cancelled_ = true;
  if (conn_ != nullptr) conn_->close();
}

ResponseStream::~ResponseStream() {
  if (canceller_) canceller_->conn_ = nullptr;
  if (!state_ || !state_->conn) return;
  if (done_ && !failed_ && state_->parser.keep_alive()) {
    client_->release(std::move(state_->conn));
  } else {
    state_->conn->close();
  }
}

void ResponseStream::cancel() {
  failed_ = true;
  if (state_ && state_->conn) state_->conn->close();
}

asio::awaitable<absl::StatusOr<std::optional<std::string>>> ResponseStream::next() {
  if (done_) co_return std::optional<std::string>();
  if (failed_ || !state_ || !state_->conn || (canceller_ && canceller_->cancelled())) {
    failed_ = true;
    co_return absl::CancelledError("response stream was cancelled");
  }
  auto& parser = state_->parser;
  auto& conn = *state_->conn;
  for (;;) {
    parser.get().body().data = conn.body_buf.get();
    parser.get().body().size = Connection::kBodyBufBytes;
    boost::system::error_code ec;
    bool progressed = false;
    if (conn.buffer.size() > 0 && !parser.chunked()) {
      // Bytes of a sized body already read with the header (often all of it): parse them here
      // rather than through an asynchronous read that would complete at once via the
      // scheduler. Chunked streams keep the asynchronous path.
      parser.eager(true);
      size_t used = parser.put(conn.buffer.data(), ec);
      conn.buffer.consume(used);
      if (ec == bhttp::error::need_more) ec = {};
      progressed = used > 0 || ec;  // else an incomplete chunk header: read more below
    }
    if (!progressed) {
      conn.stream.expires_after(state_->read_timeout);
      auto [read_ec, n] =
          co_await bhttp::async_read_some(conn.stream, conn.buffer, parser, kUseTuple);
      ec = read_ec;
    }
    if (ec == bhttp::error::need_buffer) ec = {};
    if (ec) {
      failed_ = true;
      conn.close();
      if (canceller_ && canceller_->cancelled()) {
        co_return absl::CancelledError("response stream was cancelled");
      }
      co_return ioError(ec, "reading response body from", client_->host(), client_->port());
    }
    size_t got = Connection::kBodyBufBytes - parser.get().body().size;
    if (parser.is_done()) done_ = true;
    if (got > 0) co_return std::optional<std::string>(std::string(conn.body_buf.get(), got));
    if (done_) co_return std::optional<std::string>();
  }
}

asio::awaitable<absl::StatusOr<std::string>> ResponseStream::readAll(size_t limit) {
  std::string body;
  for (;;) {
    auto piece = co_await next();
    if (!piece.ok()) co_return piece.status();
    if (!piece->has_value()) break;
    if (body.size() + (*piece)->size() > limit) {
      cancel();
      co_return absl::ResourceExhaustedError(strCat("response body exceeds ", limit, " bytes"));
    }
    body += **piece;
  }
  co_return body;
}

// ---------------------------------------------------------------------------------------------

std::shared_ptr<HttpClient> HttpClient::create(asio::any_io_executor executor, std::string host,
                                               uint16_t port, ClientOptions options) {
  return std::shared_ptr<HttpClient>(
      new HttpClient(std::move(executor), std::move(host), port, std::move(options)));
}

HttpClient::HttpClient(asio::any_io_executor executor, std::string host, uint16_t port,
                       ClientOptions options)
    : executor_(std::move(executor)),
      host_(std::move(host)),
      port_(port),
      options_(std::move(options)),
      pool_(std::make_unique<Pool>()) {}

HttpClient::~HttpClient() { closeIdle(); }

size_t HttpClient::idleConnections() const {
  std::lock_guard lock(pool_->mu);
  return pool_->idle.size();
}

void HttpClient::closeIdle() {
  std::deque<std::unique_ptr<Connection>> idle;
  {
    std::lock_guard lock(pool_->mu);
    idle.swap(pool_->idle);
  }
  for (auto& conn : idle) conn->close();
}

void HttpClient::release(std::unique_ptr<Connection> conn) {
  conn->last_used = std::chrono::steady_clock::now();
  std::lock_guard lock(pool_->mu);
  if (pool_->idle.size() >= options_.max_idle_connections) {
    conn->close();
    return;
  }
  pool_->idle.push_back(std::move(conn));
}

std::unique_ptr<Connection> HttpClient::takeIdle() {
  auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(pool_->mu);
  while (!pool_->idle.empty()) {
    auto conn = std::move(pool_->idle.back());
    pool_->idle.pop_back();
    if (now - conn->last_used < options_.idle_ttl && conn->looksAlive()) return conn;
    conn->close();
  }
  return nullptr;
}

asio::awaitable<absl::StatusOr<std::unique_ptr<Connection>>> HttpClient::connect() {
  std::optional<tcp::resolver::results_type> resolved;
  {
    std::lock_guard lock(pool_->mu);
    resolved = pool_->resolved;
  }
  if (!resolved) {
    tcp::resolver resolver(executor_);
    auto [ec, results] = co_await resolver.async_resolve(host_, std::to_string(port_), kUseTuple);
    if (ec) co_return ioError(ec, "resolving", host_, port_);
    resolved = results;
    std::lock_guard lock(pool_->mu);
    pool_->resolved = results;
  }
  // A response head may take max_header_bytes; past a head, an upstream's chunk line or
  // trailers get at most 1 MiB.
  auto conn = std::make_unique<Connection>(
      executor_, std::max<size_t>(options_.max_header_bytes + 64 * 1024, 1 << 20));
  conn->stream.expires_after(options_.connect_timeout);
  auto [ec, endpoint] = co_await conn->stream.async_connect(*resolved, kUseTuple);
  if (ec) co_return ioError(ec, "connecting to", host_, port_);
  boost::system::error_code ignored;
  conn->stream.socket().set_option(tcp::no_delay(true), ignored);
  // Synchronous writes return would_block instead of waiting (see open()); asynchronous
  // operations are unaffected.
  conn->stream.socket().non_blocking(true, ignored);
  co_return conn;
}

asio::awaitable<absl::StatusOr<std::unique_ptr<ResponseStream>>> HttpClient::open(
    ClientRequest request) {
  auto self = shared_from_this();
  bhttp::verb verb = bhttp::string_to_verb(request.method);
  if (verb == bhttp::verb::unknown) {
    co_return absl::InvalidArgumentError(strCat("unknown HTTP method ", request.method));
  }
  // The body is written from where it lies: request.body (in this frame) or the caller's view.
  std::string_view body =
      request.body_view.empty() ? std::string_view(request.body) : request.body_view;
  bhttp::request<bhttp::span_body<const char>> message{verb, request.target, 11};
  message.set(bhttp::field::host, strCat(host_, ":", port_));
  message.set(bhttp::field::user_agent, "kvfabric");
  for (const auto& [k, v] : request.headers) message.set(k, v);
  if (!body.empty() || verb == bhttp::verb::post || verb == bhttp::verb::put) {
    message.set(bhttp::field::content_type, request.content_type);
  }
  message.keep_alive(true);
  message.body() = boost::span<const char>(body.data(), body.size());
  message.prepare_payload();
  auto read_timeout = request.read_timeout.value_or(options_.read_timeout);
  RequestCanceller* canceller = request.canceller.get();
  // The canceller closes the connection in use; it never outlives this frame's hold on it.
  struct Unregister {
    RequestCanceller* canceller;
    ~Unregister() {
      if (canceller != nullptr) canceller->conn_ = nullptr;
    }
  } unregister{canceller};
  auto cancelled = [&] { return canceller != nullptr && canceller->cancelled(); };
  const absl::Status cancelled_status = absl::CancelledError("request was cancelled");

  // A pooled connection may have been closed by the server while idle; if it fails before any
  // response byte arrives, the request is sent once more on a fresh connection.
  for (int attempt = 0;; ++attempt) {
    if (cancelled()) co_return cancelled_status;
    std::unique_ptr<Connection> conn = attempt == 0 ? takeIdle() : nullptr;
    bool reused = conn != nullptr;
    if (!conn) {
      auto connected = co_await connect();
      if (!connected.ok()) co_return connected.status();
      conn = std::move(*connected);
      if (cancelled()) {
        conn->close();
        co_return cancelled_status;
      }
    }
    if (canceller != nullptr) canceller->conn_ = conn.get();
    // A request usually fits the socket's send buffer and goes out at once; a large body or a
    // slow upstream continues asynchronously under the write timeout.
    bhttp::request_serializer<bhttp::span_body<const char>> serializer{message};
    boost::system::error_code wec =
        co_await internal::writeNowOrAsync(conn->stream, serializer, options_.write_timeout);
    if (wec) {
      if (canceller != nullptr) canceller->conn_ = nullptr;
      conn->close();
      if (cancelled()) co_return cancelled_status;
      if (reused && isStaleConnectionError(wec)) continue;
      co_return ioError(wec, "sending request to", host_, port_);
    }
    auto state = std::make_unique<ResponseStream::State>();
    state->parser.header_limit(static_cast<std::uint32_t>(options_.max_header_bytes));
    state->parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    state->read_timeout = read_timeout;
    conn->buffer.clear();
    conn->stream.expires_after(read_timeout);
    auto [rec, n] = co_await internal::readHeader(conn->stream, conn->buffer, state->parser);
    if (rec) {
      if (canceller != nullptr) canceller->conn_ = nullptr;
      conn->close();
      if (cancelled()) co_return cancelled_status;
      if (reused && isStaleConnectionError(rec) && n == 0) continue;
      co_return ioError(rec, "reading response from", host_, port_);
    }
    state->conn = std::move(conn);
    auto stream = std::unique_ptr<ResponseStream>(new ResponseStream(self, std::move(state)));
    stream->canceller_ = request.canceller;
    unregister.canceller = nullptr;  // the stream holds the connection now
    auto& header = stream->state_->parser.get();
    stream->status_ = static_cast<int>(header.result_int());
    for (const auto& field : header) {
      stream->headers_.emplace_back(std::string(field.name_string()), std::string(field.value()));
    }
    if (stream->state_->parser.is_done()) stream->done_ = true;
    co_return stream;
  }
}

asio::awaitable<absl::StatusOr<Response>> HttpClient::request(ClientRequest request) {
  auto opened = co_await open(std::move(request));
  if (!opened.ok()) co_return opened.status();
  auto& stream = **opened;
  auto body = co_await stream.readAll(options_.max_body_bytes);
  if (!body.ok()) co_return body.status();
  Response response;
  response.status = stream.status();
  response.headers = stream.headers();
  response.body = std::move(*body);
  co_return response;
}

}  // namespace kvf::http
