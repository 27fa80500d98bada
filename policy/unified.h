// `unified`'s cost model, shared with `elastic`: predicted seconds of queueing, prefill and KV
// transfer from the `unified:` block (defaults: Qwen3-Coder-30B-A3B on an H20, 200 Gbps link).
// Formulas: docs/policies.md. Pure.
#pragma once

#include <cstdint>

#include "policy/policy.h"

namespace kvf::policy {

struct UnifiedParams final : PolicyParams {
  double prefill_tokens_per_s = 7000;  // one instance's prefill throughput
  double kv_bytes_per_token = 98304;   // 48 layers x 2 (K,V) x 4 kv heads x 128 x 2 B
  double link_bandwidth_gbps = 200;    // between two instances
  double transfer_overhead_s = 50e-6;  // per push (the engine profile's link.overhead_us)
  double waiting_request_s = 0;        // queue added per request the engine reports waiting
  double affinity_factor = 2.0;        // keep the session's instance within factor x best
  int64_t min_push_tokens = 256;       // holders with fewer extra tokens never push
};

namespace unified {

// Seconds to move `tokens` tokens of KV over the link: bytes x 8 / bandwidth + overhead.
double transferSeconds(int64_t tokens, const UnifiedParams& model);
// Seconds of prefill already queued on an instance (router-accounted tokens plus the engine's
// waiting requests at a fixed cost each).
double queueSeconds(const InstanceSnapshot& s, const UnifiedParams& model);
// Seconds to prefill `tokens` tokens (0 for none).
double prefillSeconds(int64_t tokens, const UnifiedParams& model);
// The request's cached tokens on `s`, within [0, prompt].
int64_t hits(const RouteRequest& r, const InstanceSnapshot& s);

}  // namespace unified
}  // namespace kvf::policy
