// `unified`: argmin of predicted time to first token over local, push-migrate (a holder pushes
// its cached prefix to the target) and cold placements, with soft session affinity.
// Parameters: `unified:` (the cost model, also elastic's). Formulas: docs/policies.md.
#include "policy/unified.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "policy/policy_support.h"
#include "policy/registry.h"
#include "policy/session_table.h"

namespace kvf::policy {

double unified::transferSeconds(int64_t tokens, const UnifiedParams& model) {
  double bytes = static_cast<double>(std::max<int64_t>(0, tokens)) * model.kv_bytes_per_token;
  return bytes * 8.0 / (model.link_bandwidth_gbps * 1e9) + model.transfer_overhead_s;
}

double unified::queueSeconds(const InstanceSnapshot& s, const UnifiedParams& m) {
  return static_cast<double>(s.pending_prefill_tokens) / m.prefill_tokens_per_s +
         static_cast<double>(s.waiting) * m.waiting_request_s;
}

double unified::prefillSeconds(int64_t tokens, const UnifiedParams& m) {
  return static_cast<double>(std::max<int64_t>(0, tokens)) / m.prefill_tokens_per_s;
}

int64_t unified::hits(const RouteRequest& r, const InstanceSnapshot& s) {
  return std::clamp<int64_t>(s.matched_tokens, 0, r.prompt_tokens);
}

namespace {

using support::kNaN;
using unified::hits;
using unified::prefillSeconds;
using unified::queueSeconds;
using unified::transferSeconds;

std::shared_ptr<const PolicyParams> parse(config::ConfigMap& block) {
  auto p = std::make_shared<UnifiedParams>();
  block.get("prefill_tokens_per_s", &p->prefill_tokens_per_s, 1.0, 1e9);
  block.get("kv_bytes_per_token", &p->kv_bytes_per_token, 1.0, 1e9);
  block.get("link_bandwidth_gbps", &p->link_bandwidth_gbps, 0.001, 1e6);
  block.get("transfer_overhead_s", &p->transfer_overhead_s, 0.0, 60.0);
  block.get("waiting_request_s", &p->waiting_request_s, 0.0, 600.0);
  block.get("affinity_factor", &p->affinity_factor, 1.0, 1e6);
  block.get("min_push_tokens", &p->min_push_tokens, 1, int64_t{1} << 40);
  return p;
}

// The cheapest way to serve the request on one target instance.
struct Option {
  double cost = kNaN;
  int source = -1;     // holder pushing to the target; -1: local
  int64_t cached = 0;  // prompt tokens that will not be prefilled on the target
};

class UnifiedPolicy final : public Policy {
 public:
  explicit UnifiedPolicy(const PolicyConfig& c)
      : classify_(c.classify),
        model_(c.params<UnifiedParams>("unified")),
        sessions_(c.session_ttl, c.max_sessions) {}
  std::string_view name() const override { return "unified"; }
  bool movesKv() const override { return true; }

  Decision decide(const RouteRequest& r, std::span<const InstanceSnapshot> inst,
                  Nanos now) override {
    std::vector<Option> options(inst.size());
    std::vector<double> scores(inst.size(), kNaN), secondary(inst.size(), 0.0);
    Decision::Costs costs;
    std::array<int, 2> top = topHolders(r, inst);
    for (size_t i = 0; i < inst.size(); ++i) {
      if (!inst[i].healthy) continue;
      options[i] = bestOption(r, inst, i, top, &costs);
      scores[i] = options[i].cost;
      secondary[i] = static_cast<double>(r.prompt_tokens - options[i].cached);
    }
    int chosen = support::argmin(inst, scores, secondary, cursor_);
    std::string_view reason;
    if (chosen >= 0) {
      reason = options[chosen].source >= 0  ? "push_migrate"
               : options[chosen].cached > 0 ? "local_cached"
                                            : "cold";
      auto last = sessions_.get(r.session, now);
      if (last && *last != chosen && *last < static_cast<int>(inst.size()) && inst[*last].healthy &&
          scores[*last] <= model_.affinity_factor * scores[chosen]) {
        chosen = *last;
        reason = "session_affinity";
      }
      cursor_ = static_cast<size_t>(chosen) + 1;
      sessions_.put(r.session, chosen, now);
    }
    Decision d = support::finish(r, inst, chosen, reason, std::move(scores), classify_);
    d.predicted = costs;
    if (chosen >= 0) {
      const Option& o = options[chosen];
      d.mode = o.source >= 0 ? Mode::kPushMigrate : Mode::kLocal;
      d.source_instance = o.source;
      d.predicted_cached_tokens = o.cached;
      d.request_class = classify(r.prompt_tokens - o.cached, classify_);
      d.predicted.chosen = o.cost;
    }
    return d;
  }

