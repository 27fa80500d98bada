// The kvf-trace subcommands as library functions, so main.cc only parses flags and tests can run
// commands directly. Each command writes its report to stdout and errors to the returned status.
// Single-threaded.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "trace/reader.h"
#include "trace/sampler.h"
#include "trace/stats.h"

namespace kvf::trace {

struct CliOptions {
  ReaderOptions reader;
  StatsOptions stats;
  SampleOptions sample;
  bool json = false;
  std::string output;
  int64_t synth_requests = 0;
  bool progress = true;
};

// OK when `command` is known and `args` and the options have the shape it needs; else
// InvalidArgument saying what is missing (a usage error: nothing was read or written).
absl::Status checkCommandLine(const std::string& command, const std::vector<std::string>& args,
                              const CliOptions& options);

// Runs `command` ("stats", "convert", "sample", "synth", "bench") on `args`, after
// checkCommandLine().
absl::Status runCommand(const std::string& command, const std::vector<std::string>& args,
                        const CliOptions& options);

}  // namespace kvf::trace
