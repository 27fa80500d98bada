// `least_request`: fewest requests running + waiting; ties: fewer pending prefill tokens, then
// a rotating cursor. Ignores the cache.
#include "policy/policy_support.h"
#include "policy/registry.h"

namespace kvf::policy {
namespace {

class LeastRequestPolicy final : public Policy {
 public:
  explicit LeastRequestPolicy(const PolicyConfig& c) : classify_(c.classify) {}
  std::string_view name() const override { return "least_request"; }
  Decision decide(const RouteRequest& r, std::span<const InstanceSnapshot> inst, Nanos) override {
    std::vector<double> scores(inst.size()), secondary(inst.size());
    for (size_t i = 0; i < inst.size(); ++i) {
      scores[i] = static_cast<double>(inst[i].running + inst[i].waiting);
      secondary[i] = static_cast<double>(inst[i].pending_prefill_tokens);
    }
    int chosen = support::argmin(inst, scores, secondary, cursor_);
    if (chosen >= 0) cursor_ = static_cast<size_t>(chosen) + 1;
    return support::finish(r, inst, chosen, "least_request", std::move(scores), classify_);
  }

 private:
  ClassifyConfig classify_;
  size_t cursor_ = 0;
};

}  // namespace

namespace least_request {
const PolicyDefinition& definition() {
  static const PolicyDefinition kDefinition{"least_request", nullptr,
                                            &makePolicy<LeastRequestPolicy>};
  return kDefinition;
}
}  // namespace least_request

}  // namespace kvf::policy
