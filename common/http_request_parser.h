// Parses one HTTP/1.1 request for common/'s server from bytes given in any split, so the
// server's socket loop and the fuzz target (tests/fuzz/) drive the same code. The head goes
// through Beast's parser; then the framing checks Beast leaves to its user (RFC 9112 6.1/6.3:
// a transfer coding other than a lone `chunked` is refused and the connection closed); then the
// body. A sized body grows with the bytes that arrived, never from Content-Length up front; a
// chunked body counts its framing (chunk lines, extensions, trailers) against the body limit,
// and an incomplete chunk line or trailer block may not exceed the header limit. While a chunk
// line or the trailer section is incomplete, Beast is shown the bytes again only once newly
// arrived ones could complete it, so the work per byte does not grow with the line.
// Single-threaded; one object per request.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "absl/status/status.h"
#include "common/http.h"

namespace kvf::http {

struct RequestLimits {
  size_t max_header_bytes = 16 * 1024;       // request line + headers, and trailers -> 431
  size_t max_body_bytes = 16 * 1024 * 1024;  // body bytes (chunked: on the wire) -> 413
  size_t max_chunk_extension_bytes = 4096;   // extensions of one chunk line -> 400
};

class RequestParser {
 public:
  enum class State {
    kHead,    // reading the request line and headers
    kBody,    // head read and checked (request() has it), body in progress
    kDone,    // request complete; bytes after it belong to the next request
    kFailed,  // errorStatus()/errorMessage() say what to answer
  };

  // `spare_body` is memory of an earlier body to reuse for a sized body (its size is kept, so
  // no byte of it is written again until the new body needs more room than it had).
  explicit RequestParser(const RequestLimits& limits, std::string spare_body = {});
  RequestParser(const RequestParser&) = delete;
  RequestParser& operator=(const RequestParser&) = delete;

  // Consumes a prefix of `bytes` and returns its length. Bytes not consumed (an incomplete
  // head, chunk line or trailers) must be given again at the start of the next call. Stops
  // right after the head (so the caller can look at it before any body byte is taken), and
  // consumes nothing in kDone or kFailed.
  size_t put(std::string_view bytes);
  // The peer closed its sending side: a request in progress fails without an answer.
  void putEof();
  // Fails the request with `status` (0: close without answering).
  void fail(int status, std::string message);

  State state() const { return state_; }
  bool gotSome() const { return parser_.got_some(); }
  // Method, target, path, query and headers from kBody on; the body at kDone.
  Request& request() { return request_; }
  const Request& request() const { return request_; }
  unsigned version() const { return parser_.get().version(); }
  bool keepAlive() const { return parser_.get().keep_alive(); }
  // kFailed: the HTTP status to answer with (0: close without answering) and why.
  int errorStatus() const { return error_status_; }
  const std::string& errorMessage() const { return error_message_; }

  // A body with a Content-Length (not chunked), which a caller may read straight into place:
  // bodySpace() is room after the bytes received so far (it grows the body by at most what has
  // arrived, plus 64 KiB, never past the length); commitBody(n) records n bytes written at its
  // start. put() in kBody does the same from its argument.
  bool sizedBody() const { return sized_; }
  size_t bodyLength() const { return length_; }
  std::string_view bodyReceived() const { return {request_.body.data(), received_}; }
  std::span<char> bodySpace();
  void commitBody(size_t n);
  // After the request was handled: the larger of its body's memory and the unused spare, to
  // give the next parser on the connection.
  std::string takeBodyMemory();
  // Bytes of the chunked body's framing examined so far: those shown to Beast plus those the
  // parser scanned itself for a line end. Linear in the bytes received however they arrive
  // (a measure of the parser's cost, for tests).
  uint64_t bytesScanned() const { return bytes_scanned_; }

 private:
  void onHead();
  absl::Status checkFraming() const;
  size_t putChunked(std::string_view bytes);
  bool chunkedMayProgress(std::string_view window);
  void failFromParser(const boost::system::error_code& ec);

  RequestLimits limits_;
  // Declared before the parser, which keeps a reference to it.
  std::function<void(std::uint64_t, std::string_view, boost::system::error_code&)> on_chunk_;
  boost::beast::http::request_parser<boost::beast::http::string_body> parser_;
  State state_ = State::kHead;
  Request request_;
  std::string spare_body_;  // becomes the body's storage when a sized body starts
  int error_status_ = 0;
  std::string error_message_;
  bool sized_ = false;
  size_t length_ = 0;
  size_t received_ = 0;
  size_t chunked_wire_bytes_ = 0;
  size_t head_bytes_ = 0;  // bytes of the head Beast has taken (the start line goes first)
  uint64_t chunked_body_bytes_ = 0;  // sum of the chunk sizes announced so far
  bool chunk_extension_too_long_ = false;
  // Chunked: the leading bytes of the unconsumed input that Beast (or the line-end scan) has
  // seen without being able to go on, and whether Beast has the last chunk's line and waits for
  // the end of the trailer section (an empty line) rather than for a chunk line's end.
  size_t chunk_seen_ = 0;
  bool awaiting_trailers_ = false;
  uint64_t bytes_scanned_ = 0;
};

}  // namespace kvf::http
