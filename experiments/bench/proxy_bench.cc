// kvf-proxy-bench: added latency of proxies in front of one engine. Sends non-streaming
// token-id completions at a fixed open-loop rate to each target in turn (phases of a few
// seconds, rotated over several rounds so drift hits every target alike) and reports latency
// percentiles per target and the difference to the baseline target (the engine reached
// directly). experiments/bench/proxy_overhead.sh starts the engine, kvf-router and nginx.
// One io thread; requests are independent coroutines, so a slow target never delays the clock.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>

#include "absl/flags/flag.h"
#include "common/cli.h"
#include "common/http_client.h"
#include "common/strings.h"
#include "experiments/bench/bench_stats.h"

ABSL_FLAG(std::string, targets, "",
          "Comma-separated name=host:port; the first is the baseline (the engine itself)");
ABSL_FLAG(std::string, model, "qwen3-coder-30b-a3b", "Model name sent in each request");
ABSL_FLAG(double, rate, 200, "Requests per second sent to the target of the current phase");
ABSL_FLAG(int, prompt_tokens, 1000, "Token ids per prompt");
ABSL_FLAG(double, phase_s, 3, "Seconds per target per round");
ABSL_FLAG(int, rounds, 5, "Rotations over all targets");
ABSL_FLAG(double, warmup_s, 1, "Unrecorded seconds per target before the first round");
ABSL_FLAG(std::string, json_out, "", "Also write the results as JSON here");

namespace kvf::bench {
namespace {

namespace asio = boost::asio;
namespace bj = boost::json;
using Clock = std::chrono::steady_clock;

struct Target {
  std::string name;
  std::shared_ptr<http::HttpClient> client;
  std::vector<double> latencies_us;
  int64_t errors = 0;
};

// A fixed prefix (cached on the engine after the first request) and a varying last token, so
// every target sees the same engine work: a cache hit and a one-token prefill.
std::string requestBody(int prompt_tokens, int64_t seq) {
  std::string out = kvf::strCat("{\"model\":\"", absl::GetFlag(FLAGS_model), "\",\"prompt\":[");
  for (int i = 0; i + 1 < prompt_tokens; ++i) {
    out += std::to_string(1000 + (static_cast<uint64_t>(i) * 2654435761ULL) % 90000);
    out += ',';
  }
  out += std::to_string(100 + seq % 800);
  out += "],\"max_tokens\":1,\"stream\":false}";
  return out;
}

asio::awaitable<void> sendOne(Target* target, std::string body, bool record, int64_t* pending) {
  http::ClientRequest req;
  req.method = "POST";
  req.target = "/v1/completions";
  req.body = std::move(body);
  auto start = Clock::now();
  auto resp = co_await target->client->request(std::move(req));
  double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  if (!resp.ok() || resp->status != 200) {
    ++target->errors;
  } else if (record) {
    target->latencies_us.push_back(us);
  }
  --*pending;
}

asio::awaitable<void> runPhase(Target* target, double seconds, bool record, int64_t* seq,
                               int64_t* pending) {
  auto executor = co_await asio::this_coro::executor;
  asio::steady_timer timer(executor);
  int prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  auto interval = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(1.0 / absl::GetFlag(FLAGS_rate)));
  auto start = Clock::now();
  auto n = static_cast<int64_t>(seconds * absl::GetFlag(FLAGS_rate));
  for (int64_t i = 0; i < n; ++i) {
    timer.expires_at(start + i * interval);
    co_await timer.async_wait(asio::use_awaitable);
    ++*pending;
    asio::co_spawn(executor, sendOne(target, requestBody(prompt_tokens, (*seq)++), record, pending),
                   asio::detached);
  }
  // Let this phase's requests finish before the next target starts.
  while (*pending > 0) {
    timer.expires_after(std::chrono::milliseconds(1));
    co_await timer.async_wait(asio::use_awaitable);
  }
}

asio::awaitable<void> runAll(std::vector<Target>* targets) {
  int64_t seq = 0;
  int64_t pending = 0;
  for (auto& t : *targets) {
    co_await runPhase(&t, absl::GetFlag(FLAGS_warmup_s), false, &seq, &pending);
  }
  int rounds = absl::GetFlag(FLAGS_rounds);
  for (int r = 0; r < rounds; ++r) {
    for (auto& t : *targets) {
      co_await runPhase(&t, absl::GetFlag(FLAGS_phase_s), true, &seq, &pending);
    }
    std::fprintf(stderr, "round %d/%d done\n", r + 1, rounds);
  }
}

void report(const std::vector<Target>& targets) {
  const Target& base = targets.front();
  double b50 = percentile(base.latencies_us, 0.5);
  double b99 = percentile(base.latencies_us, 0.99);
  std::printf("prompt_tokens=%d rate=%.0f/s\n", absl::GetFlag(FLAGS_prompt_tokens),
              absl::GetFlag(FLAGS_rate));
  std::printf("| target | requests | errors | p50 us | p99 us | added p50 us | added p99 us |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  bj::array rows;
  for (const auto& t : targets) {
    double p50 = percentile(t.latencies_us, 0.5);
    double p99 = percentile(t.latencies_us, 0.99);
    std::printf("| %s | %zu | %lld | %.0f | %.0f | %.0f | %.0f |\n", t.name.c_str(),
                t.latencies_us.size(), static_cast<long long>(t.errors), p50, p99, p50 - b50,
                p99 - b99);
    rows.push_back(bj::object{{"target", t.name},
                              {"requests", t.latencies_us.size()},
                              {"errors", t.errors},
                              {"p50_us", p50},
                              {"p99_us", p99},
                              {"added_p50_us", p50 - b50},
                              {"added_p99_us", p99 - b99}});
  }
  if (auto path = absl::GetFlag(FLAGS_json_out); !path.empty()) {
    bj::object doc{{"prompt_tokens", absl::GetFlag(FLAGS_prompt_tokens)},
                   {"rate", absl::GetFlag(FLAGS_rate)},
                   {"targets", std::move(rows)}};
    std::ofstream(path) << bj::serialize(doc) << "\n";
  }
}

}  // namespace
}  // namespace kvf::bench

