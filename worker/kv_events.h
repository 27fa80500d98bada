// KV-cache events in vLLM's wire format (BlockStored / BlockRemoved / AllBlocksCleared) and the
// sink interface through which an engine core reports them. Encoding is msgpack (msgpuck), no
// sockets: the ZMQ publisher lives in kv_event_publisher.h and a simulator can capture events
// in-process with any KvEventSink. Plain values; encoding functions are stateless and thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "common/kv_event_seq.h"

namespace kvf::worker {

using BlockHash = uint64_t;
using TokenId = int64_t;

// Consecutive full blocks of one chain became cached. parent_block_hash is the hash of the
// block before the first one (nullopt for the chain's first block). token_ids holds the tokens
// of every listed block concatenated (size == block_hashes.size() * block_size).
struct BlockStored {
  std::vector<BlockHash> block_hashes;
  std::optional<BlockHash> parent_block_hash;
  std::vector<TokenId> token_ids;
  int block_size = 0;
};

// Cached blocks left the cache (evicted or cleared).
struct BlockRemoved {
  std::vector<BlockHash> block_hashes;
};

// Every cached block of this instance is gone (published first after each start).
struct AllBlocksCleared {};

using KvEvent = std::variant<BlockStored, BlockRemoved, AllBlocksCleared>;

// Receives events in the order the cache changed. Called on the thread that owns the cache
// (the engine loop); implementations must not block.
class KvEventSink {
 public:
  virtual ~KvEventSink() = default;
  virtual void onBlockStored(BlockStored event) = 0;
  virtual void onBlockRemoved(BlockRemoved event) = 0;
  virtual void onAllBlocksCleared() = 0;
};

// Collects events in memory (the simulator, tests, and the live loop's per-step buffer).
class VectorEventSink final : public KvEventSink {
 public:
  void onBlockStored(BlockStored event) override;
  void onBlockRemoved(BlockRemoved event) override;
  void onAllBlocksCleared() override;
  std::vector<KvEvent>& events() { return events_; }
  std::vector<KvEvent> take() { return std::exchange(events_, {}); }

 private:
  std::vector<KvEvent> events_;
};

// msgpack EventBatch as vLLM encodes it (msgspec array_like): [ts, [event, ...]], each event an
// array starting with its tag; medium is "GPU" and lora_id nil.
std::string encodeEventBatch(double timestamp_s, const std::vector<KvEvent>& events);

// Sequence numbers on the wire and the replay end marker (common/kv_event_seq.h).
using kv_events::decodeSeq;
using kv_events::encodeSeq;
using kv_events::kReplayEndSeq;

}  // namespace kvf::worker
