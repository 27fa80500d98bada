// kvf-engine-load: open-loop load generator for emulated engines. Replays request sizes (input
// length, output length, prefix-chained hash ids -> token ids) from a Mooncake-format trace at a
// fixed aggregate rate, routes each request to an engine by its second hash id (so sessions
// stay sticky and prefixes are reused), streams every response, then prints client-side
// latency and each engine's step-lateness figures from /metrics. One io thread.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
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
#include "common/json.h"
#include "common/sse.h"
#include "common/strings.h"
#include "experiments/bench/bench_stats.h"

ABSL_FLAG(std::string, targets, "127.0.0.1:8000", "Comma-separated host:port of engines");
ABSL_FLAG(std::string, trace, "",
          "Mooncake-format JSONL trace (input_length, output_length, hash_ids)");
ABSL_FLAG(double, rate, 40, "Aggregate requests per second (fixed inter-arrival time)");
ABSL_FLAG(double, duration_s, 60, "Seconds of arrivals");
ABSL_FLAG(int, trace_block_tokens, 512, "Tokens per trace hash id");
ABSL_FLAG(int, max_output_tokens, 0, "Cap on output tokens per request (0: the trace's)");
ABSL_FLAG(double, drain_timeout_s, 300, "Wait at most this long for in-flight requests at the end");

