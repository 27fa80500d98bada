// kvf-tier-bench's CUDA modes (tier_device_bench.cc, tier_overlap_bench.cc): the one place a
// cudaError_t becomes a message on stderr. Built only with CUDA; single-threaded.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>

namespace kvf::bench {

// True on success; else prints "what: CUDA's message" and returns false.
inline bool cudaOk(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(error));
  return false;
}

}  // namespace kvf::bench
