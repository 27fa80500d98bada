#include "experiments/bench/bench_main.h"

#include <benchmark/benchmark.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

#include "common/cli.h"

namespace kvf::bench {

int benchmarkMain(int argc, char** argv, const char* description) {
  std::string program = std::filesystem::path(argc > 0 ? argv[0] : "kvf-bench").filename();
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help" || arg == "-help") {
      std::printf(
          "%s\n\nUsage: %s [--benchmark_filter=REGEX] [other Google Benchmark flags]\n\n"
          "Google Benchmark flags:\n",
          description, program.c_str());
      std::fflush(stdout);
      benchmark::PrintDefaultHelp();
      return 0;
    }
    if (arg == "--version") {
      std::printf("%s\n", cli::versionText(program).c_str());
      return 0;
    }
  }
  benchmark::Initialize(&argc, argv);
  if (argc > 1) {
    cli::failUsage(program, std::string("unknown argument ") + argv[1] +
                                " (Google Benchmark flags are --benchmark_*)");
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace kvf::bench
