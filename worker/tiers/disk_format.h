// The disk tier's on-disk format. A tier directory holds slab files (slab-00000.kvf, ...) cut into
// fixed slots, a meta file naming the geometry, and a lock file. A slab file starts with one 4 KiB
// header sector per slot, then the slots' payloads, each rounded up to 4 KiB: every I/O is
// sector-aligned for O_DIRECT, and payloads written one after another lie one after another (a
// prefix read back is a sequential read). The header names the block, its payload checksum and a
// write sequence number, and checks itself, so a restart can rebuild the index from the header
// sectors alone and a torn or stale slot is recognised. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "worker/tiers/tier_types.h"

namespace kvf::worker {

inline constexpr uint64_t kDiskSector = 4096;

inline constexpr uint64_t roundUpToSector(uint64_t bytes) {
  return (bytes + kDiskSector - 1) / kDiskSector * kDiskSector;
}
// Bytes one block occupies in a slab file: header sector plus padded payload.
inline constexpr uint64_t diskSlotBytes(uint64_t block_bytes) {
  return kDiskSector + roundUpToSector(block_bytes);
}

// Where slot `index` of a slab file cut into `slots_per_file` slots keeps its header and payload.
inline constexpr uint64_t headerOffset(uint64_t index) { return index * kDiskSector; }
inline constexpr uint64_t payloadOffset(uint64_t index, uint64_t slots_per_file,
                                        uint64_t padded_bytes) {
  return slots_per_file * kDiskSector + index * padded_bytes;
}
// The size of a slab file holding `slots` slots (the last file of a tier may hold fewer).
inline constexpr uint64_t slabFileBytes(uint64_t slots, uint64_t slots_per_file,
                                        uint64_t padded_bytes) {
  return slots_per_file * kDiskSector + slots * padded_bytes;
}

struct SlotHeader {
  BlockKey key = 0;
  uint64_t payload_bytes = 0;
  uint64_t checksum = 0;  // xxh3-64 of the payload
  uint64_t sequence = 0;  // write order: at a rebuild the newest copy of a key wins
};

// Writes the header into the first bytes of `sector` (at least 64 bytes; the rest untouched).
void encodeSlotHeader(const SlotHeader& header, std::span<std::byte> sector);
// nullopt unless `sector` starts with a well-formed header whose own checksum holds.
std::optional<SlotHeader> decodeSlotHeader(std::span<const std::byte> sector);

// The geometry a tier directory was written with; a rebuild needs an exact match.
struct DiskGeometry {
  uint64_t block_bytes = 0;
  uint64_t slot_bytes = 0;
  uint64_t slots_per_file = 0;

  friend bool operator==(const DiskGeometry&, const DiskGeometry&) = default;
};

std::string encodeMeta(const DiskGeometry& geometry);
// InvalidArgument naming the first line that is not part of the format.
absl::StatusOr<DiskGeometry> decodeMeta(std::string_view text);

inline constexpr std::string_view kMetaFileName = "kvf-tier.meta";
inline constexpr std::string_view kLockFileName = "kvf-tier.lock";
// "slab-00042.kvf"
std::string slabFileName(uint32_t index);

}  // namespace kvf::worker
