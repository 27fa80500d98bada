// Internal to common/http_server.cc and http_client.cc, the proxy's hot path: reads an HTTP
// header into a Beast parser with plain socket reads, parsing in place, instead of Beast's
// composed async_read_header (two nested composed operations and their completion hops per
// read); reads what has arrived without a trip through the scheduler; writes a message at once
// when it fits the socket. Single-threaded like the connection.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "common/http.h"

namespace kvf::http::internal {

// Reads until `parser` has the whole header (bytes after it stay in `buffer`). Errors are
// those of async_read_header: end_of_stream when the peer closed before sending anything,
// partial_message when it closed mid-header, header_limit, bad_* parse errors, and the
// stream's (timeout, reset). Returns the error and the bytes read from the socket.
template <bool isRequest>
boost::asio::awaitable<std::pair<boost::system::error_code, size_t>> readHeader(
    boost::beast::tcp_stream& stream, boost::beast::flat_buffer& buffer,
    boost::beast::http::basic_parser<isRequest>& parser) {
  namespace bhttp = boost::beast::http;
  std::pair<boost::system::error_code, size_t> result;
  auto& [ec, total] = result;
  for (;;) {
    if (buffer.size() > 0) {
      size_t used = parser.put(buffer.data(), ec);
      buffer.consume(used);
      if (ec != bhttp::error::need_more) {
        if (ec || parser.is_header_done()) co_return result;
        continue;
      }
      ec = {};
    }
    size_t room = boost::beast::read_size(buffer, 64 * 1024);
    if (room == 0) {  // the buffer's own limit, below the parser's header limit
      ec = bhttp::error::buffer_overflow;
      co_return result;
    }
    auto [read_ec, n] = co_await stream.async_read_some(
        buffer.prepare(room), boost::asio::as_tuple(boost::asio::use_awaitable));
    buffer.commit(n);
    total += n;
    if (read_ec == boost::asio::error::eof) {
      if (parser.got_some()) {
        parser.put_eof(ec);
        if (!ec) ec = bhttp::error::partial_message;
      } else {
        ec = bhttp::error::end_of_stream;
      }
      co_return result;
    }
    if (read_ec) {
      ec = read_ec;
      co_return result;
    }
  }
}

// Writes the serializer's message: at once when it fits the socket's send buffer (the socket
// must be non-blocking), without arming the timer, an asynchronous operation and a trip through
// the scheduler; what does not fit goes on asynchronously under `timeout`.
template <class Serializer>
boost::asio::awaitable<boost::system::error_code> writeNowOrAsync(
    boost::beast::tcp_stream& stream, Serializer& serializer, std::chrono::milliseconds timeout) {
  boost::system::error_code ec;
  boost::beast::http::write(stream.socket(), serializer, ec);
  if (ec == boost::asio::error::would_block || ec == boost::asio::error::try_again) {
    stream.expires_after(timeout);
    std::tie(ec, std::ignore) = co_await boost::beast::http::async_write(
        stream, serializer, boost::asio::as_tuple(boost::asio::use_awaitable));
  }
  co_return ec;
}

// Reads what has arrived into `room`: a non-blocking read while bytes are there (the socket must
// be non-blocking), else an asynchronous read that fails with beast::error::timeout at
// `deadline`. Returns the error (eof when the peer closed) and the bytes read.
inline boost::asio::awaitable<std::pair<boost::system::error_code, size_t>> readSomeNowOrAsync(
    boost::beast::tcp_stream& stream, boost::asio::mutable_buffer room,
    std::chrono::steady_clock::time_point deadline) {
  namespace asio = boost::asio;
  std::pair<boost::system::error_code, size_t> result;
  auto& [ec, n] = result;
  n = stream.socket().read_some(room, ec);
  if (ec == asio::error::would_block || ec == asio::error::try_again) {
    stream.expires_at(deadline);
    std::tie(ec, n) = co_await stream.async_read_some(room, asio::as_tuple(asio::use_awaitable));
  }
  co_return result;
}

}  // namespace kvf::http::internal
