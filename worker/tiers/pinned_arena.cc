#include "worker/tiers/pinned_arena.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#if defined(KVF_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

#include "common/log.h"
#include "common/strings.h"

namespace kvf::worker {
namespace {

// The copy is hashed in chunks that stay in L1/L2 between the copy and the hash.
constexpr size_t kChecksumChunk = 32 * 1024;

uint64_t pageRound(uint64_t bytes) {
  auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

#if defined(KVF_WITH_CUDA)
// CUDA-pinned memory when a device is there; nullptr (and the reason) when not.
std::byte* cudaPinned(uint64_t bytes, std::string* why) {
  int devices = 0;
  cudaError_t error = cudaGetDeviceCount(&devices);
  if (error != cudaSuccess || devices == 0) {
    *why = error != cudaSuccess ? cudaGetErrorString(error) : "no CUDA device";
    return nullptr;
  }
  void* p = nullptr;
  error = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (error != cudaSuccess) {
    *why = strCat("cudaHostAlloc: ", cudaGetErrorString(error));
    return nullptr;
  }
  std::memset(p, 0, bytes);
  return static_cast<std::byte*>(p);
}
#endif

// Faults every page in now, so the first stores do not pay for it.
void prefault(std::byte* data, uint64_t bytes) {
#ifdef MADV_POPULATE_WRITE
  if (::madvise(data, bytes, MADV_POPULATE_WRITE) == 0) return;
#endif
  auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  for (uint64_t at = 0; at < bytes; at += page) data[at] = std::byte{0};
}

}  // namespace

std::string_view pinKindName(PinKind kind) {
  switch (kind) {
    case PinKind::kCudaHost:
      return "cuda_host";
    case PinKind::kMlock:
      return "mlock";
    case PinKind::kNone:
      return "none";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<PinnedArena>> PinnedArena::create(uint64_t bytes, PinMode mode) {
  if (bytes == 0) return absl::InvalidArgumentError("pinned arena: size 0");
  bytes = pageRound(bytes);
#if defined(KVF_WITH_CUDA)
  if (mode != PinMode::kOff) {
    std::string why;
    if (std::byte* p = cudaPinned(bytes, &why)) {
      return std::unique_ptr<PinnedArena>(new PinnedArena(p, bytes, PinKind::kCudaHost));
    }
    log::debug("host tier: not CUDA-pinned, using mlock", "reason", why);
  }
#endif
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        strCat("pinned arena: mmap ", bytes, " bytes: ", std::strerror(errno)));
  }
  auto* data = static_cast<std::byte*>(p);
  // Huge pages cut TLB misses on block copies; advisory only.
  ::madvise(data, bytes, MADV_HUGEPAGE);
  PinKind kind = PinKind::kNone;
  if (mode != PinMode::kOff) {
    if (::mlock(data, bytes) == 0) {
      kind = PinKind::kMlock;
    } else {
      int err = errno;
      if (mode == PinMode::kRequired) {
        ::munmap(data, bytes);
        return absl::ResourceExhaustedError(
            strCat("pinned arena: mlock ", bytes, " bytes: ", std::strerror(err),
                   " (raise RLIMIT_MEMLOCK / `ulimit -l`, or grant CAP_IPC_LOCK)"));
      }
      log::warn("host tier memory is not page-locked", "bytes", bytes, "error", std::strerror(err));
      prefault(data, bytes);
    }
  }
  return std::unique_ptr<PinnedArena>(new PinnedArena(data, bytes, kind));
}

PinnedArena::~PinnedArena() {
#if defined(KVF_WITH_CUDA)
  if (kind_ == PinKind::kCudaHost) {
    cudaFreeHost(data_);
    return;
  }
#endif
  if (kind_ == PinKind::kMlock) ::munlock(data_, size_);
  ::munmap(data_, size_);
}

uint64_t blockChecksum(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

uint64_t copyWithChecksum(std::span<std::byte> dst, std::span<const std::byte> src) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  size_t n = std::min(dst.size(), src.size());
  for (size_t at = 0; at < n; at += kChecksumChunk) {
    size_t len = std::min(kChecksumChunk, n - at);
    std::memcpy(dst.data() + at, src.data() + at, len);
    XXH3_64bits_update(&state, dst.data() + at, len);
  }
  return XXH3_64bits_digest(&state);
}

}  // namespace kvf::worker
