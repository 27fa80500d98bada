#include "worker/tiers/disk_format.h"

#include <bit>
#include <charconv>
#include <cstring>

#include <fmt/format.h>

#include "common/strings.h"
#include "worker/tiers/pinned_arena.h"

namespace kvf::worker {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the slot header is written in the host's byte order, which must be little-endian");

constexpr uint64_t kSlotMagic = 0x31544f4c5346564bULL;  // "KVFSLOT1"
constexpr uint32_t kFormatVersion = 1;
constexpr uint32_t kHeaderBytes = 64;
constexpr size_t kHeaderChecksumAt = 56;
constexpr std::string_view kMetaTitle = "kvfabric-disk-tier 1";

void put64(std::byte* at, uint64_t v) { std::memcpy(at, &v, 8); }
void put32(std::byte* at, uint32_t v) { std::memcpy(at, &v, 4); }
uint64_t get64(const std::byte* at) {
  uint64_t v;
  std::memcpy(&v, at, 8);
  return v;
}
uint32_t get32(const std::byte* at) {
  uint32_t v;
  std::memcpy(&v, at, 4);
  return v;
}

}  // namespace

void encodeSlotHeader(const SlotHeader& header, std::span<std::byte> sector) {
  std::byte* p = sector.data();
  put64(p, kSlotMagic);
  put32(p + 8, kFormatVersion);
  put32(p + 12, kHeaderBytes);
  put64(p + 16, header.key);
  put64(p + 24, header.payload_bytes);
  put64(p + 32, header.checksum);
  put64(p + 40, header.sequence);
  put64(p + 48, 0);
  put64(p + kHeaderChecksumAt, blockChecksum({p, kHeaderChecksumAt}));
}

std::optional<SlotHeader> decodeSlotHeader(std::span<const std::byte> sector) {
  if (sector.size() < kHeaderBytes) return std::nullopt;
  const std::byte* p = sector.data();
  if (get64(p) != kSlotMagic || get32(p + 8) != kFormatVersion || get32(p + 12) != kHeaderBytes) {
    return std::nullopt;
  }
  if (get64(p + kHeaderChecksumAt) != blockChecksum({p, kHeaderChecksumAt})) return std::nullopt;
  return SlotHeader{get64(p + 16), get64(p + 24), get64(p + 32), get64(p + 40)};
}

std::string encodeMeta(const DiskGeometry& g) {
  return strCat(kMetaTitle, "\nblock_bytes ", g.block_bytes, "\nslot_bytes ", g.slot_bytes,
                "\nslots_per_file ", g.slots_per_file, "\n");
}

absl::StatusOr<DiskGeometry> decodeMeta(std::string_view text) {
  DiskGeometry g;
  int line_no = 0;
  bool titled = false;
  while (!text.empty()) {
    size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    ++line_no;
    if (line.empty()) continue;
    if (!titled) {
      if (line != kMetaTitle) {
        return absl::InvalidArgumentError(strCat("line 1: not a kvfabric disk tier meta file"));
      }
      titled = true;
      continue;
    }
    size_t space = line.find(' ');
    std::string_view name = line.substr(0, space);
    std::string_view value = space == std::string_view::npos ? "" : line.substr(space + 1);
    uint64_t* field = name == "block_bytes"      ? &g.block_bytes
                      : name == "slot_bytes"     ? &g.slot_bytes
                      : name == "slots_per_file" ? &g.slots_per_file
                                                 : nullptr;
    auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(),
                                     field != nullptr ? *field : g.block_bytes);
    if (field == nullptr || ec != std::errc() || ptr != value.data() + value.size()) {
      return absl::InvalidArgumentError(strCat("line ", line_no, ": unexpected '", line, "'"));
    }
  }
  if (!titled || g.block_bytes == 0 || g.slot_bytes == 0 || g.slots_per_file == 0) {
    return absl::InvalidArgumentError("incomplete meta file");
  }
  return g;
}

std::string slabFileName(uint32_t index) { return fmt::format("slab-{:05d}.kvf", index); }

}  // namespace kvf::worker
