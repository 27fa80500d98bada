#include "policy/policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "policy/policy_internal.h"
#include "policy/session_table.h"

namespace kvf::policy {

std::string_view requestClassName(RequestClass c) {
  switch (c) {
    case RequestClass::kWarm:
      return "warm";
    case RequestClass::kMedium:
      return "medium";
    case RequestClass::kHeavy:
      return "heavy";
  }
  return "unknown";
}

std::string_view modeName(Mode m) {
  switch (m) {
    case Mode::kLocal:
      return "local";
    case Mode::kPushMigrate:
      return "push_migrate";
    case Mode::kPrefillOffload:
      return "prefill_offload";
  }
  return "unknown";
}

std::string_view policyKindName(PolicyKind k) {
  switch (k) {
    case PolicyKind::kRoundRobin:
      return "round_robin";
    case PolicyKind::kLeastRequest:
      return "least_request";
    case PolicyKind::kLinear:
      return "linear";
    case PolicyKind::kLMetric:
      return "lmetric";
    case PolicyKind::kHybrid:
      return "hybrid";
    case PolicyKind::kUnified:
      return "unified";
    case PolicyKind::kElastic:
      return "elastic";
  }
  return "unknown";
}

RequestClass classify(int64_t new_tokens, const ClassifyConfig& config) {
  if (new_tokens < config.warm_max_new_tokens) return RequestClass::kWarm;
  if (new_tokens <= config.medium_max_new_tokens) return RequestClass::kMedium;
  return RequestClass::kHeavy;
}

void parsePolicyConfig(config::ConfigMap& map, PolicyConfig* out) {
  map.getEnum<PolicyKind>("kind", &out->kind,
                          {{"round_robin", PolicyKind::kRoundRobin},
                           {"least_request", PolicyKind::kLeastRequest},
                           {"linear", PolicyKind::kLinear},
                           {"lmetric", PolicyKind::kLMetric},
                           {"hybrid", PolicyKind::kHybrid},
                           {"unified", PolicyKind::kUnified},
                           {"elastic", PolicyKind::kElastic}});
  if (auto c = map.map("classify")) {
    c->get("warm_max_new_tokens", &out->classify.warm_max_new_tokens, 1, int64_t{1} << 40);
    c->get("medium_max_new_tokens", &out->classify.medium_max_new_tokens, 1, int64_t{1} << 40);
    if (out->classify.medium_max_new_tokens < out->classify.warm_max_new_tokens) {
      c->fail("medium_max_new_tokens", "must be >= warm_max_new_tokens");
    }
    c->rejectUnknownKeys();
  }
  double ttl_s = nanosToSeconds(out->session_ttl);
  map.get("session_ttl_s", &ttl_s, 0.001, 7 * 86400.0);
  out->session_ttl = secondsToNanos(ttl_s);
  uint64_t max_sessions = out->max_sessions;
  map.get("max_sessions", &max_sessions, 0, uint64_t{1} << 32);
  out->max_sessions = max_sessions;
  if (auto l = map.map("linear")) {
    l->get("alpha", &out->linear.alpha, 0.0, 1e6);
    l->get("overload_factor", &out->linear.overload_factor, 1.0, 1e6);
    l->rejectUnknownKeys();
  }
  if (auto h = map.map("hybrid")) {
    h->get("gate_fraction", &out->hybrid.gate_fraction, 0.0, 1.0);
    h->get("overload_factor", &out->hybrid.overload_factor, 1.0, 1e6);
    h->get("overload_min_running", &out->hybrid.overload_min_running, 0, int64_t{1} << 30);
    h->get("hysteresis", &out->hybrid.hysteresis, 0.0, 10.0);
    h->rejectUnknownKeys();
  }
  if (auto u = map.map("unified")) internal::parseUnifiedConfig(*u, &out->unified);
  if (auto e = map.map("elastic")) internal::parseElasticConfig(*e, &out->elastic);
}

namespace internal {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

int64_t uncached(const RouteRequest& r, const InstanceSnapshot& s) {
  return std::max<int64_t>(0, r.prompt_tokens - s.matched_tokens);
}

// Argmin over healthy instances of (score, secondary); remaining ties go to the first index at
// or after `cursor` (rotating), so equal instances share work deterministically.
int argmin(std::span<const InstanceSnapshot> inst, const std::vector<double>& score,
           const std::vector<double>& secondary, size_t cursor) {
  int best = -1;
  size_t n = inst.size();
  for (size_t k = 0; k < n; ++k) {
    size_t i = (cursor + k) % n;
    if (!inst[i].healthy) continue;
    if (best < 0 || score[i] < score[best] ||
        (score[i] == score[best] && secondary[i] < secondary[best])) {
      best = static_cast<int>(i);
    }
  }
  return best;
}

// Shared tail of every policy: fills prediction, class and scores of the chosen instance.
Decision finish(const RouteRequest& r, std::span<const InstanceSnapshot> inst, int chosen,
                std::string_view reason, std::vector<double> scores, const ClassifyConfig& cc) {
  Decision d;
  d.instance = chosen;
  d.reason = chosen < 0 ? std::string_view("no_healthy_instance") : reason;
  for (size_t i = 0; i < inst.size(); ++i) {
    if (!inst[i].healthy) scores[i] = kNaN;
  }
  d.scores = std::move(scores);
  int64_t cached = chosen < 0 ? 0 : std::min(inst[chosen].matched_tokens, r.prompt_tokens);
  d.predicted_cached_tokens = cached;
  d.request_class = classify(r.prompt_tokens - cached, cc);
  return d;
}

}  // namespace internal

namespace {

using internal::argmin;
using internal::finish;
using internal::kNaN;
using internal::uncached;

class RoundRobinPolicy final : public Policy {
 public:
  explicit RoundRobinPolicy(const PolicyConfig& c) : config_(c) {}
  PolicyKind kind() const override { return PolicyKind::kRoundRobin; }
  Decision decide(const RouteRequest& r, std::span<const InstanceSnapshot> inst, Nanos) override {
    std::vector<double> scores(inst.size(), 0.0);
    int chosen = -1;
    for (size_t k = 0; k < inst.size() && chosen < 0; ++k) {
      size_t i = (cursor_ + k) % inst.size();
      if (inst[i].healthy) chosen = static_cast<int>(i);
    }
    for (size_t i = 0; i < inst.size(); ++i) {
      scores[i] = static_cast<double>((i + inst.size() - cursor_ % inst.size()) % inst.size());
    }
    if (chosen >= 0) cursor_ = static_cast<size_t>(chosen) + 1;
    return finish(r, inst, chosen, "round_robin", std::move(scores), config_.classify);
  }

