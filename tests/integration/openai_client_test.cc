// The official `openai` npm client against kvf-router in front of two real kvf-engine
// processes: completions and chat, streaming and not, a two-turn session and a rejected
// request (tests/integration/openai_client.mjs holds the calls and their checks).
// scripts/setup installs the package with `npm ci` from the repository's package-lock.json into
// <source>/node_modules, where the test finds it; $KVF_OPENAI_NODE_MODULES names another
// node_modules folder instead. A missing package or node fails the test: CI must run it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <vector>

#include "common/process.h"
#include "tests/testing/child_process.h"

namespace kvf::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;

class OpenAiClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    source_ = envOr("KVF_SOURCE_DIR", fs::current_path().string());
    bin_ = envOr("KVF_BIN_DIR", source_ + "/build/bin");
    modules_ = envOr("KVF_OPENAI_NODE_MODULES", source_ + "/node_modules");
    ASSERT_TRUE(fs::exists(fs::path(modules_) / "openai" / "package.json"))
        << "the openai npm package is not in " << modules_
        << ": run scripts/setup (npm ci from package-lock.json), or set "
           "KVF_OPENAI_NODE_MODULES to a node_modules folder holding it";
    ASSERT_TRUE(fs::exists("/usr/bin/node")) << "node is not installed: run scripts/setup";
    dir_ = fs::temp_directory_path() / ("kvf_openai_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    for (auto& p : children_) p->kill();
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  Process* start(const std::vector<std::string>& argv, const std::string& name) {
    children_.push_back(startLogged(argv, (dir_ / (name + ".log")).string()));
    return children_.back().get();
  }

  std::string source_, bin_, modules_;
  fs::path dir_;
  std::vector<std::unique_ptr<Process>> children_;
};

TEST_F(OpenAiClientTest, CompletionsAndChatStreamingAndNot) {
  fs::path engine_yaml = dir_ / "engine.yaml";
  std::ofstream(engine_yaml) << "profile: " << source_
                             << "/engine/profiles/llama-3.1-8b-h100.yaml\n"
                             << "served_model_name: llama-8b\nport: 0\ntime_scale: 20\n"
                             << "kv_events: {endpoint: 'tcp://127.0.0.1:*', replay_endpoint: ''}\n";
  std::string instances;
  for (int i = 0; i < 2; ++i) {
    std::string id = "e" + std::to_string(i);
    Process* e =
        start({bin_ + "/kvf-engine", "--config", engine_yaml.string(), "--instance_id", id}, id);
    ASSERT_TRUE(waitForLog(*e, "kvf-engine ready", seconds(30))) << readLog(*e);
    instances +=
        "  - {id: " + id + ", url: 'http://127.0.0.1:" + logValue(*e, "kvf-engine ready", "port") +
        "', kv_events: {endpoint: '" + logValue(*e, "kvf-engine ready", "kv_events") + "'}}\n";
  }
  fs::path router_yaml = dir_ / "router.yaml";
  std::ofstream(router_yaml) << "listen: {host: 127.0.0.1, port: 0}\ninstances:\n"
                             << instances << "policy: {kind: hybrid}\n"
                             << "tokenize: {enabled: true}\n";
  Process* router = start({bin_ + "/kvf-router", "--config", router_yaml.string()}, "router");
  ASSERT_TRUE(waitForLog(*router, "listening on port", seconds(30))) << readLog(*router);
  std::string log = readLog(*router);
  size_t at = log.find("listening on port ") + 18;
  std::string port = log.substr(at, log.find('\n', at) - at);

  setenv("KVF_OPENAI_NODE_MODULES", modules_.c_str(), 1);
  Process* client = start({"/usr/bin/node", source_ + "/tests/integration/openai_client.mjs",
                           "http://127.0.0.1:" + port + "/v1", "llama-8b"},
                          "client");
  std::optional<ExitStatus> rc = client->wait(seconds(90));
  std::string out = readLog(*client);
  ASSERT_EQ(rc, ExitStatus::exited(0)) << out << "\nrouter log:\n" << readLog(*router);
  EXPECT_NE(out.find("ALL OK"), std::string::npos) << out;
  EXPECT_NE(out.find("\"call\":\"chat_stream\""), std::string::npos) << out;
  std::cout << out;
}

}  // namespace
}  // namespace kvf::testing
