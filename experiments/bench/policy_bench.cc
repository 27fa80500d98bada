// Routing hot path of policy/: hash a token-id prompt, match it against a cache index of 1M
// blocks held by 8 instances (and, for 32k-token prompts, by 64, 256 and 1,024), and decide
// with the hybrid policy. Reports per-call p50/p99 for each step and for the whole path, for
// 1k, 32k and 128k-token prompts, and what the tail comes from (faults, preemption, and a
// fixed-work loop as the machine's noise floor).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <random>
#include <span>
#include <vector>

#include <benchmark/benchmark.h>

#include "experiments/bench/bench_main.h"
#include "experiments/bench/bench_stats.h"
#include "policy/block_hash.h"
#include "policy/cache_index.h"
#include "policy/policy.h"
#include "policy/registry.h"

// Heap allocations by this process (operator new below), to report allocations per call.
thread_local int64_t g_allocations = 0;

namespace {

using kvf::bench::percentile;
using kvf::bench::reserveTouched;

using namespace kvf::policy;
constexpr int kDefaultInstances = 8;
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
// Past 8 instances, instances past the holder word (63 and beyond) hold it too: the last one
// its first 5/8, the middle one predicted its first 3/8, and every 16th instance its first
// 1/8 (a shared system prompt: 64 holders at 1,024 instances).
struct Fixture {
  CacheIndex index;
  std::vector<TokenId> prompt;
  int instances;

  Fixture(size_t prompt_tokens, int instance_count) : instances(instance_count) {
    std::mt19937_64 rng(42);
    uint64_t engine_hash = 1;
    size_t stored = 0;
    for (int seq = 0; stored < kIndexBlocks; ++seq) {
      StoredBlocks e;
      size_t blocks = std::min<size_t>(2000, kIndexBlocks - stored);
      e.token_ids = randomTokens(rng, blocks * kBlockSize);
      e.block_size = kBlockSize;
      for (size_t b = 0; b < blocks; ++b) e.engine_hashes.push_back(engine_hash++);
      index.storeBlocks(seq % instances, e);
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
    if (instances > kDefaultInstances) {
      store_prefix(instances - 1, all.size() * 5 / 8);
      index.addSoft(instances / 2, std::span<const BlockHash>(all).first(all.size() * 3 / 8), 0,
                    false);
      for (int i = 16; i < instances; i += 16) store_prefix(i, all.size() / 8);
    }
  }
};

// One fixture at a time (an index of 1M blocks takes a few hundred MB).
Fixture& fixtureFor(size_t prompt_tokens, int instances = kDefaultInstances) {
  static std::unique_ptr<Fixture> cached;
  static size_t cached_tokens = 0;
  if (cached == nullptr || cached_tokens != prompt_tokens || cached->instances != instances) {
    cached.reset();
    cached = std::make_unique<Fixture>(prompt_tokens, instances);
    cached_tokens = prompt_tokens;
  }
  return *cached;
}

enum class Step { kHash, kMatch, kDecide, kMatchDecide, kAll };

// What the OS did to this thread: page faults and context switches (getrusage), and the time it
// spent runnable but waiting for a CPU (/proc/thread-self/schedstat, 0 where unavailable).
struct ThreadCounters {
  int64_t minor_faults = 0;
  int64_t major_faults = 0;
  int64_t switches = 0;  // voluntary + involuntary
  int64_t runq_wait_ns = 0;

