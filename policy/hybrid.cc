// `hybrid`: lmetric's score, plus a high-cache affinity gate (the instance holding more than
// gate_fraction of the prompt wins unless it is overloaded, or optionally unless the prefill
// work queued ahead there is gate_cost_factor x the least anywhere) and hysteresis that keeps a
// session on its last instance within (1 + hysteresis) x the best score. Parameters: `hybrid:`.
#include "policy/hybrid.h"

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
  // One pass over the snapshots computes what lmetric::scores, the gate's average and least
  // work, the gate's candidates and the rotating argmin would each compute in a pass of their
  // own (five passes cost 6.8 us at 1,024 instances); the decision is the same, value for value.
  Decision decide(const RouteRequest& r, std::span<const InstanceSnapshot> inst,
                  Nanos now) override {
    const size_t n = inst.size();
    std::vector<double> scores(n);
    const bool gate_on = r.prompt_tokens > 0;
    const bool cost_gate = gate_on && params_.gate_cost_factor > 0;
    const double threshold = params_.gate_fraction * static_cast<double>(r.prompt_tokens);
    const size_t cursor = n == 0 ? 0 : cursor_ % n;
    double running_sum = 0;
    int healthy = 0;
    double least_work = -1;
    candidates_.clear();
    // The argmin of (score, uncached) from the cursor to the end, and before the cursor: the
    // rotated scan's answer is the first, unless the second is strictly better.
    Best from_cursor, before_cursor;
    auto pass = [&](size_t from, size_t to, Best& best) {
      Best b = best;  // in registers for the loop
      for (size_t i = from; i < to; ++i) {
        const InstanceSnapshot& s = inst[i];
        if (!s.healthy) {
          scores[i] = support::kNaN;
          continue;
        }
        const double uncached = support::uncached(r, s, tiers_);
        const double work = static_cast<double>(s.pending_prefill_tokens) + uncached;
        const double score = work * static_cast<double>(s.running);
        scores[i] = score;
        running_sum += static_cast<double>(s.running);
        ++healthy;
        if (gate_on) {
          if (cost_gate && (least_work < 0 || work < least_work)) least_work = work;
          if (tiers::effectiveHits(r, s, tiers_) > threshold) [[unlikely]] {
            candidates_.push_back(static_cast<uint32_t>(i));
          }
        }
        b.offer(static_cast<int>(i), score, uncached);
      }
      best = b;
    };
    // Ascending index order throughout (the sums and the candidates as the passes had them).
    pass(0, cursor, before_cursor);
    pass(cursor, n, from_cursor);
    const double average = healthy > 0 ? running_sum / healthy : 0.0;
    std::string_view reason;
    int chosen = gate(r, inst, scores, average, least_work, &reason);
    if (chosen < 0 && n > 0) {
      chosen = before_cursor.betterThan(from_cursor) ? before_cursor.index : from_cursor.index;
      if (reason.empty()) reason = "lmetric_score";
      auto last = sessions_.get(r.session, now);
      if (chosen >= 0 && last && *last != chosen && *last < static_cast<int>(n) &&
          inst[*last].healthy && scores[*last] <= scores[chosen] * (1.0 + params_.hysteresis)) {
        chosen = *last;
        reason = "hysteresis";
      }
    }
    if (chosen >= 0) {
      cursor_ = static_cast<size_t>(chosen) + 1;
      sessions_.put(r.session, chosen, now);
    }
    return support::finishMarked(r, inst, chosen, reason, std::move(scores), classify_);
  }

 private:
  // A running argmin of (score, secondary) that keeps the first of equals.
  struct Best {
    int index = -1;
    double score = 0, secondary = 0;
    void offer(int i, double sc, double sec) {
      if (index < 0 || sc < score || (sc == score && sec < secondary)) {
        index = i;
        score = sc;
        secondary = sec;
      }
    }
    bool betterThan(const Best& o) const {
      return index >= 0 &&
             (o.index < 0 || score < o.score || (score == o.score && secondary < o.secondary));
    }
  };

  // The high-cache affinity gate over the candidates (healthy instances holding more than
  // gate_fraction of the prompt, effective hits: lower tiers credited, ascending): the one
  // holding the most, if it is not overloaded against `average` (and, with gate_cost_factor,
  // its prefill work is within that factor of `least_work`). Ties: lower score, lower index.
  int gate(const RouteRequest& r, std::span<const InstanceSnapshot> inst,
           const std::vector<double>& scores, double average, double least_work,
           std::string_view* reason) const {
    int best = -1;
    double best_hits = 0;
    bool any_overloaded = false;
    bool any_costly = false;
    for (uint32_t i : candidates_) {
      const InstanceSnapshot& s = inst[i];
      const double hits = tiers::effectiveHits(r, s, tiers_);
      if (support::overloaded(s.running, average, params_.overload_factor,
                              params_.overload_min_running)) {
        any_overloaded = true;
        continue;
      }
      const double work =
          static_cast<double>(s.pending_prefill_tokens) + support::uncached(r, s, tiers_);
      if (least_work >= 0 && work > params_.gate_cost_factor * least_work) {
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
  std::vector<uint32_t> candidates_;  // the gate's, per decision (capacity kept)
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
