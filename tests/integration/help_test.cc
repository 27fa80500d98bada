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
  // Abseil's flag parser exits with 1 after printing help; a signal or another code is a crash.
  EXPECT_EQ(status->signal, 0) << b.name;
  EXPECT_TRUE(status->code == 0 || status->code == 1) << b.name << " exit " << status->code;
  std::string text = testing::readLog(*child);
  EXPECT_NE(text.find(b.name), std::string::npos) << "usage does not name the binary:\n" << text;
  EXPECT_NE(text.find(std::string("--") + b.own_flag), std::string::npos)
      << b.name << " --help does not list --" << b.own_flag << ":\n"
      << text;
}

INSTANTIATE_TEST_SUITE_P(Binaries, HelpTest,
                         ::testing::Values(Binary{"kvf-router", "config"},
                                           Binary{"kvf-engine", "instance_id"},
                                           Binary{"kvf-trace", "output"},
                                           Binary{"kvf-replay", "dispatch"},
                                           Binary{"kvf-experiment", "jobs"},
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
