// Private pieces of DiskTier shared by disk_tier.cc (index, start, public calls) and
// disk_tier_io.cc (the I/O thread). Not for use outside those two files.
#pragma once

#include <liburing.h>

#include <cstdlib>
#include <memory>

#include "worker/tiers/disk_tier.h"

namespace kvf::worker {

struct SectorFree {
  void operator()(std::byte* p) const { std::free(p); }
};
using SectorBuffer = std::unique_ptr<std::byte, SectorFree>;
// `bytes` (a multiple of the sector) of zeroed, sector-aligned memory; null when out of memory.
SectorBuffer allocateSectors(uint64_t bytes);

struct DiskTier::WriteRequest {
  BlockKey key = 0;
  std::span<const std::byte> payload;
  uint64_t checksum = 0;
  Done done;
  Nanos enqueued = 0;
};

struct DiskTier::ReadRequest {
  BlockKey key = 0;
  int32_t slot = -1;
  uint64_t checksum = 0;
  std::span<std::byte> out;
  Done done;
  bool promotion = false;  // a read into host memory, not an onboard (counted apart)
};

// One block's I/O in flight. A write is two requests (its header sector and its payload, at
// their two places in the slab file); a read is the payload alone.
struct DiskTier::Op {
  enum class Kind : uint8_t { kWrite, kRead };
  Kind kind = Kind::kWrite;
  BlockKey key = 0;
  int32_t slot = -1;
  uint64_t checksum = 0;
  std::span<std::byte> out;  // reads: the caller's memory
  Done done;
  bool promotion = false;  // reads: into host memory (TieredStore::promote), not an onboard
  SectorBuffer header;     // one sector
  SectorBuffer bounce;     // padded payload, allocated when a caller's buffer does not fit O_DIRECT
  bool bounced = false;
  std::byte* payload = nullptr;  // what the payload request reads from or writes to
  uint32_t payload_len = 0;      // bytes the payload request must move
  int remaining = 0;             // requests not completed yet
  int header_result = 0;
  int payload_result = 0;
  Nanos submitted = 0;
};

// The tag in a completion's user data that marks a write's header request (ops are aligned).
inline constexpr uintptr_t kHeaderTag = 1;

struct DiskTier::Ring {
  io_uring ring{};
  uint64_t wake_value = 0;  // target of the eventfd read that wakes the I/O thread
  ~Ring() { io_uring_queue_exit(&ring); }
};

}  // namespace kvf::worker
