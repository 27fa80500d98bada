// docs/quickstart.md works as written: every fenced block that follows the marker line
// "<!-- quickstart-test -->" runs, in order, in one bash with `set -euo pipefail`, from the
// repository root (KVF_SOURCE_DIR), bounded in time, and the output shows what the doc says to
// expect. Where unprivileged network namespaces work (unshare -rn) the commands run in a
// private one, so the doc's fixed ports never meet another process on the machine; every
// process the commands start is killed with the script's process group at the end.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing/child_process.h"
#include "tests/testing/temp_dir.h"

namespace kvf {
namespace {

namespace fs = std::filesystem;

constexpr char kMarker[] = "<!-- quickstart-test -->";

// The bodies of the fenced blocks that directly follow a marker line (blank lines between the
// marker and the fence are allowed; anything else unmarks it).
std::vector<std::string> markedBlocks(const std::string& markdown) {
  std::vector<std::string> blocks;
  std::istringstream in(markdown);
  bool marked = false, inside = false, keep = false;
  std::string block;
  for (std::string line; std::getline(in, line);) {
    if (inside) {
      if (line.rfind("```", 0) == 0) {
        if (keep) blocks.push_back(block);
        inside = false;
        block.clear();
      } else if (keep) {
        block += line + "\n";
      }
      continue;
    }
    if (line.rfind("```", 0) == 0) {
      inside = true;
      keep = marked;
      marked = false;
    } else if (line == kMarker) {
      marked = true;
    } else if (!line.empty()) {
      marked = false;
    }
  }
  return blocks;
}

TEST(Quickstart, RunsOnlyTheMarkedBlocks) {
  auto blocks = markedBlocks(std::string("intro\n") + kMarker +
                             "\n\n```bash\necho one\n```\n"
                             "```bash\necho unmarked\n```\n" +
                             kMarker + "\ntext between\n```bash\necho unmarked too\n```\n" +
                             kMarker + "\n```bash\necho two\necho three\n```\n");
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_EQ(blocks[0], "echo one\n");
  EXPECT_EQ(blocks[1], "echo two\necho three\n");
}

bool privateNetworkWorks() {
  return std::system("/usr/bin/unshare -rn /bin/true > /dev/null 2>&1") == 0 &&
         std::system("/usr/bin/unshare -rn /usr/sbin/ip link set lo up > /dev/null 2>&1") == 0;
}

TEST(Quickstart, CommandsRunAsWritten) {
  fs::path src = testing::envOr("KVF_SOURCE_DIR", ".");
  fs::path bin = testing::envOr("KVF_BIN_DIR", "bin");
  std::error_code ec;
  if (!fs::equivalent(src / "build" / "bin", bin, ec)) {
    GTEST_SKIP() << "the quickstart runs build/bin; these binaries are in " << bin;
  }
  std::string doc = testing::readFile((src / "docs" / "quickstart.md").string());
  ASSERT_FALSE(doc.empty()) << "cannot read " << src / "docs" / "quickstart.md";
  std::vector<std::string> blocks = markedBlocks(doc);
  ASSERT_GE(blocks.size(), 5u) << "docs/quickstart.md lost its marked blocks";

  fs::path dir = testing::freshTempDir("kvf_quickstart");
  fs::path script = dir / "quickstart.sh";
  {
    std::ofstream out(script);
    out << "set -euo pipefail\ncd '" << fs::absolute(src).string() << "'\n";
    for (const std::string& block : blocks) out << block;
  }
  std::vector<std::string> argv = {"/bin/bash", script.string()};
  if (privateNetworkWorks()) {
    argv = {"/usr/bin/unshare",
            "-rn",
            "/bin/bash",
            "-c",
            "/usr/sbin/ip link set lo up && exec /bin/bash \"$0\"",
            script.string()};
  }
  auto child = testing::startLogged(argv, (dir / "quickstart.log").string());
  auto status = child->wait(std::chrono::seconds(240));
  std::string log = testing::readLog(*child);
  ASSERT_TRUE(status.has_value()) << "the quickstart did not finish within 240 s:\n" << log;
  ASSERT_TRUE(status->success()) << *status << "\n" << log;

  // What the doc tells the reader to expect.
  for (const char* expected : {
           "\"healthy_instances\":2",   // step 2: both engines admitted
           "x-kvf-reason: cache_gate",  // step 3: the second request follows its cache
           "x-kvf-predicted-cached-tokens: 96", "\"cached_tokens\":96",
           "kvfabric_router_requests_total{outcome=\"ok\"} 2",  // step 4
           "vllm:prefix_cache_hits_total",
           "\"admitted\":true",  // step 5
           "\n401\n",
           "requests 40  errors 0",  // step 6
       }) {
    EXPECT_NE(log.find(expected), std::string::npos) << "missing '" << expected << "':\n" << log;
  }
}

}  // namespace
}  // namespace kvf
