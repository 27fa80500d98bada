#include "common/http_request_parser.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvf::http {
namespace {

struct Parsed {
  RequestParser::State state = RequestParser::State::kHead;
  int status = 0;
  std::string message;
  std::string method, target, body;
  size_t consumed = 0;   // bytes of the input this request took
  uint64_t scanned = 0;  // RequestParser::bytesScanned()
};

// Feeds `input` to one parser in pieces of `piece` bytes (the unconsumed rest of each call is
// given again with the next piece, as the server's buffer does).
Parsed parse(std::string_view input, const RequestLimits& limits, size_t piece = SIZE_MAX) {
  RequestParser parser(limits);
  std::string pending;
  size_t offset = 0;
  size_t consumed = 0;
  using State = RequestParser::State;
  while (parser.state() != State::kDone && parser.state() != State::kFailed) {
    size_t take = std::min(piece, input.size() - offset);
    pending.append(input.substr(offset, take));
    offset += take;
    size_t used;
    do {
      used = parser.put(pending);
      pending.erase(0, used);
      consumed += used;
    } while (used > 0 && !pending.empty());
    if (take == 0) {
      if (parser.state() != State::kDone && parser.state() != State::kFailed) parser.putEof();
      break;
    }
  }
  Parsed out;
  out.state = parser.state();
  out.status = parser.errorStatus();
  out.message = parser.errorMessage();
  out.method = parser.request().method;
  out.target = parser.request().target;
  if (parser.state() == State::kDone) out.body = parser.request().body;
  out.consumed = consumed;
  out.scanned = parser.bytesScanned();
  return out;
}

using State = RequestParser::State;

TEST(RequestParserTest, SizedChunkedAndEmptyBodiesReadAlikeInAnySplit) {
  RequestLimits limits;
  struct Case {
    std::string input;
    std::string body;
  };
  std::vector<Case> cases = {
      {"GET /a?x=1 HTTP/1.1\r\nHost: h\r\n\r\n", ""},
      {"POST /a HTTP/1.1\r\nContent-Length: 0\r\n\r\n", ""},
      {"POST /a HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", "hello"},
      {"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
       "3\r\nabc\r\n2;name=val\r\nde\r\n0\r\nX-Trailer: t\r\n\r\n",
       "abcde"},
      {"POST /a HTTP/1.1\r\nTransfer-Encoding: , Chunked\r\n\r\n1\r\nz\r\n0\r\n\r\n", "z"},
  };
  for (const Case& c : cases) {
    for (size_t piece : {size_t{1}, size_t{2}, size_t{7}, SIZE_MAX}) {
      // A pipelined request after this one is left alone.
      std::string input = c.input + "GET /next HTTP/1.1\r\n\r\n";
      Parsed p = parse(input, limits, piece);
      ASSERT_EQ(p.state, State::kDone) << c.input << " piece " << piece << ": " << p.message;
      EXPECT_EQ(p.body, c.body) << c.input;
      EXPECT_EQ(p.consumed, c.input.size()) << c.input << " piece " << piece;
    }
  }
}

TEST(RequestParserTest, TransferCodingsOtherThanALoneChunkedAreRefused) {
  RequestLimits limits;
  struct Case {
    std::string headers;
    int status;
  };
  std::vector<Case> cases = {
      {"Transfer-Encoding: identity\r\n", 400},
      {"Transfer-Encoding: gzip\r\n", 400},
      {"Transfer-Encoding: chunked, identity\r\n", 400},
      {"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n", 400},
      {"Transfer-Encoding: chunked, chunked\r\n", 400},
      {"Transfer-Encoding: gzip, chunked\r\n", 501},
      {"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n", 501},
      {"Transfer-Encoding: identity\r\nContent-Length: 3\r\n", 400},
      {"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n", 400},
      {"Transfer-Encoding: chunked;q=1\r\n", 400},
  };
  for (const Case& c : cases) {
    Parsed p = parse("POST /a HTTP/1.1\r\n" + c.headers + "\r\n3\r\nabc\r\n0\r\n\r\n", limits);
    EXPECT_EQ(p.state, State::kFailed) << c.headers;
    EXPECT_EQ(p.status, c.status) << c.headers << p.message;
  }
  Parsed http10 = parse("POST /a HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", limits);
  EXPECT_EQ(http10.status, 400);
}

TEST(RequestParserTest, ChunkFramingCountsAgainstTheBodyLimit) {
  RequestLimits limits;
  limits.max_body_bytes = 1000;
  std::string head = "POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  // 300 data bytes in 1-byte chunks: 1800 bytes on the wire.
  std::string tiny;
  for (int i = 0; i < 300; ++i) tiny += "1\r\nx\r\n";
  Parsed p = parse(head + tiny + "0\r\n\r\n", limits, 64);
  EXPECT_EQ(p.state, State::kFailed);
  EXPECT_EQ(p.status, 413) << p.message;

  // A chunk announcing more than the limit fails at its line, and a size near 2^64 cannot wrap
  // the running sum.
  EXPECT_EQ(parse(head + "3e9\r\n", limits).status, 413);
  EXPECT_EQ(
      parse(head + "10\r\n" + std::string(16, 'x') + "\r\nfffffffffffffff0\r\n", limits).status,
      413);
  // A quoted extension cut by the line's end waits for more bytes; the outcome (and the limit)
  // is the same whether the bytes come at once or one by one.
  std::string quoted = head + "8;c=\"d e\r\n" + std::string(900, 'x') + "\"z";
  EXPECT_EQ(parse(quoted, limits).status, 400);
  EXPECT_EQ(parse(quoted, limits, 1).status, 400);

  // One extension past its cap, and a chunk line past the header limit however it arrives.
  limits.max_body_bytes = 1 << 20;
  limits.max_chunk_extension_bytes = 64;
  p = parse(head + "1;" + std::string(100, 'e') + "\r\nx\r\n0\r\n\r\n", limits);
  EXPECT_EQ(p.status, 400) << p.message;
  limits.max_header_bytes = 512;
  std::string ext;
  while (ext.size() < 4096) ext += ";a=b";
  for (size_t piece : {size_t{100}, SIZE_MAX}) {
    p = parse(head + "1" + ext + "\r\nx\r\n0\r\n\r\n", limits, piece);
    EXPECT_EQ(p.state, State::kFailed);
    EXPECT_EQ(p.status, 431) << p.message;
  }
  // Trailers are bounded the same way.
  p = parse(head + "0\r\nX-T: " + std::string(4096, 't') + "\r\n\r\n", limits, 100);
  EXPECT_EQ(p.status, 431) << p.message;
}

// A client trickling a long chunk line or trailer section a byte per read must not make the
// parser rescan what it already holds on every read: the bytes examined stay a small multiple
// of the bytes received (a rescan per byte would be about n^2/2), and the outcome is the one
// the bytes get when they come at once.
TEST(RequestParserTest, TrickledChunkLinesAndTrailersCostLinearWork) {
  RequestLimits limits;  // 16 KiB header limit, 4 KiB of extensions
  const std::string head = "POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  std::string trailers;
  for (int i = 0; trailers.size() < 12000; ++i) trailers += "X-T" + std::to_string(i) + ": v\r\n";
  struct Case {
    std::string name, body;
    State state;
    int status;
  };
  const std::vector<Case> cases = {
      // A quoted extension that never ends: the line reaches the header limit.
      {"endless chunk line", "5;a=\"" + std::string(17000, 'x'), State::kFailed, 431},
      // The last chunk's line with extensions, then 12 KB of trailers.
      {"last chunk and trailers",
       "5\r\nhello\r\n0;a=\"" + std::string(3000, 'x') + "\"\r\n" + trailers + "\r\n", State::kDone,
       0},
      {"endless trailers", "0\r\n" + trailers + trailers, State::kFailed, 431},
      // Malformed framing fails at the same byte either way.
      {"CR inside a chunk line", "5;a=\"" + std::string(3000, 'x') + "\rx\"\r\nhello\r\n0\r\n\r\n",
       State::kFailed, 400},
      {"no CRLF after the data", "5\r\nhello" + std::string(3000, 'y'), State::kFailed, 400},
      {"LFs in a quoted extension", "5;a=\"" + std::string(3000, '\n') + "\"\r\nhello\r\n0\r\n\r\n",
       State::kDone, 0},
      // A quoted extension running on past its line's end (Beast reads it on to the closing
      // quote): refused at the line's end, not at the quote, the header limit or the close.
      {"quote past the line", "8;c=\"d e\r\n" + std::string(9000, 'x') + "\"z", State::kFailed,
       400},
      {"quote past the last line", "0;c=\"d\r\nX-T: " + std::string(9000, 'x') + "\r\n\r\n",
       State::kFailed, 400},
  };
  for (const Case& c : cases) {
    const std::string input = head + c.body;
    Parsed whole = parse(input, limits);
    EXPECT_EQ(whole.state, c.state) << c.name << ": " << whole.message;
    EXPECT_EQ(whole.status, c.status) << c.name << ": " << whole.message;
    for (size_t piece : {size_t{1}, size_t{2}, size_t{5}, size_t{1000}}) {
      Parsed p = parse(input, limits, piece);
      EXPECT_EQ(p.state, whole.state) << c.name << " piece " << piece;
      EXPECT_EQ(p.status, whole.status) << c.name << " piece " << piece;
      EXPECT_EQ(p.message, whole.message) << c.name << " piece " << piece;
      EXPECT_EQ(p.body, whole.body) << c.name << " piece " << piece;
      EXPECT_LE(p.scanned, 8 * input.size()) << c.name << " piece " << piece;
    }
  }
}

TEST(RequestParserTest, SizedBodyGrowsWithWhatArrivedNotWithContentLength) {
  RequestLimits limits;
  limits.max_body_bytes = 64 << 20;
  RequestParser parser(limits);
  std::string head = "POST /a HTTP/1.1\r\nContent-Length: 60000000\r\n\r\n";
  ASSERT_EQ(parser.put(head), head.size());
  ASSERT_EQ(parser.state(), State::kBody);
  EXPECT_EQ(parser.bodyLength(), 60000000u);
  EXPECT_EQ(parser.put("abc"), 3u);
  EXPECT_LE(parser.request().body.capacity(), 128u * 1024);
  // Reading straight into place grows at most by what arrived (doubling) plus 64 KiB.
  size_t received = 3;
  while (received < (1u << 20)) {
    std::span<char> room = parser.bodySpace();
    ASSERT_FALSE(room.empty());
    EXPECT_LE(room.size(), std::max(received, size_t{64 * 1024}));
    parser.commitBody(room.size());
    received += room.size();
    EXPECT_EQ(parser.bodyReceived().size(), received);
  }
  EXPECT_LE(parser.request().body.capacity(), 4u * received);
  EXPECT_EQ(parser.state(), State::kBody);
  parser.putEof();
  EXPECT_EQ(parser.state(), State::kFailed);
  EXPECT_EQ(parser.errorStatus(), 0);  // nobody to answer
}

TEST(RequestParserTest, LimitsAndMalformedHeads) {
  RequestLimits limits;
  limits.max_header_bytes = 256;
  limits.max_body_bytes = 100;
  EXPECT_EQ(parse("POST /a HTTP/1.1\r\nContent-Length: 101\r\n\r\n", limits).status, 413);
  EXPECT_EQ(parse("GET /a HTTP/1.1\r\nX: " + std::string(300, 'x') + "\r\n\r\n", limits, 10).status,
            431);
  EXPECT_EQ(parse("GARBAGE\r\n\r\n", limits).status, 400);
  EXPECT_EQ(
      parse("POST /a HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", limits).status,
      400);
  // A malformed request line in a head past the header limit: Beast checks the line at once
  // only on the first call for a request, so it is 400 when it arrives whole and 431 when it
  // trickles in; refused either way, and never read as a request.
  std::string bad_line_long_head =
      "POST /a\x03\x02 HTTP/0.1x\r\nX: " + std::string(300, 'x') + "\r\n\r\n";
  EXPECT_EQ(parse(bad_line_long_head, limits).status, 400);
  for (size_t piece : {1, 10, 97}) {
    Parsed trickled = parse(bad_line_long_head, limits, piece);
    EXPECT_EQ(trickled.state, State::kFailed) << piece;
    EXPECT_TRUE(trickled.status == 400 || trickled.status == 431)
        << piece << " " << trickled.status;
    if (piece == 1) {
      EXPECT_EQ(trickled.status, 431);  // the line never arrives whole at once
    }
  }
  // The header limit holds for a head that arrives in one read as for one that trickles in.
  for (size_t target : {10, 200}) {
    std::string head = "GET /" + std::string(target, 'a') +
                       " HTTP/1.1\r\nX: " + std::string(240, 'x') + "\r\n\r\n";
    for (size_t piece : {size_t{1}, size_t{7}, SIZE_MAX}) {
      EXPECT_EQ(parse(head, limits, piece).status, 431) << target << " " << piece;
    }
  }
  Parsed cut = parse("GET /a HTTP/1.1\r\nHo", limits);
  EXPECT_EQ(cut.state, State::kFailed);
  EXPECT_EQ(cut.status, 0);
}

}  // namespace
}  // namespace kvf::http
