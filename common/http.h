// Plain HTTP message types shared by the server and client in common/, free of Beast so that
// users of the HTTP layer compile against this header and Asio's awaitable only.
#pragma once

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

// A request as the server hands it to a handler.
struct Request {
  std::string method;  // "GET", "POST", ...
  std::string target;  // path and query as sent
  std::string path;    // target up to '?'
  std::string query;   // after '?', without it
  Headers headers;
  std::string body;
  std::string remote;  // "ip:port" of the peer

  std::string_view header(std::string_view name) const { return findHeader(headers, name); }
};

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
