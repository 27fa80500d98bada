// The replayer against a scripted in-process endpoint whose timings are known: first token
// after kFirstTokenMs, then one token every kTokenGapMs. Checks every measured metric against
// the script, the crash-safe result log (torn line, resume without loss or duplication), and
// both dispatch modes.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <random>

#include <fmt/format.h>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>

#include "common/http_server.h"
#include "common/json.h"
#include "common/process.h"
#include "experiments/replay/replayer.h"
#include "experiments/replay/summary.h"
#include "tests/testing/io_thread.h"
#include "tests/testing/temp_dir.h"

namespace kvf::experiments {
namespace {

using namespace std::chrono_literals;
namespace bj = boost::json;

constexpr int kFirstTokenMs = 300;
constexpr int kTokenGapMs = 50;
constexpr int64_t kCached = 32;
constexpr int64_t kCpuCached = 16;  // of kCached, onboarded from host memory
constexpr int64_t kDiskCached = 8;  // and from disk

class ScriptedEndpoint {
 public:
  explicit ScriptedEndpoint(asio::io_context& ioc) {
    server_ = std::move(*http::HttpServer::create(ioc, {}));
    server_->route(
        "POST", "/v1/completions",
        [this](const http::Request& r, http::ResponseWriter& w) -> asio::awaitable<void> {
          co_await serve(r, w);
        });
    server_->route("GET", "/v1/models",
                   [](const http::Request&, http::ResponseWriter& w) -> asio::awaitable<void> {
                     co_await w.sendJson(200, R"({"object":"list","data":[{"id":"scripted"}]})");
                   });
    server_->start();
  }
  uint16_t port() const { return server_->port(); }
  std::map<std::string, int> calls() {
    std::lock_guard lock(mu_);
    return calls_;
  }
  std::vector<std::pair<std::string, Nanos>> arrivals() {
    std::lock_guard lock(mu_);
    return arrivals_;
  }
  bj::object lastBody() {
    std::lock_guard lock(mu_);
    return last_body_;
  }

 private:
  asio::awaitable<void> serve(const http::Request& r, http::ResponseWriter& w) {
    auto body = json::parseObject(r.body);
    if (!body.ok()) {
      co_await w.sendStatus(body.status());
      co_return;
    }
    int64_t max_tokens = (*body)["max_tokens"].as_int64();
    int64_t prompt_tokens = static_cast<int64_t>((*body)["prompt"].as_array().size());
    {
      std::lock_guard lock(mu_);
      calls_[std::string(r.header("x-request-id"))]++;
      arrivals_.emplace_back(std::string(r.header("x-request-id")), SteadyClock().now());
      last_body_ = *body;
    }
    http::Headers headers = {{"x-kvf-instance", std::string("e3")},
                             {"x-kvf-decision", std::string("local")},
                             {"x-kvf-predicted-cached-tokens", std::string("30")}};
    co_await w.beginStream(200, "text/event-stream", headers);
    asio::steady_timer timer(co_await asio::this_coro::executor);
    for (int64_t i = 0; i < max_tokens; ++i) {
      timer.expires_after(std::chrono::milliseconds(i == 0 ? kFirstTokenMs : kTokenGapMs));
      co_await timer.async_wait(asio::use_awaitable);
      std::string chunk = R"({"choices":[{"index":0,"text":" t"}]})";
      if (!(co_await w.writeEvent(chunk)).ok()) co_return;
    }
    std::string usage =
        fmt::format(R"({{"choices":[],"usage":{{"prompt_tokens":{},"completion_tokens":{},)"
                    R"("prompt_tokens_details":{{"cached_tokens":{},"kvf_cpu_cached_tokens":{},)"
                    R"("kvf_disk_cached_tokens":{}}}}}}})",
                    prompt_tokens, max_tokens, kCached, kCpuCached, kDiskCached);
    co_await w.writeEvent(usage);
    co_await w.writeEvent("[DONE]");
    co_await w.endStream();
  }

