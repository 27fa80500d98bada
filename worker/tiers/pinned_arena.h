// Page-locked host memory for the host tier, and the block checksum both tiers keep. With CUDA
// (KVF_WITH_CUDA) and a device present the arena is CUDA-pinned (cudaHostAlloc), so a GPU copies
// into it by DMA; otherwise it is anonymous memory locked with mlock. The arena owns its memory;
// the functions are stateless and safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvf::worker {

// What the arena must get. kRequired fails create() when the memory cannot be locked;
// kPreferred falls back to ordinary (pre-faulted) memory and says so in kind().
enum class PinMode : uint8_t { kRequired, kPreferred, kOff };

enum class PinKind : uint8_t { kCudaHost, kMlock, kNone };
std::string_view pinKindName(PinKind kind);

class PinnedArena {
 public:
  // `bytes` is rounded up to the page size; the memory starts page-aligned and zeroed.
  static absl::StatusOr<std::unique_ptr<PinnedArena>> create(uint64_t bytes, PinMode mode);
  ~PinnedArena();
  PinnedArena(const PinnedArena&) = delete;
  PinnedArena& operator=(const PinnedArena&) = delete;

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  PinKind kind() const { return kind_; }

 private:
  PinnedArena(std::byte* data, uint64_t size, PinKind kind)
      : data_(data), size_(size), kind_(kind) {}

  std::byte* data_;
  uint64_t size_;
  PinKind kind_;
};

// xxh3-64 of a block's payload: the checksum every tier stores beside a block.
uint64_t blockChecksum(std::span<const std::byte> bytes);

// Copies `src` to `dst` (same size) and returns blockChecksum(src), in one pass: each chunk is
// hashed while it is still in cache, so the checksum costs little beyond the copy.
uint64_t copyWithChecksum(std::span<std::byte> dst, std::span<const std::byte> src);

}  // namespace kvf::worker
