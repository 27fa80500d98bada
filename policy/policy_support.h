// Pieces the policy implementations share: the argmin with rotating ties, the common tail of a
// decision, and the overload test against the average. Pure like the policies; for policy
// files (built in or not), not for drivers.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "policy/policy.h"

namespace kvf::policy::support {

extern const double kNaN;

// Prompt tokens the instance does not hold: prompt - effective hits (GPU hits plus the credit
// of its lower-tier run, tiers::effectiveHits), at least 0.
double uncached(const RouteRequest& r, const InstanceSnapshot& s, const TierCreditConfig& tiers);

// Argmin over healthy instances of (score, secondary); remaining ties go to the first index at
// or after `cursor` modulo the instance count (rotating), so equal instances share work
// deterministically. -1 when no instance is healthy.
int argmin(std::span<const InstanceSnapshot> inst, const std::vector<double>& score,
           const std::vector<double>& secondary, size_t cursor);

// Fills instance, reason ("no_healthy_instance" when chosen < 0), scores (NaN for unhealthy),
// predicted cached tokens (the chosen instance's own hits, at most the prompt) and class.
Decision finish(const RouteRequest& r, std::span<const InstanceSnapshot> inst, int chosen,
                std::string_view reason, std::vector<double> scores, const ClassifyConfig& cc);

// Average `running` over healthy instances (0 when none is).
double averageRunning(std::span<const InstanceSnapshot> inst);

// Whether an instance running `running` requests is overloaded against `average`: at least
// `min_running` and more than factor x average.
inline bool overloaded(int64_t running, double average, double factor, int64_t min_running) {
  return running >= min_running && static_cast<double>(running) > factor * average;
}

}  // namespace kvf::policy::support
