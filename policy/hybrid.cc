// `hybrid`: lmetric's score, plus a high-cache affinity gate (the instance holding more than
// gate_fraction of the prompt wins unless it is overloaded, or optionally unless the prefill
// work queued ahead there is gate_cost_factor x the least anywhere) and hysteresis that keeps a
// session on its last instance within (1 + hysteresis) x the best score. Parameters: `hybrid:`.
#include "policy/hybrid.h"

#include "policy/lmetric.h"
#include "policy/policy_support.h"
#include "policy/registry.h"
#include "policy/session_table.h"

namespace kvf::policy {
namespace {

struct HybridParams final : PolicyParams {
  double gate_fraction = 0.5;        // an instance holding > this share of the prompt wins
  double overload_factor = 2.0;      // ... unless its running > factor x average running
  int64_t overload_min_running = 4;  //     and at least this many
  double hysteresis = 0.1;           // keep the session's last instance within (1+h) x best
  // The gate also skips a holder whose prefill work ahead of this request (its pending prefill
  // tokens plus the prompt's uncached part there) exceeds this x the least such work on any
  // instance. 0: off (the running-count test above is the only load check).
  double gate_cost_factor = 0.0;
};

std::shared_ptr<const PolicyParams> parse(config::ConfigMap& block) {
  auto p = std::make_shared<HybridParams>();
  block.get("gate_fraction", &p->gate_fraction, 0.0, 1.0);
  block.get("overload_factor", &p->overload_factor, 1.0, 1e6);
  block.get("overload_min_running", &p->overload_min_running, 0, int64_t{1} << 30);
  block.get("hysteresis", &p->hysteresis, 0.0, 10.0);
  block.get("gate_cost_factor", &p->gate_cost_factor, 0.0, 1e6);
  if (p->gate_cost_factor > 0 && p->gate_cost_factor < 1) {
    block.fail("gate_cost_factor", "must be 0 (off) or at least 1");
  }
  return p;
}

class HybridPolicy final : public Policy {
 public:
  explicit HybridPolicy(const PolicyConfig& c)
      : classify_(c.classify),
        params_(c.params<HybridParams>("hybrid")),
        tiers_(c.tiers),
        sessions_(c.session_ttl, c.max_sessions) {}
  std::string_view name() const override { return "hybrid"; }
  Decision decide(const RouteRequest& r, std::span<const InstanceSnapshot> inst,
                  Nanos now) override {
    std::vector<double> scores, secondary;
    lmetric::scores(r, inst, tiers_, &scores, &secondary);
    std::string_view reason;
    int chosen = gate(r, inst, scores, &reason);
    if (chosen < 0 && !inst.empty()) {
      chosen = support::argmin(inst, scores, secondary, cursor_);
      if (reason.empty()) reason = "lmetric_score";
      auto last = sessions_.get(r.session, now);
      if (chosen >= 0 && last && *last != chosen && *last < static_cast<int>(inst.size()) &&
          inst[*last].healthy && scores[*last] <= scores[chosen] * (1.0 + params_.hysteresis)) {
        chosen = *last;
        reason = "hysteresis";
      }
    }
    if (chosen >= 0) {
      cursor_ = static_cast<size_t>(chosen) + 1;
      sessions_.put(r.session, chosen, now);
    }
    return support::finish(r, inst, chosen, reason, std::move(scores), classify_);
  }

 private:
  // The high-cache affinity gate: the instance holding the most of the prompt (effective hits:
  // lower tiers credited), if that is more than gate_fraction of it and the instance is not
  // overloaded. Ties: lower score, lower index.
  int gate(const RouteRequest& r, std::span<const InstanceSnapshot> inst,
           const std::vector<double>& scores, std::string_view* reason) const {
    if (r.prompt_tokens <= 0) return -1;
    double average = support::averageRunning(inst);
    double threshold = params_.gate_fraction * static_cast<double>(r.prompt_tokens);
    // Prefill tokens ahead of this request on an instance, and the least of them anywhere.
    auto work = [&](const InstanceSnapshot& s) {
      return static_cast<double>(s.pending_prefill_tokens) + support::uncached(r, s, tiers_);
    };
    double least_work = -1;
    if (params_.gate_cost_factor > 0) {
      for (const auto& s : inst) {
        if (s.healthy && (least_work < 0 || work(s) < least_work)) least_work = work(s);
      }
    }
    int best = -1;
    double best_hits = 0;
    bool any_overloaded = false;
    bool any_costly = false;
    for (size_t i = 0; i < inst.size(); ++i) {
      const InstanceSnapshot& s = inst[i];
      if (!s.healthy) continue;
      // GPU hits plus the credit of the lower-tier run after them.
      const double hits = tiers::effectiveHits(r, s, tiers_);
      if (hits <= threshold) continue;
      if (support::overloaded(s.running, average, params_.overload_factor,
                              params_.overload_min_running)) {
        any_overloaded = true;
        continue;
      }
      if (least_work >= 0 && work(s) > params_.gate_cost_factor * least_work) {
        any_costly = true;
        continue;
      }
      if (best < 0 || hits > best_hits || (hits == best_hits && scores[i] < scores[best])) {
        best = static_cast<int>(i);
        best_hits = hits;
      }
    }
    if (best >= 0) {
      *reason = "cache_gate";
    } else if (any_overloaded) {
      *reason = "gate_overloaded";
    } else if (any_costly) {
      *reason = "gate_costly";
    }
    return best;
  }

  ClassifyConfig classify_;
  HybridParams params_;
  TierCreditConfig tiers_;
  SessionTable sessions_;
  size_t cursor_ = 0;
};

}  // namespace

std::unique_ptr<Policy> hybrid::create(const PolicyConfig& config) {
  return makePolicy<HybridPolicy>(config);
}

namespace hybrid {
const PolicyDefinition& definition() {
  static const PolicyDefinition kDefinition{"hybrid", &parse, &hybrid::create};
  return kDefinition;
}
}  // namespace hybrid

}  // namespace kvf::policy
