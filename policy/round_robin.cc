// `round_robin`: the next admitted instance after the last one chosen; ignores load and cache.
#include "policy/policy_support.h"
#include "policy/registry.h"

namespace kvf::policy {
namespace {

class RoundRobinPolicy final : public Policy {
 public:
  explicit RoundRobinPolicy(const PolicyConfig& c) : classify_(c.classify) {}
  std::string_view name() const override { return "round_robin"; }
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
    return support::finish(r, inst, chosen, "round_robin", std::move(scores), classify_);
  }

 private:
  ClassifyConfig classify_;
  size_t cursor_ = 0;
};

}  // namespace

namespace round_robin {
const PolicyDefinition& definition() {
  static const PolicyDefinition kDefinition{"round_robin", nullptr, &makePolicy<RoundRobinPolicy>};
  return kDefinition;
}
}  // namespace round_robin

}  // namespace kvf::policy
