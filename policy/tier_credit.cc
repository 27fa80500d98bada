#include "policy/tier_credit.h"

#include <algorithm>

#include "common/config.h"
#include "policy/policy.h"

namespace kvf::policy {

void parseTierCredit(config::ConfigMap& map, TierCreditConfig* out) {
  map.getEnum("tier_scoring", &out->scoring,
              {{"modelled", TierScoring::kModelled},
               {"fixed", TierScoring::kFixed},
               {"off", TierScoring::kOff}});
  if (auto w = map.map("tier_weights")) {
    w->get("CPU", &out->cpu_weight, 0.0, 1.0);
    w->get("DISK", &out->disk_weight, 0.0, 1.0);
    w->rejectUnknownKeys();
  }
  if (auto m = map.map("tier_model")) {
    m->get("kv_bytes_per_token", &out->kv_bytes_per_token, 1.0, 1e9);
    m->get("prefill_tokens_per_s", &out->prefill_tokens_per_s, 1.0, 1e9);
    m->get("pcie_gbps", &out->pcie_gbps, 0.001, 1e6);
    m->get("disk_read_gbps", &out->disk_read_gbps, 0.001, 1e6);
    m->get("onboard_overhead_s", &out->onboard_overhead_s, 0.0, 60.0);
    m->getEnum("onboard", &out->onboard,
               {{"whole", TierOnboard::kWhole}, {"layerwise", TierOnboard::kLayerwise}});
    m->get("layers", &out->layers, 1, 1000);
    m->rejectUnknownKeys();
  }
}

namespace tiers {

double onboardSeconds(int64_t cpu_tokens, int64_t disk_tokens, const TierCreditConfig& c) {
  cpu_tokens = std::max<int64_t>(0, cpu_tokens);
  disk_tokens = std::max<int64_t>(0, disk_tokens);
  if (cpu_tokens + disk_tokens == 0) return 0.0;
  const double bits_per_token = c.kv_bytes_per_token * 8.0;
  // Disk blocks go disk -> host -> GPU, one after the other per block (no overlap assumed).
  return static_cast<double>(cpu_tokens + disk_tokens) * bits_per_token / (c.pcie_gbps * 1e9) +
         static_cast<double>(disk_tokens) * bits_per_token / (c.disk_read_gbps * 1e9) +
         c.onboard_overhead_s;
}

double exposedOnboardSeconds(int64_t cpu_tokens, int64_t disk_tokens, int64_t new_tokens,
                             const TierCreditConfig& c) {
  const double whole = onboardSeconds(cpu_tokens, disk_tokens, c);
  if (c.onboard == TierOnboard::kWhole || whole == 0.0) return whole;
  const double load = whole - c.onboard_overhead_s;
  // The last prompt token is always computed.
  const double compute =
      static_cast<double>(std::max<int64_t>(1, new_tokens)) / c.prefill_tokens_per_s;
  return c.onboard_overhead_s + std::max(0.0, load - compute) +
         std::min(compute, load) / static_cast<double>(c.layers);
}

double creditedTokens(int64_t cpu_tokens, int64_t disk_tokens, const TierCreditConfig& c,
                      int64_t new_tokens) {
  cpu_tokens = std::max<int64_t>(0, cpu_tokens);
  disk_tokens = std::max<int64_t>(0, disk_tokens);
  const auto tokens = static_cast<double>(cpu_tokens + disk_tokens);
  switch (c.scoring) {
    case TierScoring::kOff:
      return 0.0;
    case TierScoring::kFixed:
      return c.cpu_weight * static_cast<double>(cpu_tokens) +
             c.disk_weight * static_cast<double>(disk_tokens);
    case TierScoring::kModelled:
      // Worth (1 - onboard_s / recompute_s) of a GPU hit each, recompute_s = t / rate: the
      // tokens net of the onboard time in prefill-token equivalents.
      return std::clamp(tokens - exposedOnboardSeconds(cpu_tokens, disk_tokens, new_tokens, c) *
                                     c.prefill_tokens_per_s,
                        0.0, tokens);
  }
  return 0.0;
}

namespace {
// The lower-tier run as it fits in the prompt after the GPU hits (a text prompt's length is an
// estimate): disk blocks are cut first.
void lowerRun(const RouteRequest& r, const InstanceSnapshot& s, int64_t* cpu, int64_t* disk) {
  int64_t room = std::max<int64_t>(0, r.prompt_tokens - std::max<int64_t>(0, s.matched_tokens));
  *cpu = std::clamp<int64_t>(s.cpu_tokens, 0, room);
  *disk = std::clamp<int64_t>(s.disk_tokens, 0, room - *cpu);
}
}  // namespace

double effectiveHitsWithRun(const RouteRequest& r, const InstanceSnapshot& s,
                            const TierCreditConfig& c) {
  const auto gpu = static_cast<double>(std::clamp<int64_t>(s.matched_tokens, 0, r.prompt_tokens));
  if (c.scoring == TierScoring::kOff) return gpu;
  int64_t cpu = 0, disk = 0;
  lowerRun(r, s, &cpu, &disk);
  const int64_t new_tokens = r.prompt_tokens - static_cast<int64_t>(gpu) - cpu - disk;
  return gpu + creditedTokens(cpu, disk, c, new_tokens);
}

int64_t reachWithRun(const RouteRequest& r, const InstanceSnapshot& s, const TierCreditConfig& c) {
  const int64_t gpu = std::clamp<int64_t>(s.matched_tokens, 0, r.prompt_tokens);
  if (c.scoring == TierScoring::kOff) return gpu;
  int64_t cpu = 0, disk = 0;
  lowerRun(r, s, &cpu, &disk);
  return gpu + cpu + disk;
}

double pushReadSeconds(const RouteRequest& r, const InstanceSnapshot& s, int64_t tokens,
                       const TierCreditConfig& c) {
  if (c.scoring == TierScoring::kOff || tokens <= 0) return 0.0;
  int64_t cpu = 0, disk = 0;
  lowerRun(r, s, &cpu, &disk);
  const int64_t lower = std::min(tokens, cpu + disk);
  if (lower <= 0) return 0.0;
  const int64_t lower_disk = disk * lower / (cpu + disk);
  return onboardSeconds(lower - lower_disk, lower_disk, c);
}

}  // namespace tiers
}  // namespace kvf::policy
