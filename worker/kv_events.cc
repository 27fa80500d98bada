#include "worker/kv_events.h"

namespace kvf::worker {

void VectorEventSink::onBlockStored(BlockStored event) {
  events_.emplace_back(std::in_place_type<BlockStored>, std::move(event));
}
void VectorEventSink::onBlockRemoved(BlockRemoved event) {
  events_.emplace_back(std::in_place_type<BlockRemoved>, std::move(event));
}
void VectorEventSink::onAllBlocksCleared() { events_.emplace_back(AllBlocksCleared{}); }

}  // namespace kvf::worker
