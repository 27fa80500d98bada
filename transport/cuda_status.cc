#include "transport/cuda_status.h"

#include <string>

#include "common/strings.h"

namespace kvf::transport {

absl::Status cudaStatus(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  std::string message = strCat(what, ": ", cudaGetErrorString(error));
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  if (error == cudaErrorInvalidValue || error == cudaErrorInvalidDevicePointer) {
    return absl::InvalidArgumentError(message);
  }
  if (error == cudaErrorNoDevice || error == cudaErrorInsufficientDriver ||
      error == cudaErrorInvalidDevice) {
    return absl::FailedPreconditionError(message);
  }
  return absl::InternalError(message);
}

}  // namespace kvf::transport
