// The packed remote key a receiver hands to a sender (MemoryRegion::packedRkey()): UCX's packed
// rkey wrapped with the registered region's bounds, so that a sender can check every remote
// address and length against the region before any UCX call, and can reject a malformed key
// before UCX parses it (UCX's unpack trusts its input: a damaged key crashes it, and a crafted
// shared-memory key makes it attach a segment of the sender's choosing). Value types and pure
// functions; safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvf::transport {

struct RemoteKey {
  uint64_t base = 0;    // remote address of the region's first byte
  uint64_t length = 0;  // region bytes
  std::string ucx;      // ucp_rkey_pack's bytes
  uint64_t md_map = 0;  // the memory domains the UCX key names (bit i: domain i)
  uint8_t mem_type = 0;

  // True when [addr, addr + len) lies inside the region (len > 0).
  bool contains(uint64_t addr, uint64_t len) const {
    return len > 0 && addr >= base && len <= length && addr - base <= length - len;
  }
};

// Largest UCX packed rkey accepted (UCX 1.13 packs tens to a few hundred bytes).
inline constexpr size_t kMaxUcxRkeyBytes = 4096;

// Wraps a UCX packed rkey with the region bounds.
std::string packRemoteKey(uint64_t base, uint64_t length, std::string_view ucx);

// Parses bytes from a peer (not trusted): magic, version, every length, the region bounds (no
// overflow), and the UCX key's own layout (UCX 1.13: 64-bit memory-domain map, memory type, then
// one length-prefixed key per domain in the map), all inside the buffer. InvalidArgument naming
// what is wrong otherwise.
absl::StatusOr<RemoteKey> parseRemoteKey(std::string_view bytes);

}  // namespace kvf::transport
