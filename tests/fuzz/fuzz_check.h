// Shared by the fuzz targets: a property failure aborts with a message, in the libFuzzer build
// (which records the input as a crash) and in the corpus replay of the normal build alike.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string_view>

#define KVF_FUZZ_CHECK(condition, what)                                                  \
  do {                                                                                   \
    if (!(condition)) {                                                                  \
      std::fprintf(stderr, "%s:%d: fuzz property failed: %s (%s)\n", __FILE__, __LINE__, \
                   #condition, what);                                                    \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

namespace kvf::fuzz {

// Most targets read their first byte as a choice (how input arrives, which parser) and the
// rest as the input itself; nullopt for an empty input.
struct SplitInput {
  uint8_t choice;
  std::string_view rest;
};
inline std::optional<SplitInput> splitInput(const uint8_t* data, size_t size) {
  if (size < 1) return std::nullopt;
  return SplitInput{data[0], std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1)};
}

}  // namespace kvf::fuzz
