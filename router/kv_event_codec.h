// Decoding of vLLM's KV-event batches (msgpack): the array-like encoding
// [ts, [event...], dp_rank?] with events ["BlockStored", hashes, parent, token_ids, block_size,
// lora_id, medium], ["BlockRemoved", hashes, medium], ["AllBlocksCleared"], and the newer map
// encoding ({"type": "BlockStored", "block_hashes": ...}); hashes as integers or bytes.
// Input is untrusted: every count is bounded. Pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kv_event_seq.h"
#include "policy/cache_index.h"

namespace kvf::router {

enum class KvEventKind { kBlockStored, kBlockRemoved, kAllBlocksCleared };

struct KvEvent {
  KvEventKind kind = KvEventKind::kAllBlocksCleared;
  policy::StoredBlocks stored;    // kBlockStored
  std::vector<uint64_t> removed;  // kBlockRemoved: engine hashes
  std::string medium;             // "GPU", "CPU", ... (empty when absent)
};

struct KvEventBatch {
  double ts = 0;
  std::vector<KvEvent> events;
  std::optional<int64_t> data_parallel_rank;
};

struct KvEventLimits {
  size_t max_events = 1 << 16;
  size_t max_hashes = 1 << 20;  // per event
  size_t max_tokens = 1 << 24;  // per event
};

absl::StatusOr<KvEventBatch> decodeKvEventBatch(std::string_view payload,
                                                const KvEventLimits& limits = {});

// Sequence numbers travel as 8-byte big-endian frames (common/kv_event_seq.h).
using kv_events::decodeSeq;
using kv_events::encodeSeq;
using kv_events::kReplayEndSeq;

}  // namespace kvf::router
