// Routing hot path of policy/: hash a token-id prompt, match it against a cache index of 1M
// blocks held by 8 instances, and decide with the hybrid policy. Reports per-call p50/p99 for
// each step and for the whole path, for 1k, 32k and 128k-token prompts.
#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <vector>

#include <benchmark/benchmark.h>

#include "experiments/bench/bench_stats.h"
#include "policy/block_hash.h"
#include "policy/cache_index.h"
#include "policy/policy.h"

namespace {

using kvf::bench::percentile;

using namespace kvf::policy;
constexpr int kInstances = 8;
constexpr size_t kIndexBlocks = 1'000'000;
constexpr size_t kBlockSize = 16;

std::vector<TokenId> randomTokens(std::mt19937_64& rng, size_t n) {
  std::vector<TokenId> v(n);
  for (auto& t : v) t = static_cast<TokenId>(rng() % 150000);
  return v;
}

// Fills the index through the exact-event path: background sequences of 2,000 blocks spread
// over the instances until 1M blocks are indexed, and the benchmark prompt's prefix stored on
// instance 0 (its first 3/4), instance 5 (first 1/4) and predicted on instance 2 (first 1/2).
struct Fixture {
  CacheIndex index;
  std::vector<TokenId> prompt;

  explicit Fixture(size_t prompt_tokens) {
    std::mt19937_64 rng(42);
    uint64_t engine_hash = 1;
    size_t stored = 0;
    for (int seq = 0; stored < kIndexBlocks; ++seq) {
      StoredBlocks e;
      size_t blocks = std::min<size_t>(2000, kIndexBlocks - stored);
      e.token_ids = randomTokens(rng, blocks * kBlockSize);
      e.block_size = kBlockSize;
      for (size_t b = 0; b < blocks; ++b) e.engine_hashes.push_back(engine_hash++);
      index.storeBlocks(seq % kInstances, e);
      stored += blocks;
    }
    prompt = randomTokens(rng, prompt_tokens);
    auto all = hashTokenBlocks(prompt, kBlockSize);
    auto store_prefix = [&](int instance, size_t blocks) {
      StoredBlocks e;
      e.token_ids.assign(prompt.begin(), prompt.begin() + blocks * kBlockSize);
      e.block_size = kBlockSize;
      for (size_t b = 0; b < blocks; ++b) e.engine_hashes.push_back(engine_hash++);
      index.storeBlocks(instance, e);
    };
    store_prefix(0, all.size() * 3 / 4);
    store_prefix(5, all.size() / 4);
    index.addSoft(2, std::span<const BlockHash>(all).first(all.size() / 2), 0, false);
  }
};

Fixture& fixtureFor(size_t prompt_tokens) {
  static std::vector<std::pair<size_t, std::unique_ptr<Fixture>>> cache;
  for (auto& [n, f] : cache) {
    if (n == prompt_tokens) return *f;
  }
  cache.emplace_back(prompt_tokens, std::make_unique<Fixture>(prompt_tokens));
  return *cache.back().second;
}

enum class Step { kHash, kMatch, kDecide, kMatchDecide, kAll };

void runSteps(benchmark::State& state, Step step) {
  Fixture& f = fixtureFor(static_cast<size_t>(state.range(0)));
  auto policy = createPolicy(PolicyConfig{});
  std::vector<InstanceSnapshot> snapshots(kInstances);
  for (int i = 0; i < kInstances; ++i) {
    snapshots[i].running = 1 + i % 3;
    snapshots[i].pending_prefill_tokens = 1000 * i;
  }
  std::vector<uint32_t> matched(kInstances);
  std::vector<BlockHash> hashes;
  std::vector<double> micros;
  std::vector<double> rest_micros;
  micros.reserve(1 << 16);
  kvf::Nanos now = 0;
  RouteRequest request;
  request.prompt_tokens = static_cast<int64_t>(f.prompt.size());
  request.session = "bench-session";
  hashTokenBlocks(f.prompt, kBlockSize, &hashes);
  f.index.matchLengths(hashes, matched);
  for (auto _ : state) {
    auto start = std::chrono::steady_clock::now();
    if (step == Step::kAll) {
      // What the router needs before deciding: hashes only as far as some instance matches.
      f.index.expire(now);
      f.index.hashAndMatch(f.prompt, &hashes, matched);
    }
    if (step == Step::kHash) {
      hashes.clear();
      hashTokenBlocks(f.prompt, kBlockSize, &hashes);
    }
    if (step == Step::kMatch || step == Step::kMatchDecide) {
      f.index.expire(now);
      f.index.matchLengths(hashes, matched);
    }
    if (step == Step::kDecide || step == Step::kMatchDecide || step == Step::kAll) {
      for (int i = 0; i < kInstances; ++i) {
        snapshots[i].matched_tokens = static_cast<int64_t>(matched[i] * kBlockSize);
      }
      auto decision = policy->decide(request, snapshots, now);
      benchmark::DoNotOptimize(decision);
    }
    auto end = std::chrono::steady_clock::now();
    micros.push_back(std::chrono::duration<double, std::micro>(end - start).count());
    if (step == Step::kAll) {
      // The rest of the prompt's hashes, needed only for the predicted entries that the
      // router writes once the request is forwarded: timed apart from the decision.
      completeBlockHashes(f.prompt, kBlockSize, &hashes);
      rest_micros.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - end)
              .count());
    }
    ++now;
  }
  if (!rest_micros.empty()) state.counters["rest_hash_p50_us"] = percentile(rest_micros, 0.50);
  state.counters["p50_us"] = percentile(micros, 0.50);
  state.counters["p99_us"] = percentile(micros, 0.99);
  state.counters["matched_blocks_inst0"] = matched[0];
}

