// Test helper: a fresh, empty folder under GoogleTest's temp dir, named for the test and the
// process so parallel ctest runs never share one. The test uses it freely; the folder is removed
// when the test process exits (set KVF_KEEP_TEST_DIRS=1 to keep it for a post-mortem). A child
// forked by the test never removes its parent's folders.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include <gtest/gtest.h>
#include <unistd.h>

namespace kvf::testing {

namespace internal {

// The folders made by this process, removed by the static destructor at exit.
class TempDirRegistry {
 public:
  static TempDirRegistry& get() {
    static TempDirRegistry registry;
    return registry;
  }
  void add(const std::filesystem::path& dir) { dirs_.push_back(dir); }
  ~TempDirRegistry() {
    const char* keep = std::getenv("KVF_KEEP_TEST_DIRS");
    if (::getpid() != owner_ || (keep != nullptr && std::string(keep) == "1")) return;
    for (const auto& dir : dirs_) {
      std::error_code ec;  // best effort: a folder already gone is fine
      std::filesystem::remove_all(dir, ec);
    }
  }

 private:
  TempDirRegistry() : owner_(::getpid()) {}
  pid_t owner_;
  std::vector<std::filesystem::path> dirs_;
};

}  // namespace internal

inline std::filesystem::path freshTempDir(const std::string& name) {
  std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / (name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  internal::TempDirRegistry::get().add(dir);
  return dir;
}

}  // namespace kvf::testing