  std::unique_ptr<http::HttpServer> server_;
  std::mutex mu_;
  std::map<std::string, int> calls_;
  std::vector<std::pair<std::string, Nanos>> arrivals_;
  bj::object last_body_;
};

trace::Request makeRequest(std::string id, double arrival_s, int64_t input, int64_t output,
                           std::string session = "", double think_s = -1) {
  trace::Request r;
  r.id = std::move(id);
  r.arrival = secondsToNanos(arrival_s);
  r.input_length = input;
  r.output_length = output;
  r.block_size = 16;
  r.session_id = std::move(session);
  r.think_time = think_s < 0 ? -1 : secondsToNanos(think_s);
  return r;
}

std::vector<int32_t> fakePrompt(const trace::Request& r) {
  return std::vector<int32_t>(static_cast<size_t>(r.input_length), 7);
}

class ReplayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    endpoint_ = std::make_unique<ScriptedEndpoint>(io_.context());
    dir_ =
        kvf::testing::freshTempDir(std::string("kvf_replay_") +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }

  absl::Status replay(std::vector<trace::Request> requests, ReplayOptions options, ResultLog* log) {
    auto client = http::HttpClient::create(io_.executor(), "127.0.0.1", endpoint_->port());
    Replayer replayer(client, options, fakePrompt, log);
    return io_.run(
        [&]() -> asio::awaitable<absl::Status> { co_return co_await replayer.run(requests); }, 60s);
  }

