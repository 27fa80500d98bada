#include "experiments/replay/result_log.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <boost/json.hpp>

#include "common/json.h"
#include "common/strings.h"

namespace kvf::experiments {

namespace bj = boost::json;

std::string_view requestClass(int64_t new_tokens) {
  if (new_tokens < 5000) return "WARM";
  if (new_tokens <= 20000) return "MEDIUM";
  return "HEAVY";
}

int64_t RequestResult::newTokens() const {
  int64_t prompt = outcome.prompt_tokens >= 0 ? outcome.prompt_tokens : input_length;
  int64_t cached = std::max<int64_t>(outcome.cached_tokens, 0);
  return std::max<int64_t>(prompt - cached, 0);
}

namespace {

// The values a full sort of `v` would put at the p50 and p99 positions, and its maximum, in
// linear time (long streams have many gaps): one partition at p50, the next only above it, the
// maximum only above p99. Reorders `v`; -1 each when empty.
struct GapQuantiles {
  double p50 = -1, p99 = -1, max = -1;
};
GapQuantiles gapQuantiles(std::vector<double>& v) {
  GapQuantiles q;
  if (v.empty()) return q;
  auto at = [&](double p) {
    return static_cast<std::ptrdiff_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  };
  std::ptrdiff_t k50 = at(0.5), k99 = at(0.99);
  std::nth_element(v.begin(), v.begin() + k50, v.end());
  if (k99 > k50) std::nth_element(v.begin() + k50 + 1, v.begin() + k99, v.end());
  q.p50 = v[static_cast<size_t>(k50)];
  q.p99 = v[static_cast<size_t>(k99)];
  q.max = *std::max_element(v.begin() + k99, v.end());
  return q;
}

}  // namespace

namespace {

// Appends one result line's JSON text, byte for byte what boost::json::serialize prints for the
// same object (keys in insertion order, no spaces), without building the object: the simulator
// writes a line per request (a million per arm).
class LineWriter {
 public:
  explicit LineWriter(std::string* out) : out_(*out) { out_.push_back('{'); }
  void finish() { out_.push_back('}'); }

  void field(std::string_view key, std::string_view v) {
    this->key(key);
    // Quote and backslash need escapes, control bytes too: boost::json writes those.
    bool plain = std::none_of(v.begin(), v.end(), [](char c) {
      return c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20;
    });
    if (plain) {
      out_.push_back('"');
      out_.append(v);
      out_.push_back('"');
    } else {
      out_ += bj::serialize(bj::string_view(v.data(), v.size()));
    }
  }
  void field(std::string_view key, bool v) {
    this->key(key);
    out_ += v ? "true" : "false";
  }
  void field(std::string_view key, int64_t v) {
    this->key(key);
    char buf[24];
    auto end = std::to_chars(buf, buf + sizeof(buf), v).ptr;
    out_.append(buf, end);
  }
  void field(std::string_view key, int v) { field(key, static_cast<int64_t>(v)); }
  // Shortest round-trip digits in boost::json's (Ryu's) form: d.dddE-x, 0E0, no exponent sign
  // or padding. libstdc++'s std::to_chars is Ryu too, so the digits are the same; only the
  // exponent is spelled differently ("e-01" -> "E-1").
  void field(std::string_view key, double v) {
    this->key(key);
    if (!std::isfinite(v)) {  // never in a result line; boost::json's own spelling
      out_ += bj::serialize(bj::value(v));
      return;
    }
    char buf[40];
    auto end = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific).ptr;
    char* e = std::find(buf, end, 'e');
    out_.append(buf, e);
    out_.push_back('E');
    const char* exp = e + 1;
    if (*exp == '-') out_.push_back('-');
    if (*exp == '-' || *exp == '+') ++exp;
    while (exp + 1 < end && *exp == '0') ++exp;
    out_.append(exp, static_cast<size_t>(end - exp));
  }

 private:
  void key(std::string_view k) {  // keys are ours: plain ASCII, no escapes
    if (out_.size() > 1) out_.push_back(',');
    out_.push_back('"');
    out_.append(k);
    out_ += "\":";
  }
  std::string& out_;
};

}  // namespace

std::string RequestResult::toJsonLine() const {
  const CompletionOutcome& o = outcome;
  std::string text;
  text.reserve(512);
  LineWriter line(&text);
  line.field("request_id", request_id);
  line.field("session_id", session_id);
  line.field("turn", turn);
  line.field("arrival_s", arrival_s);
  line.field("sent_s", sent_s);
  line.field("input_length", input_length);
  line.field("output_length", output_length);
  line.field("class", requestClass(newTokens()));
  line.field("ok", o.ok);
  line.field("error", o.error);
  line.field("http_status", o.http_status);
  line.field("ttft_s", o.ttft_s);
  line.field("tpot_s", o.tpot_s);
  line.field("e2e_s", o.e2e_s);
  thread_local std::vector<double> gaps;  // a copy to partition, its capacity reused
  gaps.assign(o.itl_s.begin(), o.itl_s.end());
  GapQuantiles itl = gapQuantiles(gaps);
  line.field("itl_p50_s", itl.p50);
  line.field("itl_p99_s", itl.p99);
  line.field("itl_max_s", itl.max);
  line.field("output_tokens", o.output_tokens);
  line.field("prompt_tokens", o.prompt_tokens);
  line.field("cached_tokens", o.cached_tokens);
  line.field("cpu_cached_tokens", o.cpu_cached_tokens);
  line.field("disk_cached_tokens", o.disk_cached_tokens);
  line.field("instance", o.instance);
  line.field("decision", o.decision);
  line.field("reason", o.reason);
  line.field("predicted_cached_tokens", o.predicted_cached_tokens);
  if (!endpoint.empty()) line.field("endpoint", endpoint);  // several endpoints only
  line.finish();
  return text;
}

