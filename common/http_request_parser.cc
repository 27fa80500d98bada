#include "common/http_request_parser.h"

#include <algorithm>
#include <limits>
#include <vector>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>

#include "common/strings.h"

namespace kvf::http {

namespace bhttp = boost::beast::http;

namespace {

// A sized body's storage grows ahead of the bytes received by at most this (or by what has
// arrived, whichever is more), so a peer that announces a large Content-Length and sends
// nothing costs this much, not the announced size.
constexpr size_t kBodyGrowthBytes = 64 * 1024;

std::string_view trimOws(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The transfer codings of every Transfer-Encoding field, in order (empty list elements, which
// RFC 9110 5.6.1 allows, are dropped).
std::vector<std::string_view> transferCodings(const Headers& headers) {
  std::vector<std::string_view> codings;
  for (const auto& [name, value] : headers) {
    if (!equalsIgnoreCase(name, "transfer-encoding")) continue;
    std::string_view rest = value;
    while (!rest.empty()) {
      size_t comma = rest.find(',');
      std::string_view element = trimOws(rest.substr(0, comma));
      if (!element.empty()) codings.push_back(element);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    }
  }
  return codings;
}

// What Beast waits for when it took none of `rest` (the bytes after the chunk data it took)
// and asked for more.
enum class ChunkWait {
  kLineEnd,   // the end of a chunk line
  kTrailers,  // the empty line that ends the trailer section (it holds the last chunk's line)
  kNothing,   // a quoted extension runs on past its line's end: Beast can only refuse it
};

ChunkWait chunkWait(std::string_view rest) {
  const size_t start = rest.starts_with("\r\n") ? 2 : 0;  // the CRLF after the chunk data
  const size_t cr = rest.find("\r\n", start);
  if (cr == std::string_view::npos) return ChunkWait::kLineEnd;
  // A whole line Beast did not take: the last chunk's (size zero), or one whose extension Beast
  // reads on past the line's end (a quoted string lasts until its closing quote, wherever that
  // is), which fails as soon as Beast sees where the string ends.
  size_t zeros = start;
  while (zeros < cr && rest[zeros] == '0') ++zeros;
  const auto hex = [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  };
  const bool last = zeros > start && !hex(rest[zeros]);
  if (last && rest.find("\r\n\r\n", cr) == std::string_view::npos) return ChunkWait::kTrailers;
  return ChunkWait::kNothing;
}

}  // namespace

RequestParser::RequestParser(const RequestLimits& limits, std::string spare_body)
    : limits_(limits), spare_body_(std::move(spare_body)) {
  parser_.header_limit(static_cast<std::uint32_t>(
      std::min<size_t>(limits_.max_header_bytes, std::numeric_limits<std::uint32_t>::max())));
  parser_.body_limit(limits_.max_body_bytes);
  on_chunk_ = [this](std::uint64_t size, std::string_view extensions,
                     boost::system::error_code& ec) {
    if (extensions.size() > limits_.max_chunk_extension_bytes) {
      chunk_extension_too_long_ = true;
      ec = bhttp::error::bad_chunk_extension;
      return;
    }
    if (size > limits_.max_body_bytes - chunked_body_bytes_) {  // no wrap: sum <= limit
      ec = bhttp::error::body_limit;
      return;
    }
    chunked_body_bytes_ += size;
  };
  parser_.on_chunk_header(on_chunk_);
}

void RequestParser::fail(int status, std::string message) {
  state_ = State::kFailed;
  error_status_ = status;
  error_message_ = std::move(message);
}

void RequestParser::failFromParser(const boost::system::error_code& ec) {
  if (ec == bhttp::error::body_limit) {
    fail(413, strCat("request body exceeds ", limits_.max_body_bytes, " bytes"));
  } else if (ec == bhttp::error::header_limit) {
    fail(431, "request headers too large");
  } else if (chunk_extension_too_long_) {
    fail(400, strCat("chunk extensions longer than ", limits_.max_chunk_extension_bytes, " bytes"));
  } else {
    fail(400, strCat("malformed request: ", ec.message()));
  }
}

size_t RequestParser::put(std::string_view bytes) {
  if (bytes.empty()) return 0;
  switch (state_) {
    case State::kHead: {
      // Beast takes the start line first and limits it and the fields each to the header limit,
      // so a head that arrived in one read passed the limit (a 2 KB head, a 1 KB limit) where
      // the same head in pieces got 431. Showing it no more than what is left of the limit
      // makes the limit hold for the whole head however the bytes arrive.
      const size_t room =
          limits_.max_header_bytes - std::min(head_bytes_, limits_.max_header_bytes);
      std::string_view window = bytes.substr(0, room);
      boost::system::error_code ec;
      size_t used = parser_.put(boost::asio::const_buffer(window.data(), window.size()), ec);
      head_bytes_ += used;
      if (ec == bhttp::error::need_more) {
        if (used == 0 && window.size() == room) failFromParser(bhttp::error::header_limit);
        return used;
      }
      if (ec) {
        failFromParser(ec);
      } else if (parser_.is_header_done()) {
        onHead();
      }
      return used;
    }
    case State::kBody: {
      if (!sized_) return putChunked(bytes);
      std::span<char> room = bodySpace();
      size_t n = std::min(room.size(), bytes.size());
      std::copy_n(bytes.data(), n, room.data());
      commitBody(n);
      return n;
    }
    case State::kDone:
    case State::kFailed:
      return 0;
  }
  return 0;
}

void RequestParser::putEof() {
  if (state_ == State::kDone || state_ == State::kFailed) return;
  fail(0, gotSome() ? "connection closed mid-request" : "connection closed");
}

absl::Status RequestParser::checkFraming() const {
  bool present = false;
  for (const auto& [name, value] : request_.headers) {
    present = present || equalsIgnoreCase(name, "transfer-encoding");
  }
  if (!present) return absl::OkStatus();
  // RFC 9112 6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing.
  if (version() < 11) return absl::InvalidArgumentError("Transfer-Encoding in an HTTP/1.0 request");
  // RFC 9112 6.3: Transfer-Encoding overrides Content-Length; a request with both is a
  // smuggling attempt more often than not.
  if (!request_.header("content-length").empty()) {
    return absl::InvalidArgumentError("both Transfer-Encoding and Content-Length");
  }
  std::vector<std::string_view> codings = transferCodings(request_.headers);
  if (codings.empty() || !equalsIgnoreCase(codings.back(), "chunked")) {
    return absl::InvalidArgumentError(strCat("Transfer-Encoding must end with chunked, got \"",
                                             codings.empty() ? "" : codings.back(), "\""));
  }
  for (size_t i = 0; i + 1 < codings.size(); ++i) {
    if (equalsIgnoreCase(codings[i], "chunked")) {
      return absl::InvalidArgumentError("chunked applied more than once");
    }
    return absl::UnimplementedError(
        strCat("transfer coding \"", codings[i], "\" is not supported"));
  }
  // Beast must have read the same framing, or the body would be parsed as the next request.
  if (!parser_.chunked()) return absl::InvalidArgumentError("unreadable Transfer-Encoding");
  return absl::OkStatus();
}

void RequestParser::onHead() {
  const auto& head = parser_.get();
  request_.method = std::string(head.method_string());
  request_.target = std::string(head.target());
  size_t q = request_.target.find('?');
  request_.path = request_.target.substr(0, q);
  if (q != std::string::npos) request_.query = request_.target.substr(q + 1);
  for (const auto& field : head) {
    request_.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  if (absl::Status framing = checkFraming(); !framing.ok()) {
    fail(framing.code() == absl::StatusCode::kUnimplemented ? 501 : 400,
         std::string(framing.message()));
    return;
  }
  if (parser_.is_done()) {
    state_ = State::kDone;
    return;
  }
  if (parser_.chunked()) {
    // Beast takes a chunk's size off its body limit before it knows the chunk line is
    // complete, and again on every retry while the line's extensions wait for more bytes, so
    // its limit would depend on how the bytes arrived; the chunk callback counts instead.
    parser_.body_limit(boost::none);
    parser_.eager(true);
    state_ = State::kBody;
    return;
  }
  if (!parser_.content_length()) {  // a request body is sized or chunked (RFC 9112 6.3)
    fail(400, "request body without Content-Length or chunked coding");
    return;
  }
  // Beast's header parse already refused a length over the body limit.
  sized_ = true;
  length_ = static_cast<size_t>(*parser_.content_length());
  state_ = length_ == 0 ? State::kDone : State::kBody;
}

std::span<char> RequestParser::bodySpace() {
  if (state_ != State::kBody || !sized_) return {};
  if (received_ == 0 && request_.body.empty()) {
    request_.body = std::move(spare_body_);
    if (request_.body.size() > length_) request_.body.resize(length_);
  }
  size_t want = std::min(length_, std::max(received_ * 2, received_ + kBodyGrowthBytes));
  if (request_.body.size() < want) request_.body.resize(want);
  return {request_.body.data() + received_, request_.body.size() - received_};
}

void RequestParser::commitBody(size_t n) {
  received_ += std::min(n, length_ - received_);
  if (received_ == length_) {
    request_.body.resize(length_);
    state_ = State::kDone;
  }
}

std::string RequestParser::takeBodyMemory() {
  if (request_.body.capacity() >= spare_body_.capacity()) return std::move(request_.body);
  return std::move(spare_body_);
}

bool RequestParser::chunkedMayProgress(std::string_view window) {
  // Beast answers "need more" until a chunk line's CR has a byte after it (the line ends, or its
  // ending is malformed) or, once it holds the last chunk's line, until the trailer section ends
  // with an empty line; in a line's first bytes it can also fail on the CRLF that must follow
  // the previous chunk's data. Beast keeps its own scan position for most of this, but holding
  // the last chunk it rescans that line on every call (a long last-chunk line and trailers
  // trickled a byte at a time cost quadratic time), and each call is shown the whole unconsumed
  // window: bytes that cannot let it go on are only scanned here, once each.
  if (chunk_seen_ > window.size() || window.size() == limits_.max_header_bytes) return true;
  bool may = false;
  if (awaiting_trailers_) {
    // Only the section's end lets Beast go on (and it asserts it is then shown 5 bytes or more,
    // which a last chunk that is also the first, "0\r\n", has not before its trailers).
    const size_t from = std::max<size_t>(chunk_seen_, 3);
    bytes_scanned_ += window.size() - std::min(from - 3, window.size());
    for (size_t i = from; i < window.size() && !may; ++i) {
      may = window[i] == '\n' && window.substr(i - 3, 4) == "\r\n\r\n";
    }
  } else {
    constexpr size_t kLineStart = 8;  // covers "\r\n" + the first bytes of a line
    if (chunk_seen_ < kLineStart) return true;
    const size_t from = chunk_seen_ - 1;  // a CR seen last time may now have its next byte
    bytes_scanned_ += window.size() - from;
    // A CR with a byte after it: the line ends there, or its ending is malformed.
    size_t cr = window.find('\r', from);
    may = cr != std::string_view::npos && cr + 1 < window.size();
  }
  if (!may) chunk_seen_ = window.size();
  return may;
}

size_t RequestParser::putChunked(std::string_view bytes) {
  // Beast takes chunk data as it comes but waits for a whole chunk line or trailer section,
  // however long. Showing it at most a header's worth at a time bounds what it waits for, and
  // the outcome does not depend on how the bytes arrived (a long line fails the same way
  // whether it came in one read or many).
  std::string_view window = bytes.substr(0, limits_.max_header_bytes);
  if (!chunkedMayProgress(window)) return 0;
  bytes_scanned_ += window.size();
  boost::system::error_code ec;
  size_t used = parser_.put(boost::asio::const_buffer(window.data(), window.size()), ec);
  chunked_wire_bytes_ += used;
  chunk_seen_ = 0;
  awaiting_trailers_ = false;
  ChunkWait wait = ChunkWait::kLineEnd;
  if (ec == bhttp::error::need_more) {
    ec = {};
    std::string_view rest = window.substr(used);
    bytes_scanned_ += rest.size();
    wait = chunkWait(rest);
    chunk_seen_ = rest.size();
    awaiting_trailers_ = wait == ChunkWait::kTrailers;
  }
  if (ec) {
    failFromParser(ec);
  } else if (chunked_wire_bytes_ > limits_.max_body_bytes) {
    // Chunk lines, extensions and trailers count: a body cannot hide past the limit in them.
    fail(413, strCat("request body exceeds ", limits_.max_body_bytes,
                     " bytes (chunked, framing included)"));
  } else if (parser_.is_done()) {
    request_.body = std::move(parser_.get().body());
    state_ = State::kDone;
  } else if (wait == ChunkWait::kNothing) {
    // Refused now, not when the string's end arrives, so the outcome does not depend on
    // whether it arrives before the header limit or the peer's close.
    failFromParser(bhttp::error::bad_chunk_extension);
  } else if (used == 0 && window.size() == limits_.max_header_bytes) {
    fail(431,
         strCat("chunk line or trailer section longer than ", limits_.max_header_bytes, " bytes"));
  }
  return used;
}

}  // namespace kvf::http
