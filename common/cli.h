// The command-line convention of every kvfabric binary, on Abseil flags: `--help` and `-h`
// print the usage and the binary's own flags and exit 0; `--version` prints the build's version
// (common/version.h) and exits 0; an unknown flag, a flag without its value or a bad value is a
// usage error: one line naming the flag on stderr and exit status 2. Call parseFlags() once at
// the top of main(), before any thread starts.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvf::cli {

inline constexpr int kExitFailure = 1;  // the run failed
inline constexpr int kExitUsage = 2;    // the command line was wrong; nothing was done

// Parses argv into the Abseil flags and returns the positional arguments (argv[0] excluded).
// Accepts --name=value, --name value, -name, --bool / --nobool / --bool=false, and `--` to end
// the flags. `usage` opens the help text. Exits on --help, -h, --version and usage errors.
std::vector<std::string> parseFlags(int argc, char** argv, std::string_view usage);

// The help text: `usage`, then every flag defined by this project with its type, default and
// description (Abseil's own flags left out), wrapped at 100 columns.
std::string helpText(std::string_view usage);

// "<program> <buildVersion()>".
std::string versionText(std::string_view program);

// Prints "<program>: <message> (see <program> --help)" to stderr and exits with kExitUsage.
[[noreturn]] void failUsage(std::string_view program, std::string_view message);

}  // namespace kvf::cli
