// Fuzz target: the decoder of vLLM KV-event batches (protocol/kv_events.h) and the router's view
// of them (router/kv_event_codec.h), fed one ZMQ payload (msgpack) as a hostile engine could
// send it. Properties: no crash, no unbounded allocation, a decoded batch within the limits it
// was given, the router accepting exactly what the protocol decoder accepts, and a decoded batch
// encoding (in both layouts) to bytes that decode back to the same batch.
#include <cstdint>
#include <string_view>
#include <variant>

#include "protocol/kv_events.h"
#include "router/kv_event_codec.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace kvf::protocol;

void checkLimits(const KvEventBatch& batch, const KvEventLimits& limits) {
  KVF_FUZZ_CHECK(batch.events.size() <= limits.max_events, "events past the limit");
  for (const KvEvent& event : batch.events) {
    if (const auto* stored = std::get_if<BlockStored>(&event)) {
      KVF_FUZZ_CHECK(stored->block_hashes.size() <= limits.max_hashes,
                     "stored hashes past the limit");
      KVF_FUZZ_CHECK(stored->token_ids.size() <= limits.max_tokens, "tokens past the limit");
    } else if (const auto* removed = std::get_if<BlockRemoved>(&event)) {
      KVF_FUZZ_CHECK(removed->block_hashes.size() <= limits.max_hashes,
                     "removed hashes past the limit");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view payload(reinterpret_cast<const char*>(data), size);
  KvEventLimits limits;
  limits.max_events = 256;  // small, so the fuzzer reaches the bounds
  limits.max_hashes = 1024;
  limits.max_tokens = 4096;
  auto batch = decodeEventBatch(payload, limits);
  auto routed = kvf::router::decodeKvEventBatch(payload, limits);
  KVF_FUZZ_CHECK(batch.ok() == routed.ok(), "router and protocol decoders disagree");
  if (!batch.ok()) return 0;
  checkLimits(*batch, limits);
  KVF_FUZZ_CHECK(routed->events.size() == batch->events.size(), "router lost events");
  if (!(*batch == *batch)) return 0;  // a NaN timestamp compares unequal to itself
  for (KvEventLayout layout : {KvEventLayout::kArray, KvEventLayout::kMap}) {
    auto again = decodeEventBatch(encodeEventBatch(*batch, layout), limits);
    KVF_FUZZ_CHECK(again.ok(), "a decoded batch does not decode after encoding");
    KVF_FUZZ_CHECK(*again == *batch, "batch changed in a round trip");
  }
  return 0;
}
