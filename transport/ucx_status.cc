#include "transport/ucx_status.h"

#include <string>

#include "common/strings.h"

namespace kvf::transport {

absl::Status ucsToStatus(ucs_status_t status, std::string_view what) {
  if (status == UCS_OK) return absl::OkStatus();
  std::string message = strCat(what, ": ", ucs_status_string(status));
  switch (status) {
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_EXCEEDS_LIMIT:
    case UCS_ERR_NO_RESOURCE:
      return absl::ResourceExhaustedError(message);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
    case UCS_ERR_OUT_OF_RANGE:
    case UCS_ERR_MESSAGE_TRUNCATED:
      return absl::InvalidArgumentError(message);
    case UCS_ERR_UNSUPPORTED:
    case UCS_ERR_NO_DEVICE:
      return absl::UnimplementedError(message);
    case UCS_ERR_CANCELED:
      return absl::CancelledError(message);
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT:
      return absl::DeadlineExceededError(message);
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_SHMEM_SEGMENT:
    case UCS_ERR_BUSY:
      return absl::UnavailableError(message);
    case UCS_ERR_NO_ELEM:
      return absl::NotFoundError(message);
    case UCS_ERR_ALREADY_EXISTS:
      return absl::AlreadyExistsError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace kvf::transport
