// Shared by the benchmark binaries: the q-quantile of raw samples, taken as the sample at
// index floor(q * (n - 1)) of the sorted values (0 for no samples). Header-only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace kvf::bench {

inline double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

}  // namespace kvf::bench
