#include "common/flat_u64_map.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

namespace kvf {
namespace {
constexpr size_t kHugePage = 2u << 20;
}  // namespace

// Tables of 2 MB and more ask for transparent huge pages (the machine's THP mode is usually
// "madvise"): one TLB entry then covers 2 MB instead of 4 KB, and a probe into a big table
// otherwise misses the TLB as well as the cache.
void* allocateZeroedTable(size_t bytes) {
  if (bytes < kHugePage) {
    void* p = std::calloc(1, bytes);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void* p = std::aligned_alloc(kHugePage, bytes);  // bytes is a power of two >= 2 MB
  if (p == nullptr) throw std::bad_alloc();
  madvise(p, bytes, MADV_HUGEPAGE);  // advisory: a kernel without THP just ignores it
  std::memset(p, 0, bytes);
  return p;
}

void freeTable(void* p) { std::free(p); }

uint64_t processSalt() {
  // ASLR places this variable differently in every process; the mix spreads its few random
  // bits over the word, and | 1 keeps the multiply a bijection.
  static const uint64_t kSalt = [] {
    static const char anchor = 0;
    uint64_t x = reinterpret_cast<uintptr_t>(&anchor) ^ 0x9e3779b97f4a7c15ULL;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 29;
    return x | 1;
  }();
  return kSalt;
}

}  // namespace kvf