 private:
  // The two holders able to push that hold the most of the prompt (ties: lower index); -1
  // where there are fewer.
  static std::array<int, 2> topHolders(const RouteRequest& r,
                                       std::span<const InstanceSnapshot> inst) {
    std::array<int, 2> top = {-1, -1};
    for (size_t h = 0; h < inst.size(); ++h) {
      if (!inst[h].push_capable || !inst[h].reachable) continue;
      int64_t held = hits(r, inst[h]);
      if (top[0] < 0 || held > hits(r, inst[top[0]])) {
        top = {static_cast<int>(h), top[0]};
      } else if (top[1] < 0 || held > hits(r, inst[top[1]])) {
        top[1] = static_cast<int>(h);
      }
    }
    return top;
  }

  // Local with the target's own hits, or a push from the holder that minimises
  // queue + transfer(extra tokens) + prefill(rest). Also folds the costs into `costs`.
  // push cost = const + (transfer - prefill seconds per token) x held: while moving a token is
  // cheaper than computing it, the holder with the longest run is best, so only the top two
  // holders are candidates (O(n) per decision); otherwise every holder is looked at.
  Option bestOption(const RouteRequest& r, std::span<const InstanceSnapshot> inst, size_t i,
                    const std::array<int, 2>& top, Decision::Costs* costs) const {
    const UnifiedParams& m = model_;
    const InstanceSnapshot& t = inst[i];
    double queue = queueSeconds(t, m);
    int64_t own = hits(r, t);
    Option best{queue + prefillSeconds(r.prompt_tokens - own, m), -1, own};
    double& mode_cost = own > 0 ? costs->local : costs->cold;
    if (std::isnan(mode_cost) || best.cost < mode_cost) mode_cost = best.cost;
    if (!t.push_capable) return best;
    auto consider = [&](size_t h) {
      const InstanceSnapshot& holder = inst[h];
      int64_t held = hits(r, holder);
      // Never migrate a cold prefix: the holder must add a real run of cached tokens.
      if (h == i || !holder.push_capable || !holder.reachable || held - own < m.min_push_tokens) {
        return;
      }
      double cost =
          queue + transferSeconds(held - own, m) + prefillSeconds(r.prompt_tokens - held, m);
      if (std::isnan(costs->push) || cost < costs->push) costs->push = cost;
      if (cost < best.cost) best = Option{cost, static_cast<int>(h), held};
    };
    bool moving_is_cheaper =
        m.kv_bytes_per_token * 8.0 / (m.link_bandwidth_gbps * 1e9) < 1.0 / m.prefill_tokens_per_s;
    if (moving_is_cheaper) {
      int h = top[0] != static_cast<int>(i) ? top[0] : top[1];
      if (h >= 0) consider(static_cast<size_t>(h));
    } else {
      for (size_t h = 0; h < inst.size(); ++h) consider(h);
    }
    return best;
  }

  ClassifyConfig classify_;
  UnifiedParams model_;
  SessionTable sessions_;
  size_t cursor_ = 0;
};

}  // namespace

namespace unified {
const PolicyDefinition& definition() {
  static const PolicyDefinition kDefinition{"unified", &parse, &makePolicy<UnifiedPolicy>};
  return kDefinition;
}
}  // namespace unified

}  // namespace kvf::policy
