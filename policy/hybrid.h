// `hybrid` as a base for other policies (`elastic` places requests with it, then decides
// whether to offload the prefill). Pure.
#pragma once

#include <memory>

#include "policy/policy.h"

namespace kvf::policy::hybrid {

// A hybrid policy with config's classify, session and `hybrid:` settings.
std::unique_ptr<Policy> create(const PolicyConfig& config);

}  // namespace kvf::policy::hybrid