void BM_Hash(benchmark::State& s) { runSteps(s, Step::kHash); }
void BM_Match(benchmark::State& s) { runSteps(s, Step::kMatch); }
void BM_Decide(benchmark::State& s) { runSteps(s, Step::kDecide); }
void BM_MatchDecide(benchmark::State& s) { runSteps(s, Step::kMatchDecide); }
void BM_HashMatchDecide(benchmark::State& s) { runSteps(s, Step::kAll); }

// One decision per kind on `instances` push-capable instances, half of them holding part of
// the prompt (unified looks at every target x holder pair).
void BM_DecideKind(benchmark::State& state) {
  PolicyConfig config;
  config.kind = static_cast<PolicyKind>(state.range(0));
  config.elastic.max_concurrent_offloads = int64_t{1} << 40;
  auto policy = createPolicy(config);
  int n = static_cast<int>(state.range(1));
  std::vector<InstanceSnapshot> snapshots(n);
  for (int i = 0; i < n; ++i) {
    snapshots[i].push_capable = true;
    snapshots[i].running = 1 + i % 3;
    snapshots[i].pending_prefill_tokens = 1000 * i;
    snapshots[i].matched_tokens = i % 2 == 0 ? 16 * (100 + i) : 0;
  }
  RouteRequest request;
  request.prompt_tokens = 32768;
  request.session = "bench-session";
  kvf::Nanos now = 0;
  for (auto _ : state) {
    auto decision = policy->decide(request, snapshots, ++now);
    benchmark::DoNotOptimize(decision);
  }
  state.SetLabel(std::string(policyKindName(config.kind)));
}

BENCHMARK(BM_DecideKind)
    ->ArgsProduct({{static_cast<int>(PolicyKind::kHybrid), static_cast<int>(PolicyKind::kUnified),
                    static_cast<int>(PolicyKind::kElastic)},
                   {8, 64}});
BENCHMARK(BM_Hash)->Arg(1024)->Arg(32768)->Arg(131072);
BENCHMARK(BM_Match)->Arg(1024)->Arg(32768)->Arg(131072);
BENCHMARK(BM_Decide)->Arg(1024)->Arg(32768)->Arg(131072);
BENCHMARK(BM_MatchDecide)->Arg(1024)->Arg(32768)->Arg(131072);
BENCHMARK(BM_HashMatchDecide)->Arg(1024)->Arg(32768)->Arg(131072);

}  // namespace

BENCHMARK_MAIN();