  testing::IoThread io_;
  std::unique_ptr<ScriptedEndpoint> endpoint_;
  std::filesystem::path dir_;
};

TEST_F(ReplayTest, MeasuresEveryMetricAgainstTheScript) {
  auto log = ResultLog::open((dir_ / "r.jsonl").string(), false);
  ASSERT_TRUE(log.ok()) << log.status();
  ReplayOptions options;
  options.progress = false;
  ASSERT_TRUE(replay({makeRequest("a", 0, 100, 5, "s1")}, options, log->get()).ok());
  ASSERT_EQ((*log)->results().size(), 1u);
  const RequestResult& r = (*log)->results()[0];
  const CompletionOutcome& o = r.outcome;
  ASSERT_TRUE(o.ok) << o.error;
  // Timers never fire early, so the script gives hard lower bounds; the upper bounds allow for
  // a loaded machine.
  EXPECT_GE(o.ttft_s, kFirstTokenMs / 1000.0);
  EXPECT_LT(o.ttft_s, kFirstTokenMs / 1000.0 + 0.25);
  double expected_e2e = (kFirstTokenMs + 4 * kTokenGapMs) / 1000.0;
  EXPECT_GE(o.e2e_s, expected_e2e);
  EXPECT_LT(o.e2e_s, expected_e2e + 0.3);
  EXPECT_NEAR(o.tpot_s, (o.e2e_s - o.ttft_s) / 4, 1e-9);
  EXPECT_GE(o.tpot_s, kTokenGapMs / 1000.0 - 0.002);
  ASSERT_EQ(o.itl_s.size(), 4u);
  for (double gap : o.itl_s) EXPECT_GE(gap, kTokenGapMs / 1000.0 - 0.002);
  EXPECT_EQ(o.output_tokens, 5);
  EXPECT_EQ(o.prompt_tokens, 100);
  EXPECT_EQ(o.cached_tokens, kCached);
  EXPECT_EQ(o.cpu_cached_tokens, kCpuCached);
  EXPECT_EQ(o.disk_cached_tokens, kDiskCached);
  EXPECT_EQ(o.instance, "e3");
  EXPECT_EQ(o.decision, "local");
  EXPECT_EQ(o.predicted_cached_tokens, 30);
  EXPECT_EQ(r.newTokens(), 100 - kCached);

  // The request body carries the token ids, the exact output length and the session.
  bj::object body = endpoint_->lastBody();
  EXPECT_EQ(body["prompt"].as_array().size(), 100u);
  EXPECT_EQ(body["max_tokens"].as_int64(), 5);
  EXPECT_EQ(body["min_tokens"].as_int64(), 5);
  EXPECT_TRUE(body["ignore_eos"].as_bool());
  EXPECT_TRUE(body["stream"].as_bool());
  EXPECT_EQ(body["user"].as_string(), "s1");
  EXPECT_EQ(body["model"].as_string(), "scripted");  // discovered at /v1/models

  // The line on disk round-trips.
  auto loaded = loadResults((dir_ / "r.jsonl").string());
  ASSERT_TRUE(loaded.ok());
  ASSERT_EQ(loaded->size(), 1u);
  EXPECT_DOUBLE_EQ((*loaded)[0].outcome.ttft_s, o.ttft_s);
  EXPECT_EQ((*loaded)[0].outcome.cached_tokens, kCached);
  EXPECT_EQ((*loaded)[0].outcome.cpu_cached_tokens, kCpuCached);
  EXPECT_EQ((*loaded)[0].outcome.disk_cached_tokens, kDiskCached);
}

TEST_F(ReplayTest, TimestampDispatchFollowsTraceTimesWithoutCap) {
  auto log = ResultLog::open((dir_ / "r.jsonl").string(), false);
  ASSERT_TRUE(log.ok());
  ReplayOptions options;
  options.progress = false;
  options.time_scale = 2.0;  // trace seconds 0, 0.4, 0.8 -> 0, 0.2, 0.4 s
  ASSERT_TRUE(replay({makeRequest("a", 10.0, 10, 3), makeRequest("b", 10.4, 10, 3),
                      makeRequest("c", 10.8, 10, 3)},
                     options, log->get())
                  .ok());
  auto arrivals = endpoint_->arrivals();
  ASSERT_EQ(arrivals.size(), 3u);
  double gap_ab = nanosToSeconds(arrivals[1].second - arrivals[0].second);
  double gap_ac = nanosToSeconds(arrivals[2].second - arrivals[0].second);
  EXPECT_GE(gap_ab, 0.19);
  EXPECT_LT(gap_ab, 0.35);
  EXPECT_GE(gap_ac, 0.39);
  EXPECT_LT(gap_ac, 0.55);
  // No cap: "b" was sent while "a" (which takes > 300 ms) was still running.
  EXPECT_EQ((*log)->results().size(), 3u);
}

TEST_F(ReplayTest, SessionDispatchWaitsForPreviousTurnPlusThinkTime) {
  auto log = ResultLog::open((dir_ / "r.jsonl").string(), false);
  ASSERT_TRUE(log.ok());
  ReplayOptions options;
  options.progress = false;
  options.dispatch = DispatchMode::kSession;
  // Turn 2's trace time (0.1 s) is before turn 1 can finish (~0.4 s): it must wait for turn 1
  // plus its think time of 0.2 s.
  ASSERT_TRUE(replay({makeRequest("t1", 0, 10, 3, "s"), makeRequest("t2", 0.1, 10, 3, "s", 0.2)},
                     options, log->get())
                  .ok());
  const auto& results = (*log)->results();
  ASSERT_EQ(results.size(), 2u);
  const RequestResult& t1 = results[0].request_id == "t1" ? results[0] : results[1];
  const RequestResult& t2 = results[0].request_id == "t1" ? results[1] : results[0];
  EXPECT_GE(t2.sent_s, t1.sent_s + t1.outcome.e2e_s + 0.2 - 0.005);
}

TEST_F(ReplayTest, ResumeAfterCrashNeitherLosesNorDuplicates) {
  std::string path = (dir_ / "r.jsonl").string();
  // A run that crashed after finishing "a" and while writing "b".
  {
    RequestResult done;
    done.request_id = "a";
    done.outcome.ok = true;
    done.outcome.ttft_s = 0.5;
    std::ofstream out(path);
    out << done.toJsonLine() << "\n"
        << R"({"request_id":"b","ok":tr)";
  }
  EXPECT_EQ(ResultLog::open(path, false).status().code(), absl::StatusCode::kAlreadyExists);
  auto log = ResultLog::open(path, true);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ((*log)->done().size(), 1u);
  ReplayOptions options;
  options.progress = false;
  ASSERT_TRUE(replay({makeRequest("a", 0, 10, 2), makeRequest("b", 0.05, 10, 2),
                      makeRequest("c", 0.1, 10, 2)},
                     options, log->get())
                  .ok());
  auto calls = endpoint_->calls();
  EXPECT_EQ(calls.count("a"), 0u);
  EXPECT_EQ(calls["b"], 1);
  EXPECT_EQ(calls["c"], 1);
  log->reset();
  auto loaded = loadResults(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), 3u);
  std::map<std::string, int> seen;
  for (const auto& r : *loaded) seen[r.request_id]++;
  EXPECT_EQ(seen, (std::map<std::string, int>{{"a", 1}, {"b", 1}, {"c", 1}}));
}

