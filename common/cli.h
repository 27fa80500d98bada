// Command-line parsing for kvfabric binaries on Abseil flags: `--help` lists the flags defined
// by the project's own sources (Abseil's default only lists flags from a file named like the
// binary, which prints "No flags matched" for kvf-* binaries). Call once at the top of main().
#pragma once

#include <string>
#include <vector>

namespace kvf::cli {

// Sets the usage message, parses argv and returns the positional arguments (argv[0] excluded).
// --help and the other usage flags print and exit with status 0; a bad flag exits non-zero.
std::vector<std::string> parseFlags(int argc, char** argv, const char* usage);

}  // namespace kvf::cli
