// `linear`: session-sticky; a session stays on its pinned instance unless that instance's
// ongoing tokens exceed overload_factor x the average, else score = ongoing_tokens -
// alpha x cache_hit_tokens (argmin). Parameters: the `linear:` block.
#include "policy/policy_support.h"
#include "policy/registry.h"
#include "policy/session_table.h"

namespace kvf::policy {
namespace {

struct LinearParams final : PolicyParams {
  double alpha = 1.0;            // weight of cache-hit tokens against ongoing tokens
  double overload_factor = 2.0;  // redirect when pinned load > factor x average load
};

std::shared_ptr<const PolicyParams> parse(config::ConfigMap& block) {
  auto p = std::make_shared<LinearParams>();
  block.get("alpha", &p->alpha, 0.0, 1e6);
  block.get("overload_factor", &p->overload_factor, 1.0, 1e6);
  return p;
}

class LinearPolicy final : public Policy {
 public:
  explicit LinearPolicy(const PolicyConfig& c)
      : classify_(c.classify),
        params_(c.params<LinearParams>("linear")),
        sessions_(c.session_ttl, c.max_sessions) {}
  std::string_view name() const override { return "linear"; }
  Decision decide(const RouteRequest& r, std::span<const InstanceSnapshot> inst,
                  Nanos now) override {
    std::vector<double> scores(inst.size()), secondary(inst.size());
    double load_sum = 0;
    int healthy = 0;
    for (size_t i = 0; i < inst.size(); ++i) {
      scores[i] = static_cast<double>(inst[i].ongoing_tokens) -
                  params_.alpha * static_cast<double>(inst[i].matched_tokens);
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
      bool overloaded = static_cast<double>(p.ongoing_tokens) > params_.overload_factor * average;
      if (p.healthy && (!overloaded || average <= 0)) {
        sessions_.put(r.session, *pinned, now);
        return support::finish(r, inst, *pinned, "session_affinity", std::move(scores), classify_);
      }
      reason = p.healthy ? "overload_redirect" : "pinned_unhealthy";
    }
    int chosen = support::argmin(inst, scores, secondary, cursor_);
    if (chosen >= 0) {
      cursor_ = static_cast<size_t>(chosen) + 1;
      sessions_.put(r.session, chosen, now);
    }
    return support::finish(r, inst, chosen, reason, std::move(scores), classify_);
  }

 private:
  ClassifyConfig classify_;
  LinearParams params_;
  SessionTable sessions_;
  size_t cursor_ = 0;
};

}  // namespace

namespace linear {
const PolicyDefinition& definition() {
  static const PolicyDefinition kDefinition{"linear", &parse, &makePolicy<LinearPolicy>};
  return kDefinition;
}
}  // namespace linear

}  // namespace kvf::policy
