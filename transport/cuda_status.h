// The one conversion from cudaError_t to absl::Status, for every CUDA user: the transport's
// staging, the tiers and the engine's device pool. Compiled only with CUDA (KVF_WITH_CUDA);
// stateless, any thread.
#pragma once

#include <cuda_runtime_api.h>

#include <string_view>

#include "absl/status/status.h"

namespace kvf::transport {

// OK for cudaSuccess; otherwise "<what>: <CUDA's message>" with a code by kind: out of memory
// ResourceExhausted, bad values or pointers InvalidArgument, no usable device (none, a driver
// older than the runtime) FailedPrecondition, the rest Internal.
absl::Status cudaStatus(cudaError_t error, std::string_view what);

}  // namespace kvf::transport
