// Plain HTTP message types shared by the server and client in common/, free of Beast so that
// users of the HTTP layer compile against this header and Asio's awaitable only.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

namespace kvf {
namespace asio = boost::asio;
}  // namespace kvf

namespace kvf::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

// Case-insensitive header lookup; empty when absent.
std::string_view findHeader(const Headers& headers, std::string_view name);

// Sees a request body while it arrives, before the handler runs (e.g. to parse a large body
// as it comes in instead of after its last byte). Created per request by the route's
// BodyObserverFactory for bodies with a Content-Length; runs on the connection's thread.
class BodyObserver {
 public:
  virtual ~BodyObserver() = default;
  // `received`: the body's first bytes so far (each call a longer prefix of the same bytes);
  // `total`: the Content-Length. Called after every read, the last time with all of it.
  virtual void onBody(std::string_view received, size_t total) = 0;
};

// A request as the server hands it to a handler.
struct Request {
  std::string method;  // "GET", "POST", ...
  std::string target;  // path and query as sent
  std::string path;    // target up to '?'
  std::string query;   // after '?', without it
  Headers headers;
  std::string body;
  std::string remote;  // "ip:port" of the peer
  // What the route's BodyObserverFactory made for this request (see HttpServer::route); null
  // when the route has none or the body was chunked or empty.
  std::shared_ptr<BodyObserver> body_observer;

  std::string_view header(std::string_view name) const { return findHeader(headers, name); }
};

// Called with the request's head (body still empty) once its headers are read.
using BodyObserverFactory = std::function<std::shared_ptr<BodyObserver>(const Request& head)>;

// A complete (buffered) response as the client returns it.
struct Response {
  int status = 0;
  Headers headers;
  std::string body;

  std::string_view header(std::string_view name) const { return findHeader(headers, name); }
};

// The value of one query parameter (no percent-decoding beyond '+' and %XX); empty if absent.
std::string queryParam(std::string_view query, std::string_view name);

}  // namespace kvf::http