// Client-side round robin over router replicas: requests are dealt to the endpoints in turn,
// each result names the one it went to (also after a round trip through the file), and the
// summary counts per endpoint.
TEST_F(ReplayTest, SeveralEndpointsAreDealtRequestsInTurn) {
  ScriptedEndpoint second(io_.context());
  std::vector<ReplayEndpoint> endpoints = {
      {"http://127.0.0.1:1",
       http::HttpClient::create(io_.executor(), "127.0.0.1", endpoint_->port())},
      {"http://127.0.0.1:2", http::HttpClient::create(io_.executor(), "127.0.0.1", second.port())}};
  std::string path = (dir_ / "r.jsonl").string();
  auto log = ResultLog::open(path, false);
  ASSERT_TRUE(log.ok());
  ReplayOptions options;
  options.progress = false;
  std::vector<trace::Request> requests;
  for (int i = 0; i < 6; ++i)
    requests.push_back(makeRequest(fmt::format("q{}", i), i * 0.01, 10, 1));
  Replayer replayer(std::move(endpoints), options, fakePrompt, log->get());
  ASSERT_TRUE(
      io_.run([&]() -> asio::awaitable<absl::Status> { co_return co_await replayer.run(requests); },
              60s)
          .ok());
  // Dispatched in arrival order: even requests to the first, odd ones to the second.
  auto first = endpoint_->calls(), other = second.calls();
  EXPECT_EQ(first, (std::map<std::string, int>{{"q0", 1}, {"q2", 1}, {"q4", 1}}));
  EXPECT_EQ(other, (std::map<std::string, int>{{"q1", 1}, {"q3", 1}, {"q5", 1}}));
  log->reset();
  auto loaded = loadResults(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), 6u);
  for (const auto& r : *loaded) {
    int i = r.request_id[1] - '0';
    EXPECT_EQ(r.endpoint, i % 2 == 0 ? "http://127.0.0.1:1" : "http://127.0.0.1:2") << r.request_id;
  }
  ReplaySummary summary = summarize(*loaded);
  ASSERT_EQ(summary.by_endpoint.size(), 2u);
  EXPECT_EQ(summary.by_endpoint["http://127.0.0.1:1"].requests, 3u);
  EXPECT_EQ(summary.by_endpoint["http://127.0.0.1:2"].errors, 0u);
  EXPECT_NE(formatSummary(summary).find("endpoint http://127.0.0.1:2: 3 requests, 0 errors"),
            std::string::npos);
}

