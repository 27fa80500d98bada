// Runs the kvf-trace binary end to end (KVF_BIN_DIR is set by ctest).
#include <cstdio>
#include <cstdlib>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/json.h"
#include "tests/trace/trace_test_util.h"

namespace kvf::trace {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

struct CliRun {
  int rc = -1;
  std::string out;  // stdout and stderr
};

CliRun run(const std::string& args) {
  const char* dir = std::getenv("KVF_BIN_DIR");
  std::string bin = std::string(dir != nullptr ? dir : "build/bin") + "/kvf-trace";
  std::string cmd = "timeout 60 " + bin + " " + args + " 2>&1";
  CliRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  int status = ::pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(Cli, HelpListsCommandsAndFlags) {
  CliRun r = run("--help");
  EXPECT_EQ(r.rc, 0);  // asked-for help is not a failure (kvf::cli::parseFlags)
  EXPECT_THAT(r.out, HasSubstr("sample FILE|DIR"));
  EXPECT_THAT(r.out, HasSubstr("--max_single_turn_ratio"));
  EXPECT_EQ(run("").rc, 2);
  EXPECT_EQ(run("frobnicate x").rc, 2);
  EXPECT_EQ(run("convert x").rc, 2);  // no --output: nothing is read
  EXPECT_EQ(run("stats /nonexistent.jsonl").rc, 1);
}

TEST(Cli, SynthThenStatsThenSample) {
  TempDir dir;
  std::string trace = dir.path("syn.jsonl");
  CliRun synth = run("synth --requests 800 --output " + trace);
  ASSERT_EQ(synth.rc, 0) << synth.out;
  CliRun stats = run("stats --json --progress=false " + trace);
  ASSERT_EQ(stats.rc, 0) << stats.out;
  auto obj = json::parseObject(stats.out);
  ASSERT_TRUE(obj.ok()) << stats.out;
  EXPECT_EQ(obj->at("requests").as_int64(), 800);
  EXPECT_EQ(obj->at("format").as_string(), "session");
  EXPECT_GT(obj->at("hit_all").at("token").as_double(), 0.3);

  std::string sample = dir.path("sample.jsonl");
  CliRun s = run("sample --window_s 0 --sample_ratio 0.5 --max_single_turn_ratio 0.2 --output " +
                 sample + " " + trace);
  ASSERT_EQ(s.rc, 0) << s.out;
  EXPECT_THAT(s.out, HasSubstr("blocks shared by >1 session"));
  CliRun table = run("stats " + sample);
  EXPECT_EQ(table.rc, 0);
  EXPECT_THAT(table.out, HasSubstr("unlimited cache hit, block-level"));
}

TEST(Cli, BadInputNamesFileLineAndField) {
  TempDir dir;
  auto path = dir.write("bad.jsonl",
                        "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, "
                        "\"hash_ids\": [1]}\n{\"timestamp\": 0, \"input_length\": 10}\n");
  CliRun r = run("stats " + path);
  EXPECT_EQ(r.rc, 1);  // bad data fails the run; 2 is kept for a bad command line
  EXPECT_THAT(r.out, HasSubstr(path + ":2: field 'output_length': missing"));
  CliRun skip = run("stats --on_error=skip --json " + path);
  EXPECT_EQ(skip.rc, 0) << skip.out;
  EXPECT_THAT(skip.out, HasSubstr("skipped 1 bad records"));
}

}  // namespace
}  // namespace kvf::trace
