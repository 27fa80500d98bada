// The one conversion from UCX's ucs_status_t to absl::Status (STYLE.md: each foreign error type
// is converted in exactly one function). Stateless; safe from any thread.
#pragma once

#include <string_view>

#include <ucs/type/status.h>

#include "absl/status/status.h"

namespace kvf::transport {

// Maps `status` to an absl::Status whose message is "<what>: <UCX error string>".
// UCS_OK maps to OkStatus(); UCS_INPROGRESS is a programming error and maps to kInternal.
absl::Status ucsToStatus(ucs_status_t status, std::string_view what);

}  // namespace kvf::transport
