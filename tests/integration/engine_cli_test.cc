// kvf-engine's command line: config errors name their fields and exit 2, and per-instance
// flags override the config.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/process.h"
#include "tests/testing/child_process.h"

namespace kvf::testing {
namespace {

namespace fs = std::filesystem;

class EngineCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    source_ = envOr("KVF_SOURCE_DIR", fs::current_path().string());
    bin_ = envOr("KVF_BIN_DIR", source_ + "/build/bin") + "/kvf-engine";
    dir_ = fs::temp_directory_path() /
           ("kvf_cli_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string writeConfig(const std::string& extra) {
    fs::path path = dir_ / "engine.yaml";
    std::ofstream out(path);
    out << "profile: " << source_ << "/engine/profiles/llama-3.1-8b-h100.yaml\n"
        << "port: 0\n"
        << "kv_events: {endpoint: 'tcp://127.0.0.1:*', replay_endpoint: ''}\n"
        << extra;
    return path.string();
  }

  std::string source_, bin_;
  fs::path dir_;
};

TEST_F(EngineCliTest, MissingConfigFlagExits2) {
  auto p = startLogged({bin_}, (dir_ / "log").string());
  EXPECT_EQ(p->wait(std::chrono::seconds(20)), ExitStatus::exited(2));
  EXPECT_NE(readLog(*p).find("--config is required"), std::string::npos) << readLog(*p);
}

TEST_F(EngineCliTest, BadConfigNamesEveryField) {
  std::string config = writeConfig("cache: {block_size: 0}\nbogus: 1\ntime_scale: -1\n");
  auto p = startLogged({bin_, "--config", config}, (dir_ / "log").string());
  EXPECT_EQ(p->wait(std::chrono::seconds(20)), ExitStatus::exited(2));
  std::string log = readLog(*p);
  EXPECT_NE(log.find("cache.block_size"), std::string::npos) << log;
  EXPECT_NE(log.find("bogus"), std::string::npos) << log;
  EXPECT_NE(log.find("time_scale"), std::string::npos) << log;
}

TEST_F(EngineCliTest, FlagsOverrideTheConfig) {
  std::string config = writeConfig("instance_id: from-file\n");
  auto p = startLogged({bin_, "--config", config, "--instance_id", "e7", "--port", "0",
                        "--kv_events_endpoint", "tcp://127.0.0.1:*", "--time_scale", "4"},
                       (dir_ / "log").string());
  ASSERT_TRUE(waitForLog(*p, "kvf-engine ready", std::chrono::seconds(20))) << readLog(*p);
  EXPECT_EQ(logValue(*p, "kvf-engine ready", "instance"), "e7");
  EXPECT_EQ(logValue(*p, "kvf-engine ready", "time_scale"), "4");
  EXPECT_EQ(logValue(*p, "kvf-engine ready", "model"), "meta-llama/Llama-3.1-8B-Instruct");
  EXPECT_EQ(logValue(*p, "kvf-engine ready", "blocks"), "27648");  // 442,368 / 16
  EXPECT_NE(logValue(*p, "kvf-engine ready", "port"), "0");
  EXPECT_EQ(logValue(*p, "kvf-engine ready", "kv_replay"), "\"\"");  // replay disabled
}

}  // namespace
}  // namespace kvf::testing
