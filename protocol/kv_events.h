// vLLM's KV-cache events (vllm/distributed/kv_events.py): the event types with every field vLLM
// defines, and their msgpack encoding and decoding in one place. A batch is
// EventBatch{ts, events, data_parallel_rank}; an event is BlockStored, BlockRemoved or
// AllBlocksCleared, tagged by its class name. vLLM has written two layouts: positional arrays
// (msgspec array_like: [tag, field...], trailing defaults omitted) and tagged maps
// ({"type": tag, field: value...}, defaults omitted); the decoder reads both, and block hashes
// as integers or bytes (reduced to 64 bits). Decoding bounds every count: input is untrusted.
// The ZMQ framing (topic, 8-byte sequence, payload; replay end marker) is here too. Plain values
// and pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "protocol/wire_types.h"

namespace kvf::protocol {

inline constexpr std::string_view kMediumGpu = "GPU";

// Consecutive full blocks of one chain became cached. token_ids holds the tokens of every listed
// block concatenated (block_hashes.size() * block_size of them).
struct BlockStored {
  std::vector<EngineBlockHash> block_hashes;
  std::optional<EngineBlockHash> parent_block_hash;  // nullopt: the chain's first block
  std::vector<TokenId> token_ids;
  int64_t block_size = 0;
  std::optional<int64_t> lora_id;  // deprecated by vLLM in favour of lora_name
  // The tier the blocks are in ("GPU", "CPU", "DISK", ...); nullopt when the event had none.
  std::optional<std::string> medium = std::string(kMediumGpu);
  std::optional<std::string> lora_name;
  // Per block, what vLLM folded into its hash besides the tokens (multimodal ids, LoRA name,
  // cache salt, ...), each kept as the msgpack bytes of vLLM's tuple; nullopt entries are None.
  std::optional<std::vector<std::optional<std::string>>> extra_keys;
  std::optional<int64_t> group_idx;  // the KV cache group (hybrid models)
  std::optional<std::string> kv_cache_spec_kind;
  std::optional<int64_t> kv_cache_spec_sliding_window;
  bool operator==(const BlockStored&) const = default;
};

// Cached blocks left the cache (evicted or cleared).
struct BlockRemoved {
  std::vector<EngineBlockHash> block_hashes;
  std::optional<std::string> medium = std::string(kMediumGpu);
  std::optional<int64_t> group_idx;
  bool operator==(const BlockRemoved&) const = default;
};

// Every cached block of the instance is gone (published first after each start).
struct AllBlocksCleared {
  bool operator==(const AllBlocksCleared&) const = default;
};

using KvEvent = std::variant<BlockStored, BlockRemoved, AllBlocksCleared>;

struct KvEventBatch {
  double ts = 0;  // seconds since the Unix epoch
  std::vector<KvEvent> events;
  std::optional<int64_t> data_parallel_rank;
  bool operator==(const KvEventBatch&) const = default;
};

enum class KvEventLayout {
  kArray,  // positional arrays (what kvfabric's worker publishes)
  kMap,    // tagged maps
};

// The msgpack EventBatch. Optional fields that are unset are omitted as msgspec omits defaults
// (in the array layout only trailing ones; BlockStored always carries lora_id and medium).
std::string encodeEventBatch(const KvEventBatch& batch,
                             KvEventLayout layout = KvEventLayout::kArray);

struct KvEventLimits {
  size_t max_events = 1 << 16;
  size_t max_hashes = 1 << 20;  // per event
  size_t max_tokens = 1 << 24;  // per event
  size_t max_string_bytes = 256;
  size_t max_extra_key_bytes = 4096;  // one block's extra_keys entry
};

// InvalidArgument naming the field (and "event N") for anything that is not a batch in either
// layout, or exceeds `limits`. Fields unknown to this build are skipped.
absl::StatusOr<KvEventBatch> decodeEventBatch(std::string_view payload,
                                              const KvEventLimits& limits = {});

// 64 bits of a bytes block hash (vLLM's sha256 hashes): the same bytes always give the same
// value, in BlockStored and BlockRemoved alike.
EngineBlockHash engineHashFromBytes(std::string_view bytes);

// The ZMQ framing: each batch travels as [topic, seq, payload] with seq an 8-byte big-endian
// unsigned integer; a replay ends with seq = all ones (-1 signed) and an empty payload.
inline constexpr uint64_t kReplayEndSeq = ~uint64_t{0};
std::string encodeSeq(uint64_t seq);
// nullopt unless the frame is exactly 8 bytes.
std::optional<uint64_t> decodeSeq(std::string_view frame);

}  // namespace kvf::protocol
