// Test helper: read everything a TCP peer sends until it closes the connection (or the read
// fails), as one string. For tests that speak raw HTTP to a server; run it on an IoThread.
#pragma once

#include <string>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace kvf::testing {

inline boost::asio::awaitable<std::string> readUntilClosed(boost::asio::ip::tcp::socket& socket) {
  namespace asio = boost::asio;
  std::string out;
  char buf[4096];
  for (;;) {
    auto [ec, n] =
        co_await socket.async_read_some(asio::buffer(buf), asio::as_tuple(asio::use_awaitable));
    out.append(buf, n);
    if (ec) break;
  }
  co_return out;
}

}  // namespace kvf::testing
