#include "common/ready_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/testing/child_process.h"
#include "tests/testing/temp_dir.h"

namespace kvf {
namespace {

namespace fs = std::filesystem;

TEST(ReadyFile, AppearsCompleteOnPublishAndGoesWithTheServer) {
  fs::path dir = testing::freshTempDir("kvf_ready_file");
  fs::path path = dir / "server.ready";
  std::ofstream(path) << "4242\n";  // left by an earlier run that was killed
  {
    ReadyFile ready(path.string());
    EXPECT_FALSE(fs::exists(path)) << "a stale file must not signal readiness";
    ASSERT_TRUE(ready.publish(8123).ok());
    EXPECT_EQ(testing::readFile(path.string()), "8123\n");
    EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1)
        << "no temporary file left beside it";
  }
  EXPECT_FALSE(fs::exists(path));
  ReadyFile disabled("");
  EXPECT_TRUE(disabled.publish(1).ok());
  ReadyFile unwritable((dir / "no" / "such" / "folder" / "x.ready").string());
  EXPECT_FALSE(unwritable.publish(1).ok());
}

}  // namespace
}  // namespace kvf
