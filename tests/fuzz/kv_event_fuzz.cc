// Fuzz target: the router's decoder of vLLM KV-event batches (router/kv_event_codec.h), fed
// one ZMQ payload (msgpack) as a hostile engine could send it. Properties: no crash, no
// unbounded allocation, and a decoded batch within the limits it was given.
#include <cstdint>
#include <string_view>

#include "router/kv_event_codec.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view payload(reinterpret_cast<const char*>(data), size);
  kvf::router::KvEventLimits limits;
  auto batch = kvf::router::decodeKvEventBatch(payload, limits);
  if (!batch.ok()) return 0;
  KVF_FUZZ_CHECK(batch->events.size() <= limits.max_events, "events past the limit");
  for (const auto& event : batch->events) {
    KVF_FUZZ_CHECK(event.removed.size() <= limits.max_hashes, "removed hashes past the limit");
    KVF_FUZZ_CHECK(event.stored.engine_hashes.size() <= limits.max_hashes,
                   "stored hashes past the limit");
    KVF_FUZZ_CHECK(event.stored.token_ids.size() <= limits.max_tokens, "tokens past the limit");
  }
  return 0;
}
