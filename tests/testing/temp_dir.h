// Test helper: a fresh, empty folder under GoogleTest's temp dir, named for the test and the
// process so parallel ctest runs never share one. The test owns it; it is not removed after.
#pragma once

#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <unistd.h>

namespace kvf::testing {

inline std::filesystem::path freshTempDir(const std::string& name) {
  std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / (name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace kvf::testing
