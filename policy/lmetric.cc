// `lmetric`: argmin of (pending prefill tokens + new uncached tokens) x running requests, no
// affinity; the uncached term gives it an implicit soft affinity.
#include "policy/lmetric.h"

#include "policy/policy_support.h"
#include "policy/registry.h"

namespace kvf::policy {

void lmetric::scores(const RouteRequest& r, std::span<const InstanceSnapshot> inst,
                     const TierCreditConfig& tiers, std::vector<double>* scores,
                     std::vector<double>* secondary) {
  scores->resize(inst.size());
  secondary->resize(inst.size());
  for (size_t i = 0; i < inst.size(); ++i) {
    const double uncached = support::uncached(r, inst[i], tiers);
    (*scores)[i] = (static_cast<double>(inst[i].pending_prefill_tokens) + uncached) *
                   static_cast<double>(inst[i].running);
    (*secondary)[i] = uncached;
  }
}

namespace {

class LMetricPolicy final : public Policy {
 public:
  explicit LMetricPolicy(const PolicyConfig& c) : classify_(c.classify), tiers_(c.tiers) {}
  std::string_view name() const override { return "lmetric"; }
  Decision decide(const RouteRequest& r, std::span<const InstanceSnapshot> inst, Nanos) override {
    std::vector<double> scores, secondary;
    lmetric::scores(r, inst, tiers_, &scores, &secondary);
    int chosen = support::argmin(inst, scores, secondary, cursor_);
    if (chosen >= 0) cursor_ = static_cast<size_t>(chosen) + 1;
    return support::finish(r, inst, chosen, "lmetric_score", std::move(scores), classify_);
  }

 private:
  ClassifyConfig classify_;
  TierCreditConfig tiers_;
  size_t cursor_ = 0;
};

}  // namespace

namespace lmetric {
const PolicyDefinition& definition() {
  static const PolicyDefinition kDefinition{"lmetric", nullptr, &makePolicy<LMetricPolicy>};
  return kDefinition;
}
}  // namespace lmetric

}  // namespace kvf::policy
