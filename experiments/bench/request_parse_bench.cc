// The router's request read on its critical path: parseRequest (single pass for token-id
// completions) against the DOM path it replaced, for 1k and 100k-token bodies as
// kvf-proxy-bench sends them, plus the block hashing of the parsed prompt for scale.
#include <random>
#include <string>

#include <benchmark/benchmark.h>

#include "experiments/bench/bench_main.h"
#include "policy/block_hash.h"
#include "router/request_parse.h"

namespace {

using kvf::router::ApiKind;

kvf::http::Request completionBody(size_t tokens) {
  std::mt19937 rng(1);
  std::string body = R"({"model":"qwen3-coder-30b-a3b","max_tokens":1,"stream":false,"prompt":[)";
  for (size_t i = 0; i < tokens; ++i) {
    if (i > 0) body += ',';
    body += std::to_string(rng() % 150000);
  }
  body += "]}";
  kvf::http::Request request;
  request.method = "POST";
  request.target = "/v1/completions";
  request.body = std::move(body);
  return request;
}

void BM_ParseRequest(benchmark::State& state) {
  auto request = completionBody(static_cast<size_t>(state.range(0)));
  for (auto _ : state) {
    auto parsed = kvf::router::parseRequest(ApiKind::kCompletions, request);
    benchmark::DoNotOptimize(parsed);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * request.body.size()));
}

void BM_ParseRequestDom(benchmark::State& state) {
  auto request = completionBody(static_cast<size_t>(state.range(0)));
  for (auto _ : state) {
    auto parsed = kvf::router::parseRequestDom(ApiKind::kCompletions, request);
    benchmark::DoNotOptimize(parsed);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * request.body.size()));
}

void BM_HashParsedPrompt(benchmark::State& state) {
  auto request = completionBody(static_cast<size_t>(state.range(0)));
  auto parsed = kvf::router::parseRequest(ApiKind::kCompletions, request);
  for (auto _ : state) {
    auto hashes = kvf::policy::hashTokenBlocks(parsed->token_ids, 16);
    benchmark::DoNotOptimize(hashes);
  }
}

BENCHMARK(BM_ParseRequest)->Arg(1000)->Arg(100000);
BENCHMARK(BM_ParseRequestDom)->Arg(1000)->Arg(100000);
BENCHMARK(BM_HashParsedPrompt)->Arg(1000)->Arg(100000);

}  // namespace

int main(int argc, char** argv) {
  return kvf::bench::benchmarkMain(
      argc, argv,
      "kvf-request-parse-bench: the router's request read on its critical path: the single-pass\n"
      "parse of token-id completions against the JSON DOM path, for 1k and 100k-token bodies,\n"
      "plus the block hashing of the parsed prompt. Figures: docs/benchmarks.md.");
}
