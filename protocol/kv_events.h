// vLLM's KV-cache events (vllm/distributed/kv_events.py): the event types with every field vLLM
// defines, and their msgpack encoding and decoding in one place. A batch is
// EventBatch{ts, events, data_parallel_rank}; an event is BlockStored, BlockRemoved or
// AllBlocksCleared, tagged by its class name. vLLM has written two layouts: positional arrays
// (msgspec array_like: [tag, field...], trailing defaults omitted) and tagged maps
// ({"type": tag, field: value...}, defaults omitted); the decoder reads both by shape, not by
// version, and block hashes as integers (signed or unsigned) or bytes (their last 8 bytes, as
// vLLM's own int form). An unknown event type or field is skipped and counted, never the batch.
// Decoding bounds every count, per event and per batch: input is untrusted.
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
  std::optional<std::string> locality;  // "LOCAL" / "REMOTE" for secondary tiers (map events)
  bool operator==(const BlockStored&) const = default;
};

// Cached blocks left the cache (evicted or cleared).
struct BlockRemoved {
  std::vector<EngineBlockHash> block_hashes;
  std::optional<std::string> medium = std::string(kMediumGpu);
  std::optional<int64_t> group_idx;
  std::optional<std::string> locality;
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
  // What the decoder skipped: events of a type this build does not know, and fields of known
  // events (map keys, or array elements past the last known position) it does not know.
  uint32_t skipped_events = 0;
  uint32_t ignored_fields = 0;
  // The batch's content; what the decoder skipped is not part of it (it does not survive an
  // encode and decode).
  bool operator==(const KvEventBatch& o) const {
    return ts == o.ts && events == o.events && data_parallel_rank == o.data_parallel_rank;
  }
};

enum class KvEventLayout {
  kArray,  // positional arrays (what kvfabric's worker publishes)
  kMap,    // tagged maps
};

// The msgpack EventBatch. Optional fields that are unset are omitted as msgspec omits defaults
// (in the array layout only trailing ones; BlockStored always carries lora_id and medium). An
// event with `locality` is written as a map even in the array layout: vLLM has that field only
// in map events, and no position for it.
std::string encodeEventBatch(const KvEventBatch& batch,
                             KvEventLayout layout = KvEventLayout::kArray);

struct KvEventLimits {
  size_t max_events = 1 << 16;
  size_t max_hashes = 1 << 20;  // per event
  size_t max_tokens = 1 << 24;  // per event
  // Per batch, over all its events: what one batch can make a reader allocate.
  size_t max_batch_hashes = 1 << 20;
  size_t max_batch_tokens = 1 << 22;
  size_t max_string_bytes = 256;
  size_t max_extra_key_bytes = 4096;  // one block's extra_keys entry
};

// InvalidArgument naming the field (and "event N") for anything that is not a batch in either
// layout, or exceeds `limits`. Fields unknown to this build are skipped.
absl::StatusOr<KvEventBatch> decodeEventBatch(std::string_view payload,
                                              const KvEventLimits& limits = {});

// 64 bits of a bytes block hash (vLLM's sha256 hashes): the last 8 bytes, big-endian (shorter
// input: all of it), which is exactly the int vLLM publishes for the same hash with
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, so a tier's bytes events and the GPU's int events name
// one block alike.
EngineBlockHash engineHashFromBytes(std::string_view bytes);

// ---- extra keys (what vLLM folds into a block's hash besides its tokens) ----

// A 64-bit digest of one extra_keys entry (one msgpack value: vLLM's tuple), by structure, not
// by bytes: two encoders that size a string or an int differently give the same digest, a str
// and a bytes value of equal content do not. Never 0 (0 means "no extra keys"); 0 for input that
// is not one well-formed value (or nests deeper than 8).
uint64_t extraKeysDigest(std::string_view msgpack_value);

// One multimodal item of a request: the identifier vLLM's processor gives it (its hash), where
// it starts in the prompt and how many tokens it covers.
struct MultimodalItem {
  std::string identifier;
  int64_t offset = 0;
  int64_t length = 0;
};

// The request-side inputs of vLLM's extra keys (generate_block_hash_extra_keys).
struct ExtraKeyInputs {
  std::string lora_name;  // empty: the base model
  std::vector<MultimodalItem> mm_items;
  std::string cache_salt;  // empty: none
  bool empty() const { return lora_name.empty() && mm_items.empty() && cache_salt.empty(); }
};

// The msgpack tuple vLLM (v0.19+) hashes with the block of `block_size` tokens starting at
// `block_start`: (lora_name?, (identifier, offset - block_start) per overlapping item...,
// cache_salt if block_start == 0); nullopt where vLLM's tuple would be None (nothing applies).
std::optional<std::string> encodeExtraKeys(const ExtraKeyInputs& inputs, int64_t block_start,
                                           int64_t block_size);

// The msgpack tuple (lora_name,): what vLLM folds into every block of a LoRA request when its
// events (before extra_keys were published) carry only lora_name.
std::string encodeLoraOnlyExtraKeys(std::string_view lora_name);
// The tuple (lora_id,): older vLLM folded the adapter's int id, and its events carry only it.
std::string encodeLoraIdOnlyExtraKeys(int64_t lora_id);

// The ZMQ framing: each batch travels as [topic, seq, payload] with seq an 8-byte big-endian
// unsigned integer; a replay ends with seq = all ones (-1 signed) and an empty payload.
inline constexpr uint64_t kReplayEndSeq = ~uint64_t{0};
std::string encodeSeq(uint64_t seq);
// nullopt unless the frame is exactly 8 bytes.
std::optional<uint64_t> decodeSeq(std::string_view frame);

}  // namespace kvf::protocol