 private:
  PolicyConfig config_;
  size_t cursor_ = 0;
};

class LeastRequestPolicy final : public Policy {
 public:
  explicit LeastRequestPolicy(const PolicyConfig& c) : config_(c) {}
  PolicyKind kind() const override { return PolicyKind::kLeastRequest; }
  Decision decide(const RouteRequest& r, std::span<const InstanceSnapshot> inst, Nanos) override {
    std::vector<double> scores(inst.size()), secondary(inst.size());
    for (size_t i = 0; i < inst.size(); ++i) {
      scores[i] = static_cast<double>(inst[i].running + inst[i].waiting);
      secondary[i] = static_cast<double>(inst[i].pending_prefill_tokens);
    }
    int chosen = inst.empty() ? -1 : argmin(inst, scores, secondary, cursor_ % inst.size());
    if (chosen >= 0) cursor_ = static_cast<size_t>(chosen) + 1;
    return finish(r, inst, chosen, "least_request", std::move(scores), config_.classify);
  }

 private:
  PolicyConfig config_;
  size_t cursor_ = 0;
};

class LinearPolicy final : public Policy {
 public:
  explicit LinearPolicy(const PolicyConfig& c)
      : config_(c), sessions_(c.session_ttl, c.max_sessions) {}
  PolicyKind kind() const override { return PolicyKind::kLinear; }
  Decision decide(const RouteRequest& r, std::span<const InstanceSnapshot> inst,
                  Nanos now) override {
    std::vector<double> scores(inst.size()), secondary(inst.size());
    double load_sum = 0;
    int healthy = 0;
    for (size_t i = 0; i < inst.size(); ++i) {
      scores[i] = static_cast<double>(inst[i].ongoing_tokens) -
                  config_.linear.alpha * static_cast<double>(inst[i].matched_tokens);
      secondary[i] = static_cast<double>(inst[i].running);
      if (inst[i].healthy) {
        load_sum += static_cast<double>(inst[i].ongoing_tokens);
        ++healthy;
      }
    }
    double average = healthy > 0 ? load_sum / healthy : 0.0;
    std::string_view reason = "linear_score";
    if (auto pinned = sessions_.get(r.session, now);
        pinned && *pinned < static_cast<int>(inst.size())) {
      const InstanceSnapshot& p = inst[*pinned];
      bool overloaded =
          static_cast<double>(p.ongoing_tokens) > config_.linear.overload_factor * average;
      if (p.healthy && (!overloaded || average <= 0)) {
        sessions_.put(r.session, *pinned, now);
        return finish(r, inst, *pinned, "session_affinity", std::move(scores), config_.classify);
      }
      reason = p.healthy ? "overload_redirect" : "pinned_unhealthy";
    }
    int chosen = inst.empty() ? -1 : argmin(inst, scores, secondary, cursor_ % inst.size());
    if (chosen >= 0) {
      cursor_ = static_cast<size_t>(chosen) + 1;
      sessions_.put(r.session, chosen, now);
    }
    return finish(r, inst, chosen, reason, std::move(scores), config_.classify);
  }