  static ThreadCounters now(bool with_schedstat) {
    ThreadCounters c;
    rusage u{};
    getrusage(RUSAGE_THREAD, &u);
    c.minor_faults = u.ru_minflt;
    c.major_faults = u.ru_majflt;
    c.switches = u.ru_nvcsw + u.ru_nivcsw;
    if (with_schedstat) {
      if (FILE* f = std::fopen("/proc/thread-self/schedstat", "r")) {
        long long run = 0, wait = 0;
        if (std::fscanf(f, "%lld %lld", &run, &wait) == 2) c.runq_wait_ns = wait;
        std::fclose(f);
      }
    }
    return c;
  }
};

// Per-run counters from the start and end of the timed loop, per 1,000 iterations.
void reportThreadCounters(benchmark::State& state, const ThreadCounters& before,
                          size_t iterations) {
  ThreadCounters after = ThreadCounters::now(true);
  double per_k = iterations == 0 ? 0 : 1000.0 / static_cast<double>(iterations);
  state.counters["faults_per_kiter"] =
      static_cast<double>(after.minor_faults - before.minor_faults + after.major_faults -
                          before.major_faults) *
      per_k;
  state.counters["switches_per_kiter"] =
      static_cast<double>(after.switches - before.switches) * per_k;
  state.counters["runq_wait_us_per_kiter"] =
      static_cast<double>(after.runq_wait_ns - before.runq_wait_ns) / 1000.0 * per_k;
}

// The router's state for one decision on a fixture's prompt: policy, per-instance snapshots,
// match lengths, the prompt's hashes and the request.
struct RouteBench {
  explicit RouteBench(const Fixture& f)
      : policy(createPolicy(PolicyConfig{})),
        snapshots(static_cast<size_t>(f.instances)),
        matched(static_cast<size_t>(f.instances)) {
    request.prompt_tokens = static_cast<int64_t>(f.prompt.size());
    request.session = "bench-session";
  }
  // Match lengths into the snapshots, then decide.
  void decide(kvf::Nanos now) {
    for (size_t i = 0; i < snapshots.size(); ++i) {
      snapshots[i].matched_tokens = static_cast<int64_t>(matched[i] * kBlockSize);
    }
    auto decision = policy->decide(request, snapshots, now);
    benchmark::DoNotOptimize(decision);
  }
  // What the router does before it can send: expire, hash the prompt as far as some instance
  // matches, decide.
  void route(Fixture& f, kvf::Nanos now) {
    f.index.expire(now);
    f.index.hashAndMatch(f.prompt, &hashes, matched);
    decide(now);
  }

