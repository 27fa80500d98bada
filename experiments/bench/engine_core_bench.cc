// CPU cost of the engine core per step (what bounds how many emulated engines one core can
// drive): a steady batch of decoding requests, with and without a chunked prefill alongside.
#include <benchmark/benchmark.h>

#include <string>

#include "engine/engine_core.h"
#include "experiments/bench/bench_main.h"

namespace kvf::engine {
namespace {

EngineConfig benchConfig() {
  auto profile = loadProfile("engine/profiles/qwen3-coder-30b-a3b-h20.yaml");
  if (!profile.ok()) std::abort();
  EngineConfig c;
  c.profile = *profile;
  if (!finalizeEngineConfig(&c).ok()) std::abort();
  return c;
}

std::vector<TokenId> prompt(int n, int salt) {
  std::vector<TokenId> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[static_cast<size_t>(i)] = 1000 + (i * 31 + salt * 977) % 90000;
  return p;
}

// Keeps state.range(0) requests (2k-token prompts, 256 output tokens) running, replacing each
// one that finishes; range(1) = 1 also keeps a 12k-token prompt prefilling in every step.
void BM_Step(benchmark::State& state) {
  worker::VectorEventSink sink;
  auto core = EngineCore::create(benchConfig(), &sink);
  if (!core.ok()) std::abort();
  Nanos now = 0;
  int salt = 0;
  auto add = [&](int prompt_len, int64_t max_tokens) {
    RequestSpec s;
    s.id = "r" + std::to_string(salt);
    s.prompt = prompt(prompt_len, salt++);
    s.sampling.max_tokens = max_tokens;
    s.sampling.ignore_eos = true;
    if (!(*core)->add(std::move(s), now).ok()) std::abort();
  };
  for (int64_t i = 0; i < state.range(0); ++i) add(2048, 256);
  int64_t steps = 0;
  for (auto _ : state) {
    if (state.range(1) == 1 && (*core)->stats().num_waiting == 0) add(12000, 1);
    StepResult r = (*core)->step(now);
    now += r.duration;
    for (const auto& o : r.outputs) {
      if (o.finish && o.prompt_tokens == 2048) add(2048, 256);
    }
    benchmark::DoNotOptimize(r);
    sink.take();
    ++steps;
  }
  state.SetItemsProcessed(steps);
  auto stats = (*core)->stats();
  state.counters["running"] = stats.num_running;
  state.counters["preemptions"] = static_cast<double>(stats.num_preemptions);
  state.counters["modelled_step_ms"] = nanosToSeconds(now) * 1e3 / static_cast<double>(steps);
}
BENCHMARK(BM_Step)->Args({16, 0})->Args({64, 0})->Args({64, 1})->Args({256, 0});

}  // namespace
}  // namespace kvf::engine

int main(int argc, char** argv) {
  return kvf::bench::benchmarkMain(
      argc, argv,
      "kvf-engine-core-bench: CPU cost of one engine-core step (what bounds how many emulated "
      "engines\n"
      "one core can drive): a steady batch of decoding requests, with and without a chunked\n"
      "prefill alongside. Run it from the repository root (it reads\n"
      "engine/profiles/qwen3-coder-30b-a3b-h20.yaml). Figures: docs/benchmarks.md.");
}
