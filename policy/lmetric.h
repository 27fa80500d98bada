// `lmetric`'s score, shared with `hybrid` (which adds a cache gate and hysteresis on top):
// (pending prefill tokens + the request's uncached tokens) x running requests. Pure.
#pragma once

#include <span>
#include <vector>

#include "policy/policy.h"

namespace kvf::policy::lmetric {

// scores[i]: the lmetric score of instance i; secondary[i]: its uncached tokens (tie-break).
// Lower-tier hits count as `tiers` credits them.
void scores(const RouteRequest& r, std::span<const InstanceSnapshot> inst,
            const TierCreditConfig& tiers, std::vector<double>* scores,
            std::vector<double>* secondary);

}  // namespace kvf::policy::lmetric
