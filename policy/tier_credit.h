// How a policy credits the part of a request's prefix that an instance holds outside its GPU
// cache (host memory "CPU", local disk "DISK"): the `policy:` section's tier_scoring,
// tier_weights and tier_model, and the credit itself. `modelled` (default) prices onboarding
// against recomputing: a run of t tokens onboarded in onboard_s seconds is worth
// t - onboard_s x prefill_tokens_per_s GPU-hit tokens (at least 0), with onboard_s = bytes /
// PCIe bandwidth (+ bytes / disk read bandwidth for disk blocks) + a fixed overhead; `fixed`
// credits each tier with a weight (llm-d: CPU 0.8; Dynamo: host 0.75, disk 0.25); `off`
// credits nothing. Formulas: docs/policies.md ("KV tiers"). Pure.
#pragma once

#include <cstdint>

namespace kvf::config {
class ConfigMap;
}

namespace kvf::policy {

struct InstanceSnapshot;
struct RouteRequest;

enum class TierScoring { kModelled, kFixed, kOff };
// How the engines load a lower-tier run (their scheduler.onboard): all before the request's
// first step, or layer by layer under it.
enum class TierOnboard { kWhole, kLayerwise };

struct TierCreditConfig {
  TierScoring scoring = TierScoring::kModelled;
  // fixed: the share of a GPU hit a block in that tier is worth.
  double cpu_weight = 0.8;
  double disk_weight = 0.25;
  // modelled (defaults: the H20 profile with Qwen3-Coder-30B-A3B, as `unified:`): the KV of one
  // token, one instance's prefill rate, host-to-device bandwidth (PCIe Gen5 x16, effective),
  // the local disk's read bandwidth (one NVMe drive), and the fixed cost of an onboard (the
  // request waits for its load to be scheduled: about one engine step).
  double kv_bytes_per_token = 98304;
  double prefill_tokens_per_s = 7000;
  double pcie_gbps = 400;
  double disk_read_gbps = 48;
  double onboard_overhead_s = 0.005;
  // The engines' onboarding (scheduler.onboard) and the model's layer count (layer-wise only).
  TierOnboard onboard = TierOnboard::kWhole;
  int layers = 48;
};

// Reads tier_scoring, tier_weights ({CPU: w, DISK: w}) and tier_model from the `policy:` map;
// errors name the field.
void parseTierCredit(config::ConfigMap& policy_map, TierCreditConfig* out);

namespace tiers {

// Seconds to bring `cpu_tokens` from host memory and `disk_tokens` from disk into GPU memory:
// bytes x 8 / pcie, plus disk bytes x 8 / disk read, plus the overhead (0 for no tokens).
double onboardSeconds(int64_t cpu_tokens, int64_t disk_tokens, const TierCreditConfig& c);
// The part of onboardSeconds the request waits for beyond a GPU hit's first step, when that
// step computes `new_tokens`: all of it (whole), or with layer-wise loading only what the
// step's compute C = new_tokens / prefill rate does not hide: overhead + max(0, L - C) +
// min(C, L) / layers, L the transfer (the engine's pipeline, docs/engine.md "Onboarding").
double exposedOnboardSeconds(int64_t cpu_tokens, int64_t disk_tokens, int64_t new_tokens,
                             const TierCreditConfig& c);
// The GPU-hit tokens that `cpu_tokens` + `disk_tokens` of lower tiers are worth (0 with `off`)
// for a request with `new_tokens` to compute after them; never more than their sum, never
// negative.
double creditedTokens(int64_t cpu_tokens, int64_t disk_tokens, const TierCreditConfig& c,
                      int64_t new_tokens = 0);
// The request's prefix on `s` as effective hit tokens: its GPU hits plus the credit of the
// lower-tier run after them, within [0, prompt]. Inline for the common case of no run (every
// policy asks it per instance and decision).
// Defined at the end of policy/policy.h (they read InstanceSnapshot).
inline double effectiveHits(const RouteRequest& r, const InstanceSnapshot& s,
                            const TierCreditConfig& c);
// The prefix `s` could give a peer (a push): GPU hits plus the lower-tier run (none with `off`),
// in tokens within [0, prompt].
inline int64_t reach(const RouteRequest& r, const InstanceSnapshot& s, const TierCreditConfig& c);
// The two above for an instance with a lower-tier run.
double effectiveHitsWithRun(const RouteRequest& r, const InstanceSnapshot& s,
                            const TierCreditConfig& c);
int64_t reachWithRun(const RouteRequest& r, const InstanceSnapshot& s, const TierCreditConfig& c);
// Seconds `s` needs to read the last `tokens` of its reach (a push of its run past a peer's own
// hits) out of its lower tiers before sending them: the lower-tier part of those tokens, in
// the instance's CPU/DISK proportion, priced by onboardSeconds (0 when all are GPU hits).
double pushReadSeconds(const RouteRequest& r, const InstanceSnapshot& s, int64_t tokens,
                       const TierCreditConfig& c);

}  // namespace tiers
}  // namespace kvf::policy
