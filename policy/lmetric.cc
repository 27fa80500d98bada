// `lmetric`: argmin of (pending prefill tokens + new uncached tokens) x running requests, no
// affinity; the uncached term gives it an implicit soft affinity.
#include "policy/lmetric.h"

#include "policy/policy_support.h"
#include "policy/registry.h"

namespace kvf::policy {

void lmetric::scores(const RouteRequest& r, std::span<const InstanceSnapshot> inst,
                     std::vector<double>* scores, std::vector<double>* secondary) {
  scores->resize(inst.size());
  secondary->resize(inst.size());
  for (size_t i = 0; i < inst.size(); ++i) {
    double prefill =
        static_cast<double>(inst[i].pending_prefill_tokens + support::uncached(r, inst[i]));
    (*scores)[i] = prefill * static_cast<double>(inst[i].running);
    (*secondary)[i] = static_cast<double>(support::uncached(r, inst[i]));
  }
}

namespace {

class LMetricPolicy final : public Policy {
 public:
  explicit LMetricPolicy(const PolicyConfig& c) : classify_(c.classify) {}
  std::string_view name() const override { return "lmetric"; }
  Decision decide(const RouteRequest& r, std::span<const InstanceSnapshot> inst, Nanos) override {
    std::vector<double> scores, secondary;
    lmetric::scores(r, inst, &scores, &secondary);
    int chosen = support::argmin(inst, scores, secondary, cursor_);
    if (chosen >= 0) cursor_ = static_cast<size_t>(chosen) + 1;
    return support::finish(r, inst, chosen, "lmetric_score", std::move(scores), classify_);
  }

 private:
  ClassifyConfig classify_;
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
