// Pieces the policy implementations share: the argmin with rotating ties, the common tail of a
// decision, and the overload test against the average. Pure like the policies; for policy
// files (built in or not), not for drivers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "policy/policy.h"

namespace kvf::policy::support {

extern const double kNaN;

// Prompt tokens the instance does not hold: prompt - effective hits (GPU hits plus the credit
// of its lower-tier run, tiers::effectiveHits), at least 0.
// Inline: decide() runs it per instance (1,024 of them on a large cluster).
double uncachedWithRun(const RouteRequest& r, const InstanceSnapshot& s,
                       const TierCreditConfig& tiers);
inline double uncached(const RouteRequest& r, const InstanceSnapshot& s,
                       const TierCreditConfig& tiers) {
  if (s.cpu_tokens == 0 && s.disk_tokens == 0) [[likely]] {
    return static_cast<double>(std::max<int64_t>(0, r.prompt_tokens - s.matched_tokens));
  }
  return uncachedWithRun(r, s, tiers);
}

// Argmin over healthy instances of (score, secondary); remaining ties go to the first index at
// or after `cursor` modulo the instance count (rotating), so equal instances share work
// deterministically. -1 when no instance is healthy.
int argmin(std::span<const InstanceSnapshot> inst, const std::vector<double>& score,
           const std::vector<double>& secondary, size_t cursor);

// Fills instance, reason ("no_healthy_instance" when chosen < 0), scores (NaN for unhealthy),
// predicted cached tokens (the chosen instance's own hits, at most the prompt) and class.
Decision finish(const RouteRequest& r, std::span<const InstanceSnapshot> inst, int chosen,
                std::string_view reason, std::vector<double> scores, const ClassifyConfig& cc);

// The same for scores whose unhealthy instances are NaN already.
Decision finishMarked(const RouteRequest& r, std::span<const InstanceSnapshot> inst, int chosen,
                      std::string_view reason, std::vector<double> scores,
                      const ClassifyConfig& cc);

// Average `running` over healthy instances (0 when none is).
double averageRunning(std::span<const InstanceSnapshot> inst);

// Whether an instance running `running` requests is overloaded against `average`: at least
// `min_running` and more than factor x average.
inline bool overloaded(int64_t running, double average, double factor, int64_t min_running) {
  return running >= min_running && static_cast<double>(running) > factor * average;
}

}  // namespace kvf::policy::support
