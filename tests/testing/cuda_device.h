// Whether the gpu-labelled tests have a device: empty when one is usable, else CUDA's reason (no
// device, or a driver older than the runtime this was built with), which the skip message
// carries. Header-only; CUDA builds only.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include <gtest/gtest.h>

namespace kvf::testing {

inline std::string whyNoCudaDevice() {
  int devices = 0;
  cudaError_t error = cudaGetDeviceCount(&devices);
  if (error != cudaSuccess) {
    cudaGetLastError();  // not sticky: later calls see a clean state
    return cudaGetErrorString(error);
  }
  return devices > 0 ? "" : "no CUDA device";
}

}  // namespace kvf::testing

#define KVF_SKIP_WITHOUT_CUDA_DEVICE()                                             \
  if (std::string kvf_why_ = ::kvf::testing::whyNoCudaDevice(); !kvf_why_.empty()) \
  GTEST_SKIP() << kvf_why_