int main(int argc, char** argv) {
  auto args = kvf::cli::parseFlags(
      argc, argv,
      "kvf-proxy-bench: added latency of proxies in front of one engine: open-loop token-id\n"
      "completions to each target in turn, latency percentiles per target and the difference\n"
      "to the first (the engine reached directly). experiments/bench/proxy_overhead.sh starts\n"
      "the engine, kvf-router and nginx and runs it.\n\n"
      "Usage: kvf-proxy-bench --targets direct=127.0.0.1:8001,router=127.0.0.1:8000\n"
      "                       [--rate 200] [--prompt_tokens 1000]");
  if (!args.empty())
    kvf::cli::failUsage("kvf-proxy-bench", "unexpected argument '" + args[0] + "'");
  boost::asio::io_context ioc;
  std::vector<kvf::bench::Target> targets;
  std::string all = absl::GetFlag(FLAGS_targets);
  for (size_t pos = 0; pos < all.size();) {
    size_t end = std::min(all.find(',', pos), all.size());
    std::string_view spec = std::string_view(all).substr(pos, end - pos);
    pos = end + 1;
    auto eq = spec.find('=');
    auto colon = spec.rfind(':');
    if (eq == std::string_view::npos || colon == std::string_view::npos || colon < eq) {
      kvf::cli::failUsage("kvf-proxy-bench",
                          "--targets: expected name=host:port, got '" + std::string(spec) + "'");
    }
    int port = std::atoi(std::string(spec.substr(colon + 1)).c_str());
    if (port <= 0 || port > 65535) {
      kvf::cli::failUsage("kvf-proxy-bench", "--targets: bad port in '" + std::string(spec) + "'");
    }
    kvf::http::ClientOptions options;
    options.read_timeout = std::chrono::milliseconds(30'000);
    kvf::bench::Target t;
    t.name = std::string(spec.substr(0, eq));
    t.client = kvf::http::HttpClient::create(ioc.get_executor(),
                                             std::string(spec.substr(eq + 1, colon - eq - 1)),
                                             static_cast<uint16_t>(port), options);
    targets.push_back(std::move(t));
  }
  if (targets.empty()) kvf::cli::failUsage("kvf-proxy-bench", "--targets is required");
  boost::asio::co_spawn(ioc, kvf::bench::runAll(&targets), boost::asio::detached);
  ioc.run();
  kvf::bench::report(targets);
  return 0;
}