// A replica URL that nobody answers stops the replay before any request is sent, with an error
// naming that URL, instead of failing every other request.
TEST_F(ReplayTest, DeadEndpointIsReportedBeforeAnyRequest) {
  auto picked = pickFreePort();  // free, nobody listens: connecting to it is refused
  ASSERT_TRUE(picked.ok());
  const uint16_t dead = *picked;
  auto addresses = parseEndpointList(
      fmt::format("http://127.0.0.1:{},http://127.0.0.1:{}/", endpoint_->port(), dead));
  ASSERT_TRUE(addresses.ok()) << addresses.status();
  ASSERT_EQ(addresses->size(), 2u);
  EXPECT_EQ((*addresses)[1].url, fmt::format("http://127.0.0.1:{}", dead));
  auto log = ResultLog::open((dir_ / "r.jsonl").string(), false);
  ASSERT_TRUE(log.ok());
  ReplayOptions options;
  options.progress = false;
  options.timeout = 5s;
  trace::TokenSynthOptions synth;
  absl::Status s = replayTrace({makeRequest("a", 0, 10, 1), makeRequest("b", 0.01, 10, 1)},
                               *addresses, options, synth, log->get());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find(fmt::format("endpoint 2 of 2 (http://127.0.0.1:{})", dead)),
            std::string::npos)
      << s;
  EXPECT_TRUE(endpoint_->calls().empty());
  EXPECT_TRUE((*log)->results().empty());
}

TEST(EndpointList, ParsesAndNamesTheBadEntry) {
  auto one = parseEndpointList("http://127.0.0.1:8000");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ((*one)[0].host, "127.0.0.1");
  EXPECT_EQ((*one)[0].port, 8000);
  auto two = parseEndpointList("http://a:1, b:2");
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ((*two)[1].url, "b:2");
  EXPECT_EQ((*two)[1].port, 2);
  for (const char* bad : {"", "http://a:1,", "http://a:0", "http://a:1,http://b", "http://a:1/v1",
                          "http://a:99999", "http://a:1,http://a:1", "http://a:1x"}) {
    auto r = parseEndpointList(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("--url"), std::string::npos) << bad;
  }
}

