// Base64 (RFC 4648, standard alphabet, padded) for the opaque UCX worker addresses and packed
// remote keys that the control API carries in JSON. Stateless; safe from any thread.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvf::transport {

std::string base64Encode(std::string_view bytes);

// Decodes padded base64; rejects bad characters, bad padding and lengths not a multiple of 4,
// naming the offending position. `max_decoded` bounds the output (peers are not trusted).
absl::StatusOr<std::string> base64Decode(std::string_view text, size_t max_decoded = 1 << 20);

}  // namespace kvf::transport
