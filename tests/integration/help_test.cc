// Every kvf-* binary answers --help with its usage and its own flags, promptly, and without
// starting anything (the ground rule "every binary has --help"). Runs the built binaries from
// KVF_BIN_DIR.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "tests/testing/child_process.h"

namespace kvf {
namespace {

struct Binary {
  const char* name;
  const char* own_flag;  // a flag defined by the binary itself, not by a library
};

class HelpTest : public ::testing::TestWithParam<Binary> {};

TEST_P(HelpTest, ListsItsOwnFlagsAndExits) {
  const Binary& b = GetParam();
  std::string bin = testing::envOr("KVF_BIN_DIR", "bin") + "/" + b.name;
  std::string log = ::testing::TempDir() + "/help_" + b.name + ".log";
  auto child = testing::startLogged({bin, "--help"}, log);
  auto status = child->wait(std::chrono::seconds(20));
  ASSERT_TRUE(status.has_value()) << b.name << " --help did not exit within 20 s";
  // Asked-for help is not a failure (kvf::cli answers it with status 0, unlike Abseil's default).
  EXPECT_TRUE(status->success()) << b.name << " --help: " << status->toString();
  std::string text = testing::readLog(*child);
  EXPECT_NE(text.find(b.name), std::string::npos) << "usage does not name the binary:\n" << text;
  EXPECT_NE(text.find(std::string("--") + b.own_flag), std::string::npos)
      << b.name << " --help does not list --" << b.own_flag << ":\n"
      << text;
}

// An unknown flag is an error: non-zero status and a message naming it.
TEST(CliFlags, UnknownFlagFailsAndNamesIt) {
  std::string bin = testing::envOr("KVF_BIN_DIR", "bin") + "/kvf-router";
  auto child = testing::startLogged({bin, "--no_such_flag=1"},
                                    ::testing::TempDir() + "/help_unknown_flag.log");
  auto status = child->wait(std::chrono::seconds(20));
  ASSERT_TRUE(status.has_value());
  EXPECT_FALSE(status->success());
  EXPECT_NE(testing::readLog(*child).find("no_such_flag"), std::string::npos)
      << testing::readLog(*child);
}

INSTANTIATE_TEST_SUITE_P(
    Binaries, HelpTest,
    ::testing::Values(Binary{"kvf-router", "config"}, Binary{"kvf-engine", "instance_id"},
                      Binary{"kvf-register", "lease_ttl_s"}, Binary{"kvf-trace", "output"},
                      Binary{"kvf-replay", "dispatch"}, Binary{"kvf-experiment", "jobs"},
                      Binary{"kvf-transport-bench", "block_sizes"},
                      Binary{"kvf-proxy-bench", "prompt_tokens"}),
    [](const ::testing::TestParamInfo<Binary>& param) {
      std::string name = param.param.name;
      for (char& c : name) {
        if (c == '-') c = '_';
      }
      return name;
    });

}  // namespace
}  // namespace kvf
