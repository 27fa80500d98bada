// kvf-tier-bench --mode=onboard: modelled TTFT of a request whose long prefix comes from the
// pool (G1 hit), from host memory (G2), from disk (G3), or is recomputed, through the emulated
// engine's core with the live tiers (real payload bytes, checked on the way back) on a hardware
// profile. Each case runs on a fresh core: the prefix is served once, evicted as the case
// needs (fillers of distinct tokens), then the same prefix with a new suffix is measured alone.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/strings.h"
#include "engine/engine_core.h"
#include "engine/live_tiers.h"
#include "engine/virtual_run.h"
#include "experiments/bench/tier_bench.h"
#include "worker/tiers/tier_config.h"

namespace kvf::bench {
namespace {

using engine::EngineConfig;
using engine::RequestSpec;
using engine::TokenId;

std::vector<TokenId> tokens(int64_t n, int64_t salt) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    t[static_cast<size_t>(i)] = 1000 + (i * 7919 + salt * 104729) % 90000;
  return t;
}

RequestSpec request(std::string id, std::vector<TokenId> prompt) {
  RequestSpec s;
  s.id = std::move(id);
  s.prompt = std::move(prompt);
  s.sampling.max_tokens = 1;
  s.sampling.ignore_eos = true;
  return s;
}

enum class Case { kRecompute, kG1, kG2, kG3 };
const char* caseName(Case c) {
  switch (c) {
    case Case::kRecompute:
      return "recompute";
    case Case::kG1:
      return "G1 hit";
    case Case::kG2:
      return "G2 (host memory)";
    case Case::kG3:
      return "G3 (disk)";
  }
  return "";
}

struct CaseResult {
  engine::VirtualOutcome outcome;
  bool bytes_ok = true;
};

absl::StatusOr<CaseResult> runCase(const OnboardOptions& o, engine::OnboardMode mode, Case c,
                                   int64_t suffix) {
  EngineConfig config = o.engine;
  config.scheduler.onboard = mode;
  const int64_t bs = config.cache.block_size;
  const int64_t prefix_blocks = o.prefix_tokens / bs;
  // A pool a little larger than the request: one filler of the same size evicts the prefix.
  config.cache.num_gpu_blocks = prefix_blocks + suffix / bs + 64;
  std::unique_ptr<engine::LiveTiers> tiers;
  engine::LiveTiers* tiers_raw = nullptr;
  if (c == Case::kG2 || c == Case::kG3) {
    std::string dir = strCat(o.dir, "/", c == Case::kG2 ? "g2" : "g3", "-", suffix);
    std::filesystem::remove_all(dir);
    // G2: host memory holds the prefix; G3: 1 MiB of host memory (256 slots) turns over and
    // the prefix is on disk only.
    std::string yaml = c == Case::kG2
                           ? "host: {capacity_mib: 64, pin: off}\n"
                           : strCat("host: {capacity_mib: 1, pin: off}\ndisk: {dir: ", dir,
                                    ", capacity_mib: 256, file_mib: 16}\n");
    KVF_ASSIGN_OR_RETURN(worker::TieredStoreOptions store,
                         worker::parseTierConfigText(yaml, "tiers"));
    config.tiers = store;
    KVF_RETURN_IF_ERROR(engine::finalizeEngineConfig(&config));
    engine::LiveTiersOptions lo;
    lo.store = *config.tiers;
    lo.block_size = static_cast<int>(bs);
    KVF_ASSIGN_OR_RETURN(tiers, engine::LiveTiers::create(lo));
    tiers_raw = tiers.get();
  }
  KVF_ASSIGN_OR_RETURN(auto core, engine::EngineCore::create(config, nullptr, std::move(tiers)));
  Nanos now = 0;
  std::vector<TokenId> prefix = tokens(o.prefix_tokens, 1);
  if (c != Case::kRecompute) {
    engine::runToCompletion(*core, request("warm", prefix), &now);
  }
  if (c == Case::kG2 || c == Case::kG3) {
    // Fillers of distinct tokens evict the prefix from the pool (and, for G3, host memory).
    int fillers = c == Case::kG2 ? 1 : 2;
    for (int f = 0; f < fillers; ++f) {
      // As long as the pool allows: every earlier block leaves it.
      int64_t filler_tokens = (config.cache.num_gpu_blocks - 1) * bs;
      engine::runToCompletion(*core, request(strCat("filler", f), tokens(filler_tokens, 50 + f)),
                              &now);
    }
    if (c == Case::kG3 && !tiers_raw->store().flush(std::chrono::seconds(60))) {
      return absl::DeadlineExceededError("the disk tier did not flush");
    }
  }
  now += kNanosPerSecond;  // the engine idles before the measured request arrives
  std::vector<TokenId> prompt = prefix;
  std::vector<TokenId> tail = tokens(suffix, 7);
  prompt.insert(prompt.end(), tail.begin(), tail.end());
  CaseResult r;
  r.outcome = engine::runToCompletion(*core, request("measured", prompt), &now);
  r.bytes_ok =
      core->onboardPayloadMismatches() == 0 && core->pool().auditPayloads().corrupt_blocks == 0;
  if (!r.outcome.finished) return absl::InternalError(strCat(caseName(c), ": did not finish"));
  return r;
}

}  // namespace

int runOnboard(const OnboardOptions& o) {
  std::printf(
      "Modelled TTFT, %lld-token prefix, profile %s (pcie %.0f Gbps, disk read %.0f Gbps)\n\n",
      static_cast<long long>(o.prefix_tokens), o.engine.profile.name.c_str(),
      o.engine.profile.pcie.bandwidth_gbps, o.engine.profile.disk.read_gbps);
  std::printf(
      "| new tokens | onboard | case | cached tokens | of them onboarded | TTFT (ms) | vs G1 hit "
      "|\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  int rc = 0;
  for (int64_t suffix : o.suffix_tokens) {
    for (engine::OnboardMode mode : o.modes) {
      double g1 = 0;
      for (Case c : {Case::kG1, Case::kG2, Case::kG3, Case::kRecompute}) {
        auto r = runCase(o, mode, c, suffix);
        if (!r.ok()) {
          std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
          return 1;
        }
        double ms = static_cast<double>(r->outcome.ttft) / 1e6;
        if (c == Case::kG1) g1 = ms;
        if (!r->bytes_ok) rc = 1;
        std::printf("| %lld | %s | %s | %lld | %lld | %.1f | %.2fx |%s\n",
                    static_cast<long long>(suffix),
                    mode == engine::OnboardMode::kWhole ? "whole" : "layerwise", caseName(c),
                    static_cast<long long>(r->outcome.cached_tokens),
                    static_cast<long long>(r->outcome.tier_tokens), ms, g1 > 0 ? ms / g1 : 0.0,
                    r->bytes_ok ? "" : " BYTES WRONG");
      }
    }
  }
  return rc;
}

}  // namespace kvf::bench
