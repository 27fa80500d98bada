// Deterministic KV payload content: the bytes a cached block holds are a pure function of its
// block hash, so a transfer or reuse bug shows up byte for byte. Stateless; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "worker/kv_events.h"

namespace kvf::worker {

// Fills `out` with the payload of the block whose hash is `hash`.
void fillBlockPayload(BlockHash hash, std::span<std::byte> out);
// True when `bytes` is exactly the payload of `hash`.
bool verifyBlockPayload(BlockHash hash, std::span<const std::byte> bytes);

}  // namespace kvf::worker
