// Helpers for trace/ tests: a per-test temporary directory and file writer, the path of the
// bundled public traces. Test-only; single-threaded.
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

// /work/shared/traces (or $KVF_TRACES_DIR): the bundled public traces.
inline std::string tracesDir() {
  const char* dir = std::getenv("KVF_TRACES_DIR");
  return dir != nullptr ? dir : "/work/shared/traces";
}

inline bool haveTraces() {
  return std::filesystem::exists(tracesDir() + "/mooncake/conversation_trace.jsonl");
}

}  // namespace kvf::trace::testing
