// `elastic`: hybrid's placement (decode stays with the session), and a HEAVY request's prefill
// offloaded to another instance whose KV is then pushed to the decode instance, under a cap on
// concurrent offloads. Parameters: `elastic:`, plus `hybrid:` (placement) and `unified:` (the
// cost model). Formulas: docs/policies.md.
#include <algorithm>
#include <cmath>

#include "policy/hybrid.h"
#include "policy/policy_support.h"
#include "policy/registry.h"
#include "policy/unified.h"

namespace kvf::policy {
namespace {

using unified::hits;

struct ElasticParams final : PolicyParams {
  int64_t max_concurrent_offloads = 4;         // offloads whose prefill phase is in flight
  double overload_factor = 2.0;                // P skipped when running > factor x average ...
  int64_t overload_min_running = 4;            // ... and at least this many
  int64_t max_pending_prefill_tokens = 65536;  // P skipped when its queue exceeds this
  double max_cost_ratio = 1.5;                 // offload only if predicted TTFT <= ratio x local
  int64_t lease_ms = 30000;                    // P keeps the blocks pinned this long for D
  double prefill_timeout_s = 60;               // the driver gives up on P (D prefills locally)
};

std::shared_ptr<const PolicyParams> parse(config::ConfigMap& block) {
  auto p = std::make_shared<ElasticParams>();
  block.get("max_concurrent_offloads", &p->max_concurrent_offloads, 0, int64_t{1} << 20);
  block.get("overload_factor", &p->overload_factor, 1.0, 1e6);
  block.get("overload_min_running", &p->overload_min_running, 0, int64_t{1} << 30);
  block.get("max_pending_prefill_tokens", &p->max_pending_prefill_tokens, 0, int64_t{1} << 40);
  block.get("max_cost_ratio", &p->max_cost_ratio, 0.0, 1e6);
  block.get("lease_ms", &p->lease_ms, 1, 3'600'000);
  block.get("prefill_timeout_s", &p->prefill_timeout_s, 0.01, 86400.0);
  return p;
}

class ElasticPolicy final : public Policy {
 public:
  explicit ElasticPolicy(const PolicyConfig& c)
      : params_(c.params<ElasticParams>("elastic")),
        model_(c.params<UnifiedParams>("unified")),
        tiers_(c.tiers),
        base_(hybrid::create(c)),
        feedback_(unified::feedbackConfig(model_)) {}
  std::string_view name() const override { return "elastic"; }
  bool movesKv() const override { return true; }
  OffloadTerms offloadTerms() const override {
    return {params_.lease_ms, secondsToNanos(params_.prefill_timeout_s)};
  }
  void offloadFinished() override { in_flight_ = std::max<int64_t>(0, in_flight_ - 1); }
  int64_t offloadsInFlight() const override { return in_flight_; }
  void moveMeasured(int source, int dest, double model_s, double measured_s) override {
    feedback_.record(source, dest, model_s, measured_s);
  }

  Decision decide(const RouteRequest& r, std::span<const InstanceSnapshot> inst,
                  Nanos now) override {
    Decision d = base_->decide(r, inst, now);
    if (d.instance < 0) return d;
    const UnifiedParams& m = model_;
    const InstanceSnapshot& decode = inst[d.instance];
    double local = unified::localSeconds(r, decode, m, tiers_);
    d.predicted.local = local;
    d.predicted.chosen = local;
    if (d.request_class != RequestClass::kHeavy || !decode.push_capable) return d;
    if (in_flight_ >= params_.max_concurrent_offloads) {
      d.reason = "offload_cap";
      return d;
    }
    bool any_fit = false;
    for (size_t k = 0; k < inst.size(); ++k) {
      size_t p = (cursor_ + k) % inst.size();
      if (static_cast<int>(p) == d.instance || !fits(inst, p)) continue;
      any_fit = true;
      // P's queue and prefill, then the move of D's missing blocks with P's own decode load,
      // corrected by what P's moves to D measured.
      double move_model = unified::moveSeconds(r.prompt_tokens - hits(r, decode), inst[p], m);
      double move = move_model * feedback_.factor(static_cast<int>(p), d.instance);
      double cost = unified::localSeconds(r, inst[p], m, tiers_) + move;
      if (std::isnan(d.predicted.offload) || cost < d.predicted.offload) {
        d.predicted.offload = cost;
      }
      if (cost > params_.max_cost_ratio * local) continue;
      cursor_ = p + 1;
      ++in_flight_;
      d.mode = Mode::kPrefillOffload;
      d.prefill_instance = static_cast<int>(p);
      d.predicted.offload = cost;
      d.predicted.chosen = cost;
      d.move_model_s = move_model;
      d.move_s = move;
      d.predicted_cached_tokens = r.prompt_tokens;  // D receives every full block from P
      d.reason = "heavy_offload";
      return d;
    }
    d.reason = any_fit ? "offload_too_slow" : "offload_no_peer";
    return d;
  }

 private:
  // A prefill peer: admitted, push-capable, not overloaded (running well above the average,
  // or a long prefill queue: the seed's offloads were slow because P queued too).
  bool fits(std::span<const InstanceSnapshot> inst, size_t p) const {
    const InstanceSnapshot& s = inst[p];
    if (!s.healthy || !s.push_capable) return false;
    if (s.pending_prefill_tokens > params_.max_pending_prefill_tokens) return false;
    return !support::overloaded(s.running, support::averageRunning(inst), params_.overload_factor,
                                params_.overload_min_running);
  }

  ElasticParams params_;
  UnifiedParams model_;
  TierCreditConfig tiers_;
  std::unique_ptr<Policy> base_;
  MoveFeedback feedback_;
  size_t cursor_ = 0;
  int64_t in_flight_ = 0;
};

}  // namespace

namespace elastic {
const PolicyDefinition& definition() {
  static const PolicyDefinition kDefinition{"elastic", &parse, &makePolicy<ElasticPolicy>};
  return kDefinition;
}
}  // namespace elastic

}  // namespace kvf::policy