  std::unique_ptr<Policy> policy;
  std::vector<InstanceSnapshot> snapshots;
  std::vector<uint32_t> matched;
  std::vector<BlockHash> hashes;
  RouteRequest request;
};

void runSteps(benchmark::State& state, Step step, int instances = kDefaultInstances) {
  Fixture& f = fixtureFor(static_cast<size_t>(state.range(0)), instances);
  RouteBench r(f);
  for (int i = 0; i < f.instances; ++i) {
    r.snapshots[i].running = 1 + i % 3;
    r.snapshots[i].pending_prefill_tokens = 1000 * i;
  }
  std::vector<BlockHash>& hashes = r.hashes;
  std::vector<uint32_t>& matched = r.matched;
  std::vector<double> micros;
  std::vector<double> rest_micros;
  reserveTouched(rest_micros, static_cast<size_t>(state.max_iterations));
  reserveTouched(micros, static_cast<size_t>(state.max_iterations));
  kvf::Nanos now = 0;
  hashTokenBlocks(f.prompt, kBlockSize, &hashes);
  f.index.matchLengths(hashes, matched);
  ThreadCounters before = ThreadCounters::now(true);
  int64_t timed_allocations = 0;
  for (auto _ : state) {
    int64_t allocations = g_allocations;
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
      r.decide(now);
    }
    auto end = std::chrono::steady_clock::now();
    timed_allocations += g_allocations - allocations;
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
  reportThreadCounters(state, before, micros.size());
  state.counters["allocs_per_call"] =
      micros.empty() ? 0
                     : static_cast<double>(timed_allocations) / static_cast<double>(micros.size());
  if (!rest_micros.empty()) state.counters["rest_hash_p50_us"] = percentile(rest_micros, 0.50);
  state.counters["p50_us"] = percentile(micros, 0.50);
  state.counters["p99_us"] = percentile(micros, 0.99);
  state.counters["p999_us"] = percentile(micros, 0.999);
  state.counters["matched_blocks_inst0"] = matched[0];
}

// Where the tail of hash + match + decide comes from: each iteration is bracketed (outside its
// timed window) by getrusage, so iterations during which the thread was switched out or
// faulted are counted apart; p99_clean_us is the p99 of the others. Interrupts and hypervisor
// steal leave no trace there: compare with BM_FixedWork at the same p50.
void hashMatchDecideTail(benchmark::State& state, int instances) {
  Fixture& f = fixtureFor(static_cast<size_t>(state.range(0)), instances);
  RouteBench r(f);
  std::vector<double> all, clean;
  reserveTouched(all, static_cast<size_t>(state.max_iterations));
  reserveTouched(clean, static_cast<size_t>(state.max_iterations));
  kvf::Nanos now = 0;
  int64_t disturbed = 0;
  for (auto _ : state) {
    ThreadCounters a = ThreadCounters::now(false);
    auto start = std::chrono::steady_clock::now();
    r.route(f, now);
    double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    ThreadCounters b = ThreadCounters::now(false);
    all.push_back(us);
    bool hit = b.switches != a.switches || b.minor_faults != a.minor_faults ||
               b.major_faults != a.major_faults;
    if (hit) {
      ++disturbed;
    } else {
      clean.push_back(us);
    }
    ++now;
  }
  // KVF_POLICY_BENCH_DUMP=path: every iteration's time in order, one per line, to see whether
  // slow iterations come in bursts (the machine) or at random (the code).
  if (const char* path = std::getenv("KVF_POLICY_BENCH_DUMP")) {
    if (FILE* out = std::fopen(path, "w")) {
      for (double us : all) std::fprintf(out, "%.3f\n", us);
      std::fclose(out);
    }
  }
  state.counters["p50_us"] = percentile(all, 0.50);
  state.counters["p99_us"] = percentile(all, 0.99);
  state.counters["p99_clean_us"] = percentile(clean, 0.99);
  state.counters["switched_or_faulted_iters"] = static_cast<double>(disturbed);
  state.counters["slow_iters_over_1.5x_p50"] = static_cast<double>(std::count_if(
      all.begin(), all.end(), [p50 = percentile(all, 0.50)](double v) { return v > 1.5 * p50; }));
}

void BM_HashMatchDecideTail(benchmark::State& s) { hashMatchDecideTail(s, kDefaultInstances); }
// The same for a cluster of range(1) instances.
void BM_HashMatchDecideTailAt(benchmark::State& s) {
  hashMatchDecideTail(s, static_cast<int>(s.range(1)));
}

// hash + match + decide with the table and the prompt out of the caches, as for a router whose
// index is far larger than the L3 and whose prompts differ: before each call, 64 MB of other
// data are read (outside the timed window); with warm_prompt:1 the prompt is then read again, so
// only the index (and the code) are cold. Shows what the probes cost against DRAM.
void BM_HashMatchDecideCold(benchmark::State& state) {
  Fixture& f = fixtureFor(static_cast<size_t>(state.range(0)));
  RouteBench r(f);
  std::vector<uint64_t> evict((64u << 20) / sizeof(uint64_t), 1);
  std::vector<double> micros;
  reserveTouched(micros, static_cast<size_t>(state.max_iterations));
  kvf::Nanos now = 0;
  uint64_t sink = 0;
  for (auto _ : state) {
    for (size_t i = 0; i < evict.size(); i += 8) sink += evict[i];
    if (state.range(1) != 0) {  // the prompt's tokens back in cache: only the index is cold
      for (TokenId t : f.prompt) sink += t;
    }
    benchmark::DoNotOptimize(sink);
    auto start = std::chrono::steady_clock::now();
    r.route(f, now);
    micros.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count());
    ++now;
  }
  state.counters["p50_us"] = percentile(micros, 0.50);
  state.counters["p99_us"] = percentile(micros, 0.99);
}

// The machine's noise floor: a fixed chain of dependent multiply-adds (registers only, no
// memory, no allocation) sized to about range(0) microseconds. Its p99 / p50 is what
// interrupts, hypervisor steal and the neighbours do to any computation of that length.
void BM_FixedWork(benchmark::State& state) {
  // ~1 multiply-add per 4 cycles at ~2.6 GHz: 650 steps per microsecond.
  const int64_t steps = state.range(0) * 650;
  std::vector<double> micros;
  reserveTouched(micros, static_cast<size_t>(state.max_iterations));
  uint64_t x = 1;
  ThreadCounters before = ThreadCounters::now(true);
  for (auto _ : state) {
    auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps; ++i) {
      x = x * 0x9e3779b97f4a7c15ULL + 1;
      benchmark::DoNotOptimize(x);
    }
    micros.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count());
  }
  reportThreadCounters(state, before, micros.size());
  state.counters["p50_us"] = percentile(micros, 0.50);
  state.counters["p99_us"] = percentile(micros, 0.99);
  state.counters["p999_us"] = percentile(micros, 0.999);
}

