// main() of the Google Benchmark binaries (kvf-policy-bench, kvf-http-bench, ...), following
// the command-line convention of common/cli.h: --help and -h print `description` and then
// the library's flags (exit 0), --version the build's version (exit 0), and an argument the
// library does not know is a usage error (exit 2). Call from main() only.
#pragma once

namespace kvf::bench {

// Runs every registered benchmark with the library's flags from argv; returns main's status.
int benchmarkMain(int argc, char** argv, const char* description);

}  // namespace kvf::bench
