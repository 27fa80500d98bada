// prefetchLine: start loading the cache line holding `p` (for the read that follows soon).
#pragma once

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

}  // namespace kvf
