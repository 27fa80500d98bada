// Where a KV pool's payload bytes live when not in the pool's own host allocation: the live
// engine's device pool (engine/device_payload.h, cache.payload_memory: device) implements it
// with device memory that the host cannot address. The pool hands it every payload write and
// every self-check read, so the host never touches the region's bytes itself. Shared by the pool
// and the tiers that copy the region (shared_ptr: neither outlives it); engine thread only.
#pragma once

#include <cstddef>
#include <span>

#include "worker/kv_events.h"

namespace kvf::engine {

class PayloadMemory {
 public:
  virtual ~PayloadMemory() = default;
  // The whole region: block b's payload is bytes [b * block_bytes, (b + 1) * block_bytes).
  // Addresses only: not host-readable.
  virtual std::span<std::byte> region() = 0;
  // Writes `hash`'s payload (worker::fillBlockPayload) into `block` (a span of region()),
  // ordered before whatever the engine queues on the region afterwards; the caller does not
  // wait for it.
  virtual void write(std::span<std::byte> block, worker::BlockHash hash) = 0;
  // True when `block` holds exactly `hash`'s payload, read back after every earlier write.
  virtual bool verify(std::span<const std::byte> block, worker::BlockHash hash) = 0;
};

}  // namespace kvf::engine