 private:
  PolicyConfig config_;
  SessionTable sessions_;
  size_t cursor_ = 0;
};

// score = (pending prefill tokens + new uncached tokens) x running requests.
void lmetricScores(const RouteRequest& r, std::span<const InstanceSnapshot> inst,
                   std::vector<double>* scores, std::vector<double>* secondary) {
  scores->resize(inst.size());
  secondary->resize(inst.size());
  for (size_t i = 0; i < inst.size(); ++i) {
    double prefill = static_cast<double>(inst[i].pending_prefill_tokens + uncached(r, inst[i]));
    (*scores)[i] = prefill * static_cast<double>(inst[i].running);
    (*secondary)[i] = static_cast<double>(uncached(r, inst[i]));
  }
}

class LMetricPolicy final : public Policy {
 public:
  explicit LMetricPolicy(const PolicyConfig& c) : config_(c) {}
  PolicyKind kind() const override { return PolicyKind::kLMetric; }
  Decision decide(const RouteRequest& r, std::span<const InstanceSnapshot> inst, Nanos) override {
    std::vector<double> scores, secondary;
    lmetricScores(r, inst, &scores, &secondary);
    int chosen = inst.empty() ? -1 : argmin(inst, scores, secondary, cursor_ % inst.size());
    if (chosen >= 0) cursor_ = static_cast<size_t>(chosen) + 1;
    return finish(r, inst, chosen, "lmetric_score", std::move(scores), config_.classify);
  }

 private:
  PolicyConfig config_;
  size_t cursor_ = 0;
};

}  // namespace

namespace internal {

class HybridPolicy final : public Policy {
 public:
  explicit HybridPolicy(const PolicyConfig& c)
      : config_(c), sessions_(c.session_ttl, c.max_sessions) {}
  PolicyKind kind() const override { return PolicyKind::kHybrid; }
  Decision decide(const RouteRequest& r, std::span<const InstanceSnapshot> inst,
                  Nanos now) override {
    std::vector<double> scores, secondary;
    lmetricScores(r, inst, &scores, &secondary);
    std::string_view reason;
    int chosen = gate(r, inst, scores, &reason);
    if (chosen < 0 && !inst.empty()) {
      chosen = argmin(inst, scores, secondary, cursor_ % inst.size());
      if (reason.empty()) reason = "lmetric_score";
      auto last = sessions_.get(r.session, now);
      if (chosen >= 0 && last && *last != chosen && *last < static_cast<int>(inst.size()) &&
          inst[*last].healthy &&
          scores[*last] <= scores[chosen] * (1.0 + config_.hybrid.hysteresis)) {
        chosen = *last;
        reason = "hysteresis";
      }
    }
    if (chosen >= 0) {
      cursor_ = static_cast<size_t>(chosen) + 1;
      sessions_.put(r.session, chosen, now);
    }
    return finish(r, inst, chosen, reason, std::move(scores), config_.classify);
  }

 private:
  // The high-cache affinity gate: the instance holding the most of the prompt, if that is more
  // than gate_fraction of it and the instance is not overloaded. Ties: lower score, lower index.
  int gate(const RouteRequest& r, std::span<const InstanceSnapshot> inst,
           const std::vector<double>& scores, std::string_view* reason) const {
    if (r.prompt_tokens <= 0) return -1;
    double running_sum = 0;
    int healthy = 0;
    for (const auto& s : inst) {
      if (!s.healthy) continue;
      running_sum += static_cast<double>(s.running);
      ++healthy;
    }
    double average = healthy > 0 ? running_sum / healthy : 0.0;
    double threshold = config_.hybrid.gate_fraction * static_cast<double>(r.prompt_tokens);
    int best = -1;
    bool any_overloaded = false;
    for (size_t i = 0; i < inst.size(); ++i) {
      const InstanceSnapshot& s = inst[i];
      if (!s.healthy || static_cast<double>(s.matched_tokens) <= threshold) continue;
      if (s.running >= config_.hybrid.overload_min_running &&
          static_cast<double>(s.running) > config_.hybrid.overload_factor * average) {
        any_overloaded = true;
        continue;
      }
      if (best < 0 || s.matched_tokens > inst[best].matched_tokens ||
          (s.matched_tokens == inst[best].matched_tokens && scores[i] < scores[best])) {
        best = static_cast<int>(i);
      }
    }
    if (best >= 0) {
      *reason = "cache_gate";
    } else if (any_overloaded) {
      *reason = "gate_overloaded";
    }
    return best;
  }

  PolicyConfig config_;
  SessionTable sessions_;
  size_t cursor_ = 0;
};

std::unique_ptr<Policy> createHybridPolicy(const PolicyConfig& config) {
  return std::make_unique<HybridPolicy>(config);
}

}  // namespace internal

std::unique_ptr<Policy> createPolicy(const PolicyConfig& config) {
  switch (config.kind) {
    case PolicyKind::kRoundRobin:
      return std::make_unique<RoundRobinPolicy>(config);
    case PolicyKind::kLeastRequest:
      return std::make_unique<LeastRequestPolicy>(config);
    case PolicyKind::kLinear:
      return std::make_unique<LinearPolicy>(config);
    case PolicyKind::kLMetric:
      return std::make_unique<LMetricPolicy>(config);
    case PolicyKind::kHybrid:
      return internal::createHybridPolicy(config);
    case PolicyKind::kUnified:
      return internal::createUnifiedPolicy(config);
    case PolicyKind::kElastic:
      return internal::createElasticPolicy(config);
  }
  return nullptr;
}

}  // namespace kvf::policy
