// Shared by the benchmark binaries: the q-quantile of raw samples, taken as the sample at
// index floor(q * (n - 1)) of the sorted values (0 for no samples), and a sample buffer whose
// pages are touched before the timed loop. Header-only.
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

// Room for n samples with every page already faulted in: reserve() alone leaves the pages
// untouched, so push_back inside a timed loop would take a page fault every 512 samples.
inline void reserveTouched(std::vector<double>& v, size_t n) {
  v.clear();
  v.resize(n);
  v.clear();
}

}  // namespace kvf::bench
