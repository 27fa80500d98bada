// The command-line convention of every file the build installs into build/bin (kvf-* binaries,
// Google Benchmark binaries, plot scripts), found by listing the folder so a new binary is
// covered without editing this test: `--help` and `-h` print the same help naming the program,
// with no build path in it, and exit 0; `--version` names the program, its git revision and
// build type, and exits 0; an unknown flag exits 2 and names the flag. The scripts in scripts/
// answer --help and -h the same way. Also: client defaults match the server defaults.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "router/core/config.h"
#include "tests/testing/child_process.h"
#include "tests/testing/temp_dir.h"

namespace kvf {
namespace {

namespace fs = std::filesystem;

struct RunResult {
  int code = -1;
  std::string output;  // stdout and stderr
};

// Runs `argv` with a 20 s bound; a hang fails the test.
RunResult run(const std::vector<std::string>& argv) {
  static int counter = 0;
  fs::path dir = testing::freshTempDir("kvf_cli_conventions");
  std::string log = (dir / ("run_" + std::to_string(counter++) + ".log")).string();
  auto child = testing::startLogged(argv, log);
  auto status = child->wait(std::chrono::seconds(20));
  RunResult r;
  r.output = testing::readLog(*child);
  EXPECT_TRUE(status.has_value()) << argv[0] << " did not exit within 20 s";
  if (status.has_value() && status->signal == 0) r.code = status->code;
  return r;
}

std::vector<fs::path> installedPrograms() {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(testing::envOr("KVF_BIN_DIR", "bin"), ec)) {
    struct stat st {};
    if (entry.is_regular_file() && ::stat(entry.path().c_str(), &st) == 0 &&
        (st.st_mode & S_IXUSR) != 0) {
      out.push_back(entry.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Absolute paths of this checkout and build: none may appear in a help text.
std::vector<std::string> buildPaths() {
  std::vector<std::string> paths;
  for (const char* var : {"KVF_SOURCE_DIR", "KVF_BIN_DIR"}) {
    std::string p = testing::envOr(var, "");
    if (!p.empty()) paths.push_back(fs::weakly_canonical(p).string());
  }
  paths.push_back("CMakeFiles");
  return paths;
}

void expectNoBuildPaths(const std::string& name, const std::string& text) {
  for (const std::string& path : buildPaths()) {
    EXPECT_EQ(text.find(path), std::string::npos) << name << " --help shows " << path;
  }
}

TEST(CliConventions, EveryInstalledProgram) {
  std::vector<fs::path> programs = installedPrograms();
  ASSERT_GE(programs.size(), 10u) << "build/bin looks incomplete";
  const std::regex version(R"(git ([0-9a-f]{7,40}(-dirty)?|unknown), [A-Za-z]+ build)");
  for (const fs::path& program : programs) {
    std::string name = program.filename().string();
    SCOPED_TRACE(name);
    RunResult help = run({program.string(), "--help"});
    EXPECT_EQ(help.code, 0) << help.output;
    EXPECT_NE(help.output.find(name), std::string::npos) << "help does not name it:\n"
                                                         << help.output;
    EXPECT_NE(help.output.find("sage"), std::string::npos) << "no usage line:\n" << help.output;
    expectNoBuildPaths(name, help.output);
    RunResult h = run({program.string(), "-h"});
    EXPECT_EQ(h.code, 0);
    EXPECT_EQ(h.output, help.output) << "-h differs from --help";

    RunResult v = run({program.string(), "--version"});
    EXPECT_EQ(v.code, 0) << v.output;
    EXPECT_NE(v.output.find(name), std::string::npos) << v.output;
    EXPECT_TRUE(std::regex_search(v.output, version)) << "version without revision or build "
                                                      << "type: " << v.output;

    RunResult bad = run({program.string(), "--no_such_flag_xyz", "x"});
    EXPECT_EQ(bad.code, 2) << bad.output;
    EXPECT_NE(bad.output.find("no_such_flag_xyz"), std::string::npos)
        << "the error does not name the flag:\n"
        << bad.output;
  }
}

TEST(CliConventions, ScriptsAnswerHelp) {
  fs::path scripts = fs::path(testing::envOr("KVF_SOURCE_DIR", ".")) / "scripts";
  int seen = 0;
  for (const auto& entry : fs::directory_iterator(scripts)) {
    std::string name = "scripts/" + entry.path().filename().string();
    SCOPED_TRACE(name);
    ++seen;
    RunResult help = run({entry.path().string(), "--help"});
    EXPECT_EQ(help.code, 0) << help.output;
    EXPECT_NE(help.output.find(name), std::string::npos) << help.output;
    EXPECT_NE(help.output.find("sage"), std::string::npos) << help.output;
    EXPECT_EQ(run({entry.path().string(), "-h"}).output, help.output);
  }
  EXPECT_GE(seen, 5);
}

// A bad value is a usage error too, named with its flag, and nothing starts.
TEST(CliConventions, BadValueAndMissingValueNameTheFlag) {
  std::string bin = testing::envOr("KVF_BIN_DIR", "bin");
  RunResult bad = run({bin + "/kvf-router", "--port=abc"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.output.find("--port"), std::string::npos) << bad.output;
  RunResult missing = run({bin + "/kvf-engine", "--config"});
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.output.find("--config needs a value"), std::string::npos) << missing.output;
  RunResult required = run({bin + "/kvf-replay", "--output", "/nonexistent/x.jsonl"});
  EXPECT_EQ(required.code, 2);
  EXPECT_NE(required.output.find("--trace is required"), std::string::npos) << required.output;
}

// Clients default to where the servers listen by default.
TEST(CliConventions, ClientDefaultsMatchServerDefaults) {
  auto config = router::parseRouterConfig(
      "instances: [{id: e0, url: \"http://127.0.0.1:8001\"}]\npolicy: {kind: round_robin}\n",
      "defaults");
  ASSERT_TRUE(config.ok()) << config.status();
  std::string router_url = "http://127.0.0.1:" + std::to_string(config->port);
  std::string bin = testing::envOr("KVF_BIN_DIR", "bin");
  RunResult replay = run({bin + "/kvf-replay", "--help"});
  EXPECT_NE(replay.output.find("(default: \"" + router_url + "\")"), std::string::npos)
      << "kvf-replay's --url default is not the router's " << router_url << ":\n"
      << replay.output;
}

}  // namespace
}  // namespace kvf
