// Helpers for trace/ tests: a per-test temporary directory and file writer, where the traces
// of the repository and the optional trace sets are. Test-only; single-threaded.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace kvf::trace::testing {

// A fresh directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            (std::string("kvf_trace_") + info->test_suite_name() + "_" + info->name() + "_" +
             std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }

  // Writes `text` to `name` inside the directory and returns its path.
  std::string write(const std::string& name, const std::string& text) const {
    auto p = path_ / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream out(p, std::ios::binary);
    out << text;
    return p.string();
  }
  std::string path(const std::string& name = "") const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// data/traces/ of the repository (KVF_SOURCE_DIR, set by ctest; the working directory
// otherwise): the Mooncake traces every checkout carries. Tests may rely on them.
inline std::string repoTracesDir() {
  const char* src = std::getenv("KVF_SOURCE_DIR");
  return std::string(src != nullptr ? src : ".") + "/data/traces";
}

// The folder of the optional, larger trace sets ($KVF_TRACES_DIR; data/traces/README.md), or
// "" when the variable is unset. A test that needs a set calls skipReasonWithout(set) first.
inline std::string optionalTracesDir() {
  const char* dir = std::getenv("KVF_TRACES_DIR");
  return dir != nullptr ? dir : "";
}

// Why a test needing optional set `set` (e.g. "agentic-coding") cannot run here, or "".
inline std::string skipReasonWithout(const std::string& set) {
  if (optionalTracesDir().empty()) {
    return "needs the optional trace set '" + set + "': set KVF_TRACES_DIR (data/traces/README.md)";
  }
  if (!std::filesystem::exists(optionalTracesDir() + "/" + set)) {
    return "needs the optional trace set '" + set + "', not found at " + optionalTracesDir() + "/" +
           set;
  }
  return "";
}

}  // namespace kvf::trace::testing
