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

double unified::moveSeconds(int64_t tokens, const InstanceSnapshot& source,
                            const UnifiedParams& m) {
  const auto running = static_cast<double>(std::max<int64_t>(0, source.running));
  return transferSeconds(tokens, m) * (1.0 + m.source_share_per_request * running) +
         (running > 0 ? m.source_step_s : 0.0);
}

double unified::nixlPullSeconds(int64_t compute_tokens, int64_t read_tokens,
                                const InstanceSnapshot& holder, const UnifiedParams& m) {
  // The first leg is a request like any other on the holder: it queues behind the holder's
  // pending prefill, waits for the step the holder is running, and takes at least one step of
  // its own even when the whole prompt is a hit (the last token is always computed). Only its
  // answer lets the target start reading.
  const auto running = static_cast<double>(std::max<int64_t>(0, holder.running));
  const double leg = queueSeconds(holder, m) + (running > 0 ? m.source_step_s : 0.0) +
                     std::max(m.source_step_s, prefillSeconds(compute_tokens, m));
  return leg + transferSeconds(read_tokens, m) * (1.0 + m.source_share_per_request * running);
}

MoveFeedbackConfig unified::feedbackConfig(const UnifiedParams& m) {
  MoveFeedbackConfig c;
  c.weight = m.feedback_weight;
  c.min_samples = m.feedback_min_samples;
  c.max_factor = m.feedback_max_factor;
  c.min_factor = 1.0 / m.feedback_max_factor;
  return c;
}

double unified::prefillSeconds(int64_t tokens, const UnifiedParams& m) {
  return static_cast<double>(std::max<int64_t>(0, tokens)) / m.prefill_tokens_per_s;
}

int64_t unified::hits(const RouteRequest& r, const InstanceSnapshot& s) {
  return std::clamp<int64_t>(s.matched_tokens, 0, r.prompt_tokens);
}

double unified::localSeconds(const RouteRequest& r, const InstanceSnapshot& s,
                             const UnifiedParams& m, const TierCreditConfig& tiers) {
  const double rest = static_cast<double>(r.prompt_tokens) - tiers::effectiveHits(r, s, tiers);
  return queueSeconds(s, m) + std::max(0.0, rest) / m.prefill_tokens_per_s;
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
  block.get("source_step_s", &p->source_step_s, 0.0, 60.0);
  block.get("source_share_per_request", &p->source_share_per_request, 0.0, 100.0);
  block.get("move_margin", &p->move_margin, 0.0, 0.99);
  block.get("feedback_weight", &p->feedback_weight, 0.001, 1.0);
  block.get("feedback_min_samples", &p->feedback_min_samples, 1, 1'000'000);
  block.get("feedback_max_factor", &p->feedback_max_factor, 1.0, 1000.0);
  return p;
}

// The cheapest way to serve the request on one target instance.
struct Option {
  double cost = kNaN;
  int source = -1;           // holder pushing to the target; -1: local
  int64_t cached = 0;        // prompt tokens that will not be prefilled on the target
  double move_model = kNaN;  // a push: the model's move seconds, and with the correction
  double move = kNaN;
};

class UnifiedPolicy final : public Policy {
 public:
  explicit UnifiedPolicy(const PolicyConfig& c)
      : classify_(c.classify),
        model_(c.params<UnifiedParams>("unified")),
        tiers_(c.tiers),
        sessions_(c.session_ttl, c.max_sessions),
        feedback_(unified::feedbackConfig(model_)) {}
  std::string_view name() const override { return "unified"; }
  bool movesKv() const override { return true; }
  void moveMeasured(int source, int dest, double model_s, double measured_s) override {
    feedback_.record(source, dest, model_s, measured_s);
  }

  Decision decide(const RouteRequest& r, std::span<const InstanceSnapshot> inst,
                  Nanos now) override {
    std::vector<Option> options(inst.size());
    std::vector<double> scores(inst.size(), kNaN), secondary(inst.size(), 0.0);
    Decision::Costs costs;
    bool tiered = false;
    std::array<int, 2> top = topHolders(r, inst, &tiered);
    for (size_t i = 0; i < inst.size(); ++i) {
      if (!inst[i].healthy) continue;
      options[i] = bestOption(r, inst, i, top, tiered, &costs);
      scores[i] = options[i].cost;
      secondary[i] = static_cast<double>(r.prompt_tokens - options[i].cached);
    }
    int chosen = support::argmin(inst, scores, secondary, cursor_);
    std::string_view reason;
    if (chosen >= 0) {
      const int source = options[chosen].source;
      reason = source >= 0 && inst[source].nixl ? "nixl_pull"
               : source >= 0                    ? "push_migrate"
               : options[chosen].cached > 0     ? "local_cached"
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
      d.move_model_s = o.move_model;
      d.move_s = o.move;
    }
    return d;
  }

