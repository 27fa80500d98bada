// Starts a real kvf-engine and checks its KV-event stream and replay socket with an independent
// subscriber written in Python (Debian's python3-zmq + python3-msgpack).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/process.h"
#include "tests/testing/child_process.h"

namespace kvf::testing {
namespace {

namespace fs = std::filesystem;

std::string writeConfig(const fs::path& dir, const std::string& source_dir) {
  fs::path path = dir / "engine.yaml";
  std::ofstream out(path);
  out << "instance_id: kvev\n"
      << "port: 0\n"
      << "profile: " << source_dir << "/engine/profiles/qwen3-coder-30b-a3b-h20.yaml\n"
      << "time_scale: 20\n"
      << "max_model_len: 4096\n"
      << "cache: {block_size: 16, num_gpu_blocks: 20}\n"
      << "kv_events: {endpoint: 'tcp://127.0.0.1:*', replay_endpoint: 'tcp://127.0.0.1:*'}\n";
  return path.string();
}

TEST(EngineKvEventsTest, PythonSubscriberDecodesLiveStreamAndReplay) {
  if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "/usr/bin/python3 missing";
  std::string source = envOr("KVF_SOURCE_DIR", fs::current_path().string());
  std::string bin = envOr("KVF_BIN_DIR", source + "/build/bin");
  fs::path dir = fs::temp_directory_path() / ("kvf_kvev_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string config = writeConfig(dir, source);
  auto engine =
      startLogged({bin + "/kvf-engine", "--config", config}, (dir / "engine.log").string());
  ASSERT_TRUE(waitForLog(*engine, "kvf-engine ready", std::chrono::seconds(20)))
      << readLog(*engine);
  std::string port = logValue(*engine, "kvf-engine ready", "port");
  std::string pub = logValue(*engine, "kvf-engine ready", "kv_events");
  std::string replay = logValue(*engine, "kvf-engine ready", "kv_replay");
  ASSERT_FALSE(port.empty());
  ASSERT_NE(pub.find("tcp://127.0.0.1:"), std::string::npos) << pub;

  auto sub =
      startLogged({"/usr/bin/python3", source + "/tests/integration/engine_kv_events_subscriber.py",
                   port, pub, replay, "16"},
                  (dir / "subscriber.log").string());
  auto code = sub->wait(std::chrono::seconds(90));
  EXPECT_EQ(code, ExitStatus::exited(0)) << readLog(*sub) << "\nengine log:\n" << readLog(*engine);
  EXPECT_NE(readLog(*sub).find("OK live="), std::string::npos) << readLog(*sub);
  engine->kill();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvf::testing
