// Pieces shared by the policy implementations (policy.cc: the single-mode policies;
// migration_policies.cc: unified and elastic). Internal to policy/; pure like the policies.
#pragma once

#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "common/config.h"
#include "policy/policy.h"

namespace kvf::policy::internal {

extern const double kNaN;

int64_t uncached(const RouteRequest& r, const InstanceSnapshot& s);

// Argmin over healthy instances of (score, secondary); remaining ties go to the first index at
// or after `cursor` (rotating).
int argmin(std::span<const InstanceSnapshot> inst, const std::vector<double>& score,
           const std::vector<double>& secondary, size_t cursor);

// Fills instance, reason, scores (NaN for unhealthy), predicted cached tokens (the chosen
// instance's own hits) and class.
Decision finish(const RouteRequest& r, std::span<const InstanceSnapshot> inst, int chosen,
                std::string_view reason, std::vector<double> scores, const ClassifyConfig& cc);

void parseUnifiedConfig(config::ConfigMap& map, PolicyConfig::Unified* out);
void parseElasticConfig(config::ConfigMap& map, PolicyConfig::Elastic* out);

std::unique_ptr<Policy> createHybridPolicy(const PolicyConfig& config);
std::unique_ptr<Policy> createUnifiedPolicy(const PolicyConfig& config);
std::unique_ptr<Policy> createElasticPolicy(const PolicyConfig& config);

}  // namespace kvf::policy::internal