absl::StatusOr<RequestResult> RequestResult::fromJsonLine(std::string_view text) {
  auto parsed = json::parseObject(text);
  if (!parsed.ok()) return parsed.status();
  const bj::object& o = *parsed;
  RequestResult r;
  auto str = [&](std::string_view key) -> std::string {
    auto v = json::getString(o, key);
    return v.ok() ? std::string(*v) : std::string();
  };
  auto num = [&](std::string_view key, double fallback) {
    return json::getNumberOr(o, key, fallback).value_or(fallback);
  };
  auto integer = [&](std::string_view key, int64_t fallback) {
    return json::getIntOr(o, key, fallback).value_or(fallback);
  };
  r.request_id = str("request_id");
  if (r.request_id.empty()) return absl::InvalidArgumentError("result line has no request_id");
  r.session_id = str("session_id");
  r.turn = static_cast<int32_t>(integer("turn", 0));
  r.arrival_s = num("arrival_s", 0);
  r.sent_s = num("sent_s", 0);
  r.input_length = integer("input_length", 0);
  r.output_length = integer("output_length", 0);
  CompletionOutcome& out = r.outcome;
  out.ok = json::getBoolOr(o, "ok", false).value_or(false);
  out.error = str("error");
  out.http_status = static_cast<int>(integer("http_status", 0));
  out.ttft_s = num("ttft_s", -1);
  out.tpot_s = num("tpot_s", -1);
  out.e2e_s = num("e2e_s", -1);
  out.output_tokens = integer("output_tokens", 0);
  out.prompt_tokens = integer("prompt_tokens", -1);
  out.cached_tokens = integer("cached_tokens", -1);
  out.cpu_cached_tokens = integer("cpu_cached_tokens", 0);
  out.disk_cached_tokens = integer("disk_cached_tokens", 0);
  out.instance = str("instance");
  out.decision = str("decision");
  out.reason = str("reason");
  out.predicted_cached_tokens = integer("predicted_cached_tokens", -1);
  r.endpoint = str("endpoint");
  return r;
}

namespace {

// Reads complete lines; returns the byte length of the complete part (a torn tail is excluded).
absl::StatusOr<int64_t> readComplete(const std::string& path, std::vector<RequestResult>* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(strCat("cannot open ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  size_t end = text.rfind('\n');
  int64_t complete = end == std::string::npos ? 0 : static_cast<int64_t>(end + 1);
  size_t start = 0;
  int64_t line_no = 0;
  while (start < static_cast<size_t>(complete)) {
    size_t nl = text.find('\n', start);
    ++line_no;
    std::string_view line(text.data() + start, nl - start);
    start = nl + 1;
    if (line.empty()) continue;
    auto r = RequestResult::fromJsonLine(line);
    if (!r.ok()) {
      return absl::InvalidArgumentError(
          strCat(path, ":", line_no, ": ", std::string(r.status().message())));
    }
    out->push_back(std::move(*r));
  }
  return complete;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ResultLog>> ResultLog::open(const std::string& path, bool resume) {
  std::vector<RequestResult> existing;
  if (std::filesystem::exists(path)) {
    if (!resume) {
      return absl::AlreadyExistsError(
          strCat(path, " exists; pass --resume to continue it or choose another output"));
    }
    auto complete = readComplete(path, &existing);
    if (!complete.ok()) return complete.status();
    std::error_code ec;
    std::filesystem::resize_file(path, static_cast<uintmax_t>(*complete), ec);
    if (ec) return absl::InternalError(strCat("cannot trim ", path, ": ", ec.message()));
  }
  std::FILE* file = std::fopen(path.c_str(), "ab");
  if (!file) return absl::InternalError(strCat("cannot open ", path, ": ", std::strerror(errno)));
  auto log = std::unique_ptr<ResultLog>(new ResultLog(file));
  for (auto& r : existing) {
    log->done_.insert(r.request_id);
    log->results_.push_back(std::move(r));
  }
  return log;
}

ResultLog::~ResultLog() {
  if (file_) std::fclose(file_);
}

absl::Status ResultLog::append(const RequestResult& result) {
  std::string line = result.toJsonLine();
  line.push_back('\n');
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    return absl::InternalError(strCat("writing results: ", std::strerror(errno)));
  }
  done_.insert(result.request_id);
  results_.push_back(result);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RequestResult>> loadResults(const std::string& path) {
  std::vector<RequestResult> out;
  auto complete = readComplete(path, &out);
  if (!complete.ok()) return complete.status();
  return out;
}

}  // namespace kvf::experiments
