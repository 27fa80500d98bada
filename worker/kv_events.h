// The sink interface through which an engine core reports KV-cache events, in vLLM's event types
// (protocol/kv_events.h holds the types and their encoding). No sockets: the ZMQ publisher lives
// in kv_event_publisher.h, and a simulator can capture events in-process with any KvEventSink.
// Plain values; safe from any thread except where a sink says otherwise.
#pragma once

#include <utility>
#include <vector>

#include "protocol/kv_events.h"
#include "protocol/wire_types.h"

namespace kvf::worker {

// The engine's block hash and the token id (protocol/wire_types.h).
using BlockHash = protocol::EngineBlockHash;
using protocol::TokenId;

using protocol::AllBlocksCleared;
using protocol::BlockRemoved;
using protocol::BlockStored;
using protocol::KvEvent;

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

}  // namespace kvf::worker