void BM_Hash(benchmark::State& s) { runSteps(s, Step::kHash); }
void BM_Match(benchmark::State& s) { runSteps(s, Step::kMatch); }
void BM_Decide(benchmark::State& s) { runSteps(s, Step::kDecide); }
void BM_MatchDecide(benchmark::State& s) { runSteps(s, Step::kMatchDecide); }
void BM_HashMatchDecide(benchmark::State& s) { runSteps(s, Step::kAll); }
// The same for a cluster of range(1) instances.
void BM_HashMatchDecideAt(benchmark::State& s) {
  runSteps(s, Step::kAll, static_cast<int>(s.range(1)));
}

// One decision per kind on `instances` push-capable instances, half of them holding part of
// the prompt (unified looks at every target x holder pair).
constexpr std::string_view kDecideKinds[] = {"hybrid", "unified", "elastic"};

void BM_DecideKind(benchmark::State& state) {
  PolicyConfig config;
  config.kind = std::string(kDecideKinds[state.range(0)]);
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
    // Every offload ends at once, so elastic's cap never stops it offloading.
    if (decision.mode == Mode::kPrefillOffload) policy->offloadFinished();
    benchmark::DoNotOptimize(decision);
  }
  state.SetLabel(std::string(policy->name()));
}

BENCHMARK(BM_DecideKind)->ArgsProduct({{0, 1, 2}, {8, 64, 1024}});
BENCHMARK(BM_Hash)->Arg(1024)->Arg(32768)->Arg(131072);
BENCHMARK(BM_Match)->Arg(1024)->Arg(32768)->Arg(131072);
BENCHMARK(BM_Decide)->Arg(1024)->Arg(32768)->Arg(131072);
BENCHMARK(BM_MatchDecide)->Arg(1024)->Arg(32768)->Arg(131072);
BENCHMARK(BM_HashMatchDecide)->Arg(1024)->Arg(32768)->Arg(131072);
// 32k-token prompts as the cluster grows (8 is the same fixture as BM_HashMatchDecide/32768).
BENCHMARK(BM_HashMatchDecideAt)
    ->ArgsProduct({{32768}, {8, 64, 256, 1024}})
    ->ArgNames({"", "instances"});
BENCHMARK(BM_HashMatchDecideTail)->Arg(32768);
BENCHMARK(BM_HashMatchDecideTailAt)
    ->ArgsProduct({{32768}, {8, 64, 256, 1024}})
    ->ArgNames({"", "instances"});
BENCHMARK(BM_HashMatchDecideCold)
    ->ArgsProduct({{1024, 32768, 131072}, {0, 1}})
    ->ArgNames({"", "warm_prompt"})
    ->Iterations(400);
BENCHMARK(BM_FixedWork)->Arg(8)->Arg(13);

}  // namespace

void* operator new(size_t size) {
  ++g_allocations;
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

int main(int argc, char** argv) {
  return kvf::bench::benchmarkMain(
      argc, argv,
      "kvf-policy-bench: the routing hot path: hash a token-id prompt, match it against a cache "
      "index\n"
      "of 1M blocks held by 8 instances (BM_*At: 32k-token prompts held by 8, 64, 256 and\n"
      "1,024), decide with each policy; per-call p50/p99 for 1k, 32k and 128k-token\n"
      "prompts, and where the tail comes from (faults, preemption, a fixed-work noise floor). "
      "KVF_POLICY_BENCH_DUMP=FILE writes every iteration's time of the tail\n"
      "benchmark to FILE. Figures: docs/benchmarks.md.");
}
