// Fuzz target: the HTTP server's request parser (common/http_request_parser.h), fed a byte
// stream of pipelined requests as the server's socket loop feeds it. Input: byte 0 picks the
// size of the pieces the stream arrives in; the rest is the stream. Properties: the same stream
// parses to the same requests (and the same failure) whole and in pieces; a body never exceeds
// the body limit and matches its Content-Length; what waits unparsed stays within the header
// limit (plus the piece that just arrived).
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/http_request_parser.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using kvf::http::RequestLimits;
using kvf::http::RequestParser;
using State = RequestParser::State;

struct Outcome {
  State state;
  int status = 0;
  std::string method, target, body;
  kvf::http::Headers headers;
  bool operator==(const Outcome&) const = default;
};

Outcome record(const RequestParser& p) {
  Outcome o{p.state(), p.errorStatus()};
  if (p.state() == State::kDone) {
    o.method = p.request().method;
    o.target = p.request().target;
    o.headers = p.request().headers;
    o.body = p.request().body;
  }
  return o;
}

std::vector<Outcome> parseStream(std::string_view input, const RequestLimits& limits,
                                 size_t piece) {
  std::vector<Outcome> out;
  std::string pending;
  size_t offset = 0;
  auto parser = std::make_unique<RequestParser>(limits);
  for (;;) {
    size_t take = std::min(piece, input.size() - offset);
    pending.append(input.substr(offset, take));
    offset += take;
    for (;;) {
      size_t used = parser->put(pending);
      pending.erase(0, used);
      if (parser->state() == State::kDone) {
        const auto& request = parser->request();
        KVF_FUZZ_CHECK(request.body.size() <= limits.max_body_bytes, "body over the limit");
        std::string_view length = request.header("content-length");
        if (!length.empty()) {
          // Compared as numbers: "09" announces 9 bytes.
          uint64_t announced = 0;
          auto [end, ec] = std::from_chars(length.data(), length.data() + length.size(), announced);
          KVF_FUZZ_CHECK(ec != std::errc() || end != length.data() + length.size() ||
                             announced == request.body.size(),
                         "body length differs from Content-Length");
        }
        out.push_back(record(*parser));
        parser = std::make_unique<RequestParser>(limits);
        continue;
      }
      if (parser->state() == State::kFailed) {
        out.push_back(record(*parser));
        return out;
      }
      if (used == 0 || pending.empty()) break;
    }
    KVF_FUZZ_CHECK(pending.size() <= limits.max_header_bytes + take,
                   "unparsed bytes past the header limit");
    if (take == 0) break;
  }
  if (parser->gotSome()) {
    parser->putEof();
    out.push_back(record(*parser));
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto in = kvf::fuzz::splitInput(data, size);
  if (!in) return 0;
  size_t piece = size_t{in->choice} % 97 + 1;
  std::string_view input = in->rest;
  RequestLimits limits;
  limits.max_header_bytes = 1024;
  limits.max_body_bytes = 4096;
  limits.max_chunk_extension_bytes = 64;
  std::vector<Outcome> whole = parseStream(input, limits, SIZE_MAX);
  std::vector<Outcome> split = parseStream(input, limits, piece);
  // The requests read must be the same however the bytes arrive. The last outcome may differ in
  // one way: Beast checks a request line as soon as it sees one only when that is the first
  // call for the request (afterwards it waits for the whole head), so a malformed head can get
  // its 400 in one split, and in another wait for more (closed at the end, no answer) or reach
  // the header limit first (431). Either way the request is refused.
  auto headRefused = [](const Outcome& o) {
    return o.state == State::kFailed && (o.status == 0 || o.status == 400 || o.status == 431);
  };
  bool same = whole == split;
  if (!same && !whole.empty() && whole.size() == split.size()) {
    same = std::equal(whole.begin(), whole.end() - 1, split.begin()) && headRefused(whole.back()) &&
           headRefused(split.back()) && (whole.back().status == 400 || split.back().status == 400);
  }
  KVF_FUZZ_CHECK(same, "parse depends on how the bytes arrive");
  return 0;
}
