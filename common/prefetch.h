// prefetchLine: start loading the cache line holding `p` (for the read that follows soon).
// forEachPrefetched: a loop over a run of random accesses that keeps several misses in flight.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <type_traits>

namespace kvf {

// An asm statement, not __builtin_prefetch: GCC 12 silently dropped the builtin from some
// inlined loops (the cache index's addSoft / removal / store runs, the simulator's step end).
inline void prefetchLine(const void* p) {
#if defined(__x86_64__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p);
#endif
}

// f(item) for each of `items` in order, with prefetch(item) called `ahead` items earlier: the
// first `ahead` up front, then one per step. For runs whose items each touch a random line (a
// table slot, a block record), so the misses overlap instead of queueing. When f returns bool,
// false ends the loop (the items after it may have been prefetched for nothing).
template <class T, class Prefetch, class F>
void forEachPrefetched(std::span<const T> items, size_t ahead, Prefetch&& prefetch, F&& f) {
  const size_t n = items.size();
  for (size_t i = 0; i < std::min(n, ahead); ++i) prefetch(items[i]);
  for (size_t i = 0; i < n; ++i) {
    if (i + ahead < n) prefetch(items[i + ahead]);
    if constexpr (std::is_same_v<std::invoke_result_t<F&, const T&>, bool>) {
      if (!f(items[i])) return;
    } else {
      f(items[i]);
    }
  }
}

}  // namespace kvf