 private:
  // The two holders able to push that reach furthest into the prompt (GPU hits and their
  // lower-tier run; ties: lower index); -1 where there are fewer. `tiered`: some holder's run
  // continues in a lower tier.
  std::array<int, 2> topHolders(const RouteRequest& r, std::span<const InstanceSnapshot> inst,
                                bool* tiered) const {
    std::array<int, 2> top = {-1, -1};
    std::array<int64_t, 2> top_held = {0, 0};
    for (size_t h = 0; h < inst.size(); ++h) {
      if (!inst[h].push_capable || !inst[h].reachable) continue;
      *tiered = *tiered || inst[h].cpu_tokens > 0 || inst[h].disk_tokens > 0;
      int64_t held = tiers::reach(r, inst[h], tiers_);
      if (top[0] < 0 || held > top_held[0]) {
        top = {static_cast<int>(h), top[0]};
        top_held = {held, top_held[0]};
      } else if (top[1] < 0 || held > top_held[1]) {
        top[1] = static_cast<int>(h);
        top_held[1] = held;
      }
    }
    return top;
  }

  // Local with the target's own hits, or a push from the holder that minimises
  // queue + move(extra tokens, holder's load) x measured correction + prefill(rest), taken only
  // when it beats local by move_margin. Also folds the costs into `costs`.
  // push cost = const + (transfer - prefill seconds per token) x held: while moving a token is
  // cheaper than computing it, the holder with the longest run is best, so only the top two
  // holders are candidates (O(n) per decision); otherwise every holder is looked at. A NIXL
  // holder's cost falls with held at the prefill rate (it computes the rest), so the same holds.
  // A NIXL holder's queue and leg are the move's own terms: a busy holder loses to local.
  // A holder whose run continues in host memory or on disk can push it too: its read out of
  // that tier (tiers::pushReadSeconds) adds to the move; while any holder has such a run the
  // move's cost is no longer linear in held, so every holder is looked at.
  Option bestOption(const RouteRequest& r, std::span<const InstanceSnapshot> inst, size_t i,
                    const std::array<int, 2>& top, bool tiered, Decision::Costs* costs) const {
    const UnifiedParams& m = model_;
    const InstanceSnapshot& t = inst[i];
    double queue = queueSeconds(t, m);
    int64_t own = hits(r, t);
    const double local = unified::localSeconds(r, t, m, tiers_);
    Option best{local, -1, own};
    double& mode_cost =
        own > 0 || t.cpu_tokens > 0 || t.disk_tokens > 0 ? costs->local : costs->cold;
    if (std::isnan(mode_cost) || best.cost < mode_cost) mode_cost = best.cost;
    if (!t.push_capable) return best;
    auto consider = [&](size_t h) {
      const InstanceSnapshot& holder = inst[h];
      int64_t held = tiers::reach(r, holder, tiers_);
      // Never migrate a cold prefix: the holder must add a real run of cached tokens.
      if (h == i || !holder.push_capable || !holder.reachable || held - own < m.min_push_tokens) {
        return;
      }
      // kvfabric: the holder pushes the run the target lacks, the target prefills the rest.
      // NIXL: the holder's first leg prefills the rest of the prompt on the holder, then the
      // target reads every block it lacks and computes (almost) nothing.
      const int64_t rest = r.prompt_tokens - held;
      const int64_t cached = holder.nixl ? r.prompt_tokens : held;
      double move_model =
          (holder.nixl ? unified::nixlPullSeconds(rest, r.prompt_tokens - own, holder, m)
                       : unified::moveSeconds(held - own, holder, m)) +
          tiers::pushReadSeconds(r, holder, held - own, tiers_);
      double move = move_model * feedback_.factor(static_cast<int>(h), static_cast<int>(i));
      double cost = queue + move + (holder.nixl ? 0.0 : prefillSeconds(rest, m));
      if (std::isnan(costs->push) || cost < costs->push) costs->push = cost;
      // Only a clear gain over computing on the target itself pays for a move's risk.
      if (cost < best.cost && cost <= (1.0 - m.move_margin) * local) {
        best = Option{cost, static_cast<int>(h), cached, move_model, move};
      }
    };
    bool moving_is_cheaper =
        m.kv_bytes_per_token * 8.0 / (m.link_bandwidth_gbps * 1e9) < 1.0 / m.prefill_tokens_per_s;
    if (moving_is_cheaper && !tiered) {
      int h = top[0] != static_cast<int>(i) ? top[0] : top[1];
      if (h >= 0) consider(static_cast<size_t>(h));
    } else {
      for (size_t h = 0; h < inst.size(); ++h) consider(h);
    }
    return best;
  }

  ClassifyConfig classify_;
  UnifiedParams model_;
  TierCreditConfig tiers_;
  SessionTable sessions_;
  MoveFeedback feedback_;
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
