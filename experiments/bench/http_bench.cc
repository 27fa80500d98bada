// Loopback HTTP round trip through common/'s client and server with keep-alive: latency
// percentiles for one connection and requests/s with several concurrent connections. The
// server runs on its own thread; the client runs on the benchmark thread.
#include <algorithm>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "common/http_client.h"
#include "common/http_server.h"
#include "experiments/bench/bench_main.h"
#include "experiments/bench/bench_stats.h"

namespace {

using kvf::bench::percentile;

namespace asio = boost::asio;
using kvf::http::ClientRequest;
using kvf::http::HttpClient;
using kvf::http::HttpServer;

class ServerThread {
 public:
  explicit ServerThread(size_t body_bytes) : work_(asio::make_work_guard(ioc_)) {
    auto server = HttpServer::create(ioc_, {});
    if (!server.ok()) std::abort();
    server_ = std::move(*server);
    std::string body(body_bytes, 'x');
    server_->route(
        "POST", "/v1/echo",
        [body](const kvf::http::Request&, kvf::http::ResponseWriter& w) -> asio::awaitable<void> {
          co_await w.send(200, "application/json", body);
        });
    server_->start();
    thread_ = std::thread([this] { ioc_.run(); });
  }
  ~ServerThread() {
    server_->stop();
    work_.reset();
    ioc_.stop();
    thread_.join();
  }
  uint16_t port() const { return server_->port(); }

 private:
  asio::io_context ioc_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
};

// Requests are built outside coroutines: GCC 12 mishandles aggregate temporaries inside
// co_await expressions (double destruction).

// One keep-alive connection, one request at a time; reports p50/p99 in microseconds.
void BM_HttpRoundTrip(benchmark::State& state) {
  size_t request_bytes = static_cast<size_t>(state.range(0));
  ServerThread server(256);
  asio::io_context ioc;
  auto client = HttpClient::create(ioc.get_executor(), "127.0.0.1", server.port());
  kvf::http::ClientRequest request;
  request.method = "POST";
  request.target = "/v1/echo";
  request.body = std::string(request_bytes, 'r');
  std::vector<double> latencies;
  latencies.reserve(1 << 20);
  for (auto _ : state) {
    double seconds = 0;
    asio::co_spawn(
        ioc,
        [&]() -> asio::awaitable<void> {
          auto start = std::chrono::steady_clock::now();
          auto r = co_await client->request(request);
          seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          if (!r.ok() || r->status != 200) std::abort();
        },
        asio::detached);
    ioc.restart();
    ioc.run();
    state.SetIterationTime(seconds);
    latencies.push_back(seconds * 1e6);
  }
  state.counters["p50_us"] = percentile(latencies, 0.50);
  state.counters["p99_us"] = percentile(latencies, 0.99);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * request_bytes));
}
BENCHMARK(BM_HttpRoundTrip)->Arg(1024)->Arg(64 * 1024)->Arg(512 * 1024)->UseManualTime();

// `connections` concurrent keep-alive connections, each sending requests back to back.
void BM_HttpThroughput(benchmark::State& state) {
  int connections = static_cast<int>(state.range(0));
  constexpr int kPerConnection = 500;
  ServerThread server(256);
  kvf::http::ClientRequest request;
  request.method = "POST";
  request.target = "/v1/echo";
  request.body = std::string(1024, 'r');
  int64_t total = 0;
  for (auto _ : state) {
    asio::io_context ioc;
    auto client = HttpClient::create(ioc.get_executor(), "127.0.0.1", server.port());
    for (int c = 0; c < connections; ++c) {
      asio::co_spawn(
          ioc,
          [&]() -> asio::awaitable<void> {
            for (int i = 0; i < kPerConnection; ++i) {
              auto r = co_await client->request(request);
              if (!r.ok()) std::abort();
            }
          },
          asio::detached);
    }
    ioc.run();
    total += connections * kPerConnection;
  }
  state.SetItemsProcessed(total);
}
BENCHMARK(BM_HttpThroughput)->Arg(1)->Arg(8)->Arg(32)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  return kvf::bench::benchmarkMain(
      argc, argv,
      "kvf-http-bench: loopback HTTP round trip through the project's HTTP client and server with\n"
      "keep-alive: latency per request for 1 KB, 64 KB and 512 KB bodies on one connection, and\n"
      "requests/s with 1, 8 and 32 concurrent connections. Figures: docs/benchmarks.md.");
}
