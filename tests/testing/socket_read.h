// Test helpers for tests that speak raw HTTP to a server: read everything a TCP peer sends
// until it closes the connection (or the read fails), as one string (run it on an IoThread);
// and send a request head alone and read the first answer (blocking, any thread).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <string_view>

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

// Sends `head` (a request head announcing a body) to 127.0.0.1:`port` without any body byte and
// returns the first bytes of the answer received within `timeout_s`; "" when none came (the
// server waits for the body) or the connection failed.
inline std::string answerToHeadAlone(uint16_t port, std::string_view head, int timeout_s = 2) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return {};
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  timeval tv{timeout_s, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::send(fd, head.data(), head.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(head.size())) {
    char buf[512];
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n > 0) out.assign(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

}  // namespace kvf::testing
