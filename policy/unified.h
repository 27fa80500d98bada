// `unified`'s cost model, shared with `elastic`: predicted seconds of queueing, prefill and KV
// transfer, for kvfabric's push and for vLLM's NIXL pull with the holder's first leg, from the
// `unified:` block (defaults: Qwen3-Coder-30B-A3B on an H20, 200 Gbps link). Formulas:
// docs/policies.md. Pure.
#pragma once

#include <cstdint>

#include "policy/move_feedback.h"
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
  // Full cost of a move: the source finishes the step it is running (its own decode load)
  // before its blocks are read, and every request it runs shares its link.
  double source_step_s = 0.03;          // a source with running requests: one step first
  double source_share_per_request = 0;  // transfer slowed by this fraction per request it runs
  // A move is made only when its predicted time to first token beats computing locally on the
  // same target by this fraction.
  double move_margin = 0.1;
  // Closed loop on measured move times (policy/move_feedback.h).
  double feedback_weight = 0.2;
  int64_t feedback_min_samples = 5;
  double feedback_max_factor = 8;
};

namespace unified {

// Seconds to move `tokens` tokens of KV over the link: bytes x 8 / bandwidth + overhead.
double transferSeconds(int64_t tokens, const UnifiedParams& model);
// Seconds of prefill already queued on an instance (router-accounted tokens plus the engine's
// waiting requests at a fixed cost each).
double queueSeconds(const InstanceSnapshot& s, const UnifiedParams& model);
// Seconds to prefill `tokens` tokens (0 for none).
double prefillSeconds(int64_t tokens, const UnifiedParams& model);
// The model's seconds for moving `tokens` tokens of KV out of `source` (before the measured
// correction): transferSeconds slowed by the source's running requests, plus one of its steps
// when it is running any.
double moveSeconds(int64_t tokens, const InstanceSnapshot& source, const UnifiedParams& model);
// The model's seconds for the holder's part of a NIXL-dialect migration and the read (before the
// measured correction): the first leg waits in `holder`'s queue (and for the step it is
// running), prefills the `compute_tokens` of the prompt the holder lacks (at least one step),
// then the target reads `read_tokens` tokens of KV over the link, shared like a push.
double nixlPullSeconds(int64_t compute_tokens, int64_t read_tokens, const InstanceSnapshot& holder,
                       const UnifiedParams& model);
// The feedback loop's settings from the `unified:` block.
MoveFeedbackConfig feedbackConfig(const UnifiedParams& model);
// The request's cached tokens on `s`, within [0, prompt].
int64_t hits(const RouteRequest& r, const InstanceSnapshot& s);
// Seconds to first token computing locally on `s`: its queue, then the prompt less its
// effective hits (GPU hits, plus its lower-tier run where onboarding beats recomputing: with
// `modelled` credit those tokens cost their onboard seconds instead of their prefill seconds).
double localSeconds(const RouteRequest& r, const InstanceSnapshot& s, const UnifiedParams& model,
                    const TierCreditConfig& tiers);

}  // namespace unified
}  // namespace kvf::policy