namespace kvf::bench {
namespace asio = boost::asio;
namespace bj = boost::json;
using Clock = std::chrono::steady_clock;

struct TraceRequest {
  int64_t input_length = 0;
  int64_t output_length = 0;
  std::vector<uint64_t> hash_ids;
};

struct Result {
  bool ok = false;
  double ttft_s = 0;
  double e2e_s = 0;
  int64_t chunks = 0;
};

uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::string promptJson(const TraceRequest& r, int block_tokens) {
  std::string out = "[";
  int64_t n = 0;
  for (uint64_t h : r.hash_ids) {
    for (int k = 0; k < block_tokens && n < r.input_length; ++k, ++n) {
      if (n > 0) out += ',';
      out += std::to_string(1000 + mix(h * 1000003 + static_cast<uint64_t>(k)) % 100000);
    }
  }
  return out + "]";
}

asio::awaitable<void> runOne(std::shared_ptr<http::HttpClient> client, std::string body,
                             Result* out, int* in_flight) {
  auto start = Clock::now();
  http::ClientRequest req;
  req.method = "POST";
  req.target = "/v1/completions";
  req.body = std::move(body);
  req.read_timeout = std::chrono::seconds(600);
  auto stream = co_await client->open(req);
  if (stream.ok() && (*stream)->status() == 200) {
    sse::Parser parser;
    bool done = false;
    while (!done) {
      auto chunk = co_await (*stream)->next();
      if (!chunk.ok() || !chunk->has_value()) break;
      auto st = parser.feed(**chunk, [&](sse::Event&& e) {
        if (e.data == "[DONE]") {
          done = true;
          return;
        }
        if (out->chunks++ == 0) {
          out->ttft_s = std::chrono::duration<double>(Clock::now() - start).count();
        }
      });
      if (!st.ok()) break;
    }
    out->ok = done;
  }
  out->e2e_s = std::chrono::duration<double>(Clock::now() - start).count();
  --*in_flight;
}

std::vector<TraceRequest> loadTrace(const std::string& path, size_t n) {
  std::vector<TraceRequest> out;
  std::ifstream in(path);
  std::string line;
  while (out.size() < n && std::getline(in, line)) {
    auto obj = json::parseObject(line);
    if (!obj.ok()) continue;
    TraceRequest r;
    r.input_length = obj->at("input_length").to_number<int64_t>();
    r.output_length = obj->at("output_length").to_number<int64_t>();
    for (auto& h : obj->at("hash_ids").as_array()) r.hash_ids.push_back(h.to_number<uint64_t>());
    if (r.input_length > 0 && r.output_length > 0) out.push_back(std::move(r));
  }
  return out;
}

int run() {
  std::vector<std::pair<std::string, uint16_t>> targets;
  std::string list = absl::GetFlag(FLAGS_targets);
  for (size_t pos = 0; pos < list.size();) {
    size_t comma = list.find(',', pos);
    std::string item =
        list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t colon = item.rfind(':');
    int port = 0;
    if (colon != std::string::npos) port = std::atoi(item.c_str() + colon + 1);
    if (port <= 0 || port > 65535) {
      cli::failUsage("kvf-engine-load", "--targets: expected host:port, got '" + item + "'");
    }
    targets.emplace_back(item.substr(0, colon), static_cast<uint16_t>(port));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (absl::GetFlag(FLAGS_trace).empty()) cli::failUsage("kvf-engine-load", "--trace is required");
  double rate = absl::GetFlag(FLAGS_rate);
  auto n = static_cast<size_t>(rate * absl::GetFlag(FLAGS_duration_s));
  auto trace = loadTrace(absl::GetFlag(FLAGS_trace), n);
  if (trace.empty()) {
    std::cerr << "kvf-engine-load: no requests read from " << absl::GetFlag(FLAGS_trace) << "\n";
    return cli::kExitFailure;
  }
  asio::io_context ioc(1);
  std::vector<std::shared_ptr<http::HttpClient>> clients;
  http::ClientOptions co;
  co.max_idle_connections = 512;
  for (auto& [host, port] : targets)
    clients.push_back(http::HttpClient::create(ioc.get_executor(), host, port, co));
  std::vector<Result> results(trace.size());
  int in_flight = 0;
  int max_out = absl::GetFlag(FLAGS_max_output_tokens);
  int block_tokens = absl::GetFlag(FLAGS_trace_block_tokens);
  double input_sum = 0, output_sum = 0;
  auto start = Clock::now();
  asio::co_spawn(
      ioc,
      [&]() -> asio::awaitable<void> {
        asio::steady_timer timer(ioc);
        for (size_t i = 0; i < trace.size(); ++i) {
          timer.expires_at(start +
                           std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(static_cast<double>(i) / rate)));
          co_await timer.async_wait(asio::use_awaitable);
          const TraceRequest& r = trace[i];
          int64_t out_tokens =
              max_out > 0 ? std::min<int64_t>(max_out, r.output_length) : r.output_length;
          input_sum += static_cast<double>(r.input_length);
          output_sum += static_cast<double>(out_tokens);
          std::string body =
              strCat(R"({"prompt":)", promptJson(r, block_tokens), R"(,"max_tokens":)", out_tokens,
                     R"(,"ignore_eos":true,"stream":true})");
          uint64_t key = r.hash_ids.size() > 1 ? r.hash_ids[1] : r.hash_ids[0];
          auto& client = clients[mix(key) % clients.size()];
          ++in_flight;
          asio::co_spawn(ioc, runOne(client, std::move(body), &results[i], &in_flight),
                         asio::detached);
          if (i % static_cast<size_t>(std::max(1.0, rate * 10)) == 0) {
            std::fprintf(stderr, "kvf-engine-load: sent %zu/%zu in_flight=%d\n", i, trace.size(),
                         in_flight);
          }
        }
        auto drain_deadline =
            Clock::now() + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(absl::GetFlag(FLAGS_drain_timeout_s)));
        while (in_flight > 0 && Clock::now() < drain_deadline) {
          timer.expires_after(std::chrono::milliseconds(100));
          co_await timer.async_wait(asio::use_awaitable);
        }
        ioc.stop();
      },
      asio::detached);
  ioc.run();
  double wall = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<double> ttft, e2e;
  size_t ok = 0;
  for (auto& r : results) {
    if (!r.ok) continue;
    ++ok;
    ttft.push_back(r.ttft_s);
    e2e.push_back(r.e2e_s);
  }
  std::printf(
      "requests=%zu ok=%zu failed=%zu wall_s=%.1f offered_rate=%.1f mean_input=%.0f "
      "mean_output=%.0f\n",
      results.size(), ok, results.size() - ok, wall, rate, input_sum / results.size(),
      output_sum / results.size());
  std::printf("ttft_s p50=%.3f p99=%.3f e2e_s p50=%.2f p99=%.2f\n", percentile(ttft, 0.5),
              percentile(ttft, 0.99), percentile(e2e, 0.5), percentile(e2e, 0.99));
  return ok == results.size() ? 0 : 1;
}

}  // namespace kvf::bench

int main(int argc, char** argv) {
  auto args = kvf::cli::parseFlags(
      argc, argv,
      "kvf-engine-load: open-loop load of trace-sized requests for kvf-engine instances (no\n"
      "router): each request goes to an engine chosen by its second hash id, so sessions stay\n"
      "sticky; prints client latency and each engine's step lateness (docs/benchmarks.md).\n\n"
      "Usage: kvf-engine-load --trace data/traces/mooncake/conversation_trace.jsonl\n"
      "                       [--targets 127.0.0.1:8001,127.0.0.1:8002] [--rate 40]");
  if (!args.empty())
    kvf::cli::failUsage("kvf-engine-load", "unexpected argument '" + args[0] + "'");
  return kvf::bench::run();
}
