// The `tiers:` section of a YAML config (docs/tiers.md lists every key): host memory, optional
// local disk, the write policy and the lossless switches, parsed into TieredStoreOptions. The
// block size is not configured here: the engine's geometry sets host.block_bytes. Stateless;
// thread-safe.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "common/config.h"
#include "worker/tiers/tiered_store.h"

namespace kvf::worker {

// Reads the keys of one `tiers:` mapping into `out`, recording every problem in m's errors.
void parseTierConfig(config::ConfigMap& m, TieredStoreOptions* out);

// A whole YAML document that is one `tiers:` mapping's contents (tests, kvf-tier-bench).
absl::StatusOr<TieredStoreOptions> parseTierConfigText(std::string_view text,
                                                       std::string_view source);

}  // namespace kvf::worker