// The result line is written field by field: the same bytes boost::json::serialize prints for
// the same object (the reference below builds it), for escaped strings and doubles across the
// range (zero of both signs, subnormal, huge, integral, short and 17-digit fractions).
TEST(ResultLine, SameBytesAsTheJsonObject) {
  auto reference = [](const RequestResult& r) {
    const CompletionOutcome& o = r.outcome;
    std::vector<double> gaps = o.itl_s;
    auto quantile = [&](double p) {
      if (gaps.empty()) return -1.0;
      std::sort(gaps.begin(), gaps.end());
      return gaps[static_cast<size_t>(p * static_cast<double>(gaps.size() - 1) + 0.5)];
    };
    bj::object line;
    line["request_id"] = r.request_id;
    line["session_id"] = r.session_id;
    line["turn"] = r.turn;
    line["arrival_s"] = r.arrival_s;
    line["sent_s"] = r.sent_s;
    line["input_length"] = r.input_length;
    line["output_length"] = r.output_length;
    line["class"] = std::string(requestClass(r.newTokens()));
    line["ok"] = o.ok;
    line["error"] = o.error;
    line["http_status"] = o.http_status;
    line["ttft_s"] = o.ttft_s;
    line["tpot_s"] = o.tpot_s;
    line["e2e_s"] = o.e2e_s;
    line["itl_p50_s"] = quantile(0.5);
    line["itl_p99_s"] = quantile(0.99);
    line["itl_max_s"] = gaps.empty() ? -1.0 : *std::max_element(gaps.begin(), gaps.end());
    line["output_tokens"] = o.output_tokens;
    line["prompt_tokens"] = o.prompt_tokens;
    line["cached_tokens"] = o.cached_tokens;
    line["cpu_cached_tokens"] = o.cpu_cached_tokens;
    line["disk_cached_tokens"] = o.disk_cached_tokens;
    line["instance"] = o.instance;
    line["decision"] = o.decision;
    line["reason"] = o.reason;
    line["predicted_cached_tokens"] = o.predicted_cached_tokens;
    return bj::serialize(line);
  };
  const std::vector<double> doubles = {0.0,     -0.0,     1.0,         -1.0, 0.1,
                                       1e-320,  2.5e-308, 1.7e308,     1e21, 123456789.0,
                                       1.0 / 3, 2.0 / 3,  0.247923885, 1e-9, 3.7805327500000006e-2};
  const std::vector<std::string> strings = {"",
                                            "s1#1",
                                            "say \"hi\"",
                                            "back\\slash",
                                            "line\nbreak",
                                            std::string("nul\0byte", 8),
                                            "tab\tand\x01ctl",
                                            "caf\xc3\xa9 \xe2\x9c\x93"};
  std::mt19937_64 rng(11);
  for (int i = 0; i < 3000; ++i) {
    auto pick_d = [&] {
      if (rng() % 3 == 0) return doubles[rng() % doubles.size()];
      return std::ldexp(static_cast<double>(rng() >> 11), static_cast<int>(rng() % 120) - 90) *
             (rng() % 2 == 0 ? 1 : -1);
    };
    auto pick_s = [&] { return strings[rng() % strings.size()]; };
    RequestResult r;
    r.request_id = pick_s();
    r.session_id = pick_s();
    r.turn = static_cast<int32_t>(rng() % 1000) - 5;
    r.arrival_s = pick_d();
    r.sent_s = pick_d();
    r.input_length = static_cast<int64_t>(rng() >> (rng() % 64));
    r.output_length = -static_cast<int64_t>(rng() % 100000);
    r.outcome.ok = rng() % 2 == 0;
    r.outcome.error = pick_s();
    r.outcome.http_status = static_cast<int>(rng() % 600);
    r.outcome.ttft_s = pick_d();
    r.outcome.tpot_s = pick_d();
    r.outcome.e2e_s = pick_d();
    // Gaps are durations: no sign, so equal values are equal bytes whichever the partition picks.
    for (size_t n = rng() % 300; n > 0; --n) r.outcome.itl_s.push_back(std::fabs(pick_d()));
    r.outcome.output_tokens = static_cast<int64_t>(rng() % 5000);
    r.outcome.prompt_tokens = static_cast<int64_t>(rng() % 200000) - 1;
    r.outcome.cached_tokens = static_cast<int64_t>(rng() % 200000) - 1;
    r.outcome.instance = pick_s();
    r.outcome.decision = pick_s();
    r.outcome.reason = pick_s();
    r.outcome.predicted_cached_tokens = std::numeric_limits<int64_t>::min() + 1 + (i % 3);
    ASSERT_EQ(r.toJsonLine(), reference(r)) << i;
  }
}

TEST(Summary, PercentilesAndClasses) {
  std::vector<RequestResult> results;
  for (int i = 1; i <= 100; ++i) {
    RequestResult r;
    r.request_id = std::to_string(i);
    r.input_length = i <= 50 ? 1000 : 30000;
    r.outcome.ok = i != 100;
    r.outcome.prompt_tokens = r.input_length;
    r.outcome.cached_tokens = 0;
    r.outcome.ttft_s = i;
    r.outcome.e2e_s = 2.0 * i;
    r.outcome.tpot_s = 0.01;
    results.push_back(r);
  }
  ReplaySummary s = summarize(results);
  EXPECT_EQ(s.requests, 100u);
  EXPECT_EQ(s.errors, 1u);
  EXPECT_EQ(s.ttft.count, 99u);
  EXPECT_DOUBLE_EQ(s.ttft.p50, 50);
  EXPECT_DOUBLE_EQ(s.ttft.p90, 90);
  EXPECT_DOUBLE_EQ(s.ttft.p99, 99);
  EXPECT_DOUBLE_EQ(s.ttft.mean, 50);
  EXPECT_EQ(s.by_class["WARM"].requests, 50u);
  EXPECT_EQ(s.by_class["HEAVY"].requests, 50u);
  EXPECT_EQ(s.by_class["HEAVY"].errors, 1u);
  EXPECT_NE(formatSummary(s).find("TTFT"), std::string::npos);
}

}  // namespace
}  // namespace kvf::experiments
