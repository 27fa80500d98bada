// The policies with KV movement: `unified` (argmin of predicted time to first token over
// local, push-migrate and cold placements) and `elastic` (hybrid placement; HEAVY prefills
// offloaded to a peer under a concurrency cap). Formulas: docs/policies.md.
#include <algorithm>
#include <array>
#include <cmath>

#include "policy/policy_internal.h"
#include "policy/session_table.h"

namespace kvf::policy {

double transferSeconds(int64_t tokens, const PolicyConfig::Unified& model) {
  double bytes = static_cast<double>(std::max<int64_t>(0, tokens)) * model.kv_bytes_per_token;
  return bytes * 8.0 / (model.link_bandwidth_gbps * 1e9) + model.transfer_overhead_s;
}

namespace internal {

void parseUnifiedConfig(config::ConfigMap& map, PolicyConfig::Unified* out) {
  map.get("prefill_tokens_per_s", &out->prefill_tokens_per_s, 1.0, 1e9);
  map.get("kv_bytes_per_token", &out->kv_bytes_per_token, 1.0, 1e9);
  map.get("link_bandwidth_gbps", &out->link_bandwidth_gbps, 0.001, 1e6);
  map.get("transfer_overhead_s", &out->transfer_overhead_s, 0.0, 60.0);
  map.get("waiting_request_s", &out->waiting_request_s, 0.0, 600.0);
  map.get("affinity_factor", &out->affinity_factor, 1.0, 1e6);
  map.get("min_push_tokens", &out->min_push_tokens, 1, int64_t{1} << 40);
  map.rejectUnknownKeys();
}

void parseElasticConfig(config::ConfigMap& map, PolicyConfig::Elastic* out) {
  map.get("max_concurrent_offloads", &out->max_concurrent_offloads, 0, int64_t{1} << 20);
  map.get("overload_factor", &out->overload_factor, 1.0, 1e6);
  map.get("overload_min_running", &out->overload_min_running, 0, int64_t{1} << 30);
  map.get("max_pending_prefill_tokens", &out->max_pending_prefill_tokens, 0, int64_t{1} << 40);
  map.get("max_cost_ratio", &out->max_cost_ratio, 0.0, 1e6);
  map.get("lease_ms", &out->lease_ms, 1, 3'600'000);
  map.get("prefill_timeout_s", &out->prefill_timeout_s, 0.01, 86400.0);
  map.rejectUnknownKeys();
}

namespace {

// Seconds of prefill already queued on an instance (router-accounted tokens plus the engine's
// waiting requests at a fixed cost each).
double queueSeconds(const InstanceSnapshot& s, const PolicyConfig::Unified& m) {
  return static_cast<double>(s.pending_prefill_tokens) / m.prefill_tokens_per_s +
         static_cast<double>(s.waiting) * m.waiting_request_s;
}

double prefillSeconds(int64_t tokens, const PolicyConfig::Unified& m) {
  return static_cast<double>(std::max<int64_t>(0, tokens)) / m.prefill_tokens_per_s;
}

int64_t hits(const RouteRequest& r, const InstanceSnapshot& s) {
  return std::clamp<int64_t>(s.matched_tokens, 0, r.prompt_tokens);
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
      : config_(c), sessions_(c.session_ttl, c.max_sessions) {}
  PolicyKind kind() const override { return PolicyKind::kUnified; }

  Decision decide(const RouteRequest& r, std::span<const InstanceSnapshot> inst,
                  Nanos now) override {
    const auto& m = config_.unified;
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
    int chosen = inst.empty() ? -1 : argmin(inst, scores, secondary, cursor_ % inst.size());
    std::string_view reason;
    if (chosen >= 0) {
      reason = options[chosen].source >= 0  ? "push_migrate"
               : options[chosen].cached > 0 ? "local_cached"
                                            : "cold";
      auto last = sessions_.get(r.session, now);
      if (last && *last != chosen && *last < static_cast<int>(inst.size()) && inst[*last].healthy &&
          scores[*last] <= m.affinity_factor * scores[chosen]) {
        chosen = *last;
        reason = "session_affinity";
      }
      cursor_ = static_cast<size_t>(chosen) + 1;
      sessions_.put(r.session, chosen, now);
    }
    Decision d = finish(r, inst, chosen, reason, std::move(scores), config_.classify);
    d.predicted = costs;
    if (chosen >= 0) {
      const Option& o = options[chosen];
      d.mode = o.source >= 0 ? Mode::kPushMigrate : Mode::kLocal;
      d.source_instance = o.source;
      d.predicted_cached_tokens = o.cached;
      d.request_class = classify(r.prompt_tokens - o.cached, config_.classify);
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
    const auto& m = config_.unified;
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

  PolicyConfig config_;
  SessionTable sessions_;
  size_t cursor_ = 0;
};

class ElasticPolicy final : public Policy {
 public:
  explicit ElasticPolicy(const PolicyConfig& c) : config_(c), base_(createHybridPolicy(c)) {}
  PolicyKind kind() const override { return PolicyKind::kElastic; }
  void offloadFinished() override { in_flight_ = std::max<int64_t>(0, in_flight_ - 1); }
  int64_t offloadsInFlight() const override { return in_flight_; }

  Decision decide(const RouteRequest& r, std::span<const InstanceSnapshot> inst,
                  Nanos now) override {
    Decision d = base_->decide(r, inst, now);
    if (d.instance < 0) return d;
    const auto& m = config_.unified;
    const InstanceSnapshot& decode = inst[d.instance];
    double local = queueSeconds(decode, m) + prefillSeconds(r.prompt_tokens - hits(r, decode), m);
    d.predicted.local = local;
    d.predicted.chosen = local;
    if (d.request_class != RequestClass::kHeavy || !decode.push_capable) return d;
    if (in_flight_ >= config_.elastic.max_concurrent_offloads) {
      d.reason = "offload_cap";
      return d;
    }
    bool any_fit = false;
    for (size_t k = 0; k < inst.size(); ++k) {
      size_t p = (cursor_ + k) % inst.size();
      if (static_cast<int>(p) == d.instance || !fits(inst, p)) continue;
      any_fit = true;
      double cost = queueSeconds(inst[p], m) +
                    prefillSeconds(r.prompt_tokens - hits(r, inst[p]), m) +
                    transferSeconds(r.prompt_tokens - hits(r, decode), m);
      if (std::isnan(d.predicted.offload) || cost < d.predicted.offload) {
        d.predicted.offload = cost;
      }
      if (cost > config_.elastic.max_cost_ratio * local) continue;
      cursor_ = p + 1;
      ++in_flight_;
      d.mode = Mode::kPrefillOffload;
      d.prefill_instance = static_cast<int>(p);
      d.predicted.offload = cost;
      d.predicted.chosen = cost;
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
    if (s.pending_prefill_tokens > config_.elastic.max_pending_prefill_tokens) return false;
    double running_sum = 0;
    int healthy = 0;
    for (const auto& x : inst) {
      if (!x.healthy) continue;
      running_sum += static_cast<double>(x.running);
      ++healthy;
    }
    double average = healthy > 0 ? running_sum / healthy : 0.0;
    return !(s.running >= config_.elastic.overload_min_running &&
             static_cast<double>(s.running) > config_.elastic.overload_factor * average);
  }

  PolicyConfig config_;
  std::unique_ptr<Policy> base_;
  size_t cursor_ = 0;
  int64_t in_flight_ = 0;
};

}  // namespace

std::unique_ptr<Policy> createUnifiedPolicy(const PolicyConfig& config) {
  return std::make_unique<UnifiedPolicy>(config);
}

std::unique_ptr<Policy> createElasticPolicy(const PolicyConfig& config) {
  return std::make_unique<ElasticPolicy>(config);
}

}  // namespace internal
}  // namespace kvf::policy
