// The router's view of a KV-event batch: protocol::decodeEventBatch (protocol/kv_events.h, the
// one decoder of vLLM's formats) turned into what the cache index takes - BlockStored as
// policy::StoredBlocks (extra keys as per-block digests: the event's extra_keys, else its
// lora_name or lora_id alone), BlockRemoved as raw engine hashes - with the tier and the KV
// cache group each event names.
// Input is untrusted: every count is bounded by the decoder. Pure; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "policy/cache_index.h"
#include "protocol/kv_events.h"

namespace kvf::router {

enum class KvEventKind { kBlockStored, kBlockRemoved, kAllBlocksCleared };

struct KvEvent {
  KvEventKind kind = KvEventKind::kAllBlocksCleared;
  policy::StoredBlocks stored;    // kBlockStored
  std::vector<uint64_t> removed;  // kBlockRemoved: engine hashes
  std::string medium;             // "GPU", "CPU", ... (empty when absent)
  std::optional<int64_t> group_idx;
  std::string cache_spec_kind;  // BlockStored's kv_cache_spec_kind (empty when absent)
};

struct KvEventBatch {
  double ts = 0;
  std::vector<KvEvent> events;
  std::optional<int64_t> data_parallel_rank;
  uint32_t skipped_events = 0;  // unknown event types
  uint32_t ignored_fields = 0;  // unknown fields of known events
};

// Whether a KV cache group of this kind decides prefix reuse (full attention and its variants);
// sliding-window, Mamba and other groups do not, and are not indexed.
bool decidesPrefixReuse(std::string_view cache_spec_kind);

using protocol::KvEventLimits;

absl::StatusOr<KvEventBatch> decodeKvEventBatch(std::string_view payload,
                                                const KvEventLimits& limits = {});

// Sequence numbers travel as 8-byte big-endian frames (protocol/kv_events.h).
using protocol::decodeSeq;
using protocol::encodeSeq;
using protocol::kReplayEndSeq;

}  // namespace kvf::router
