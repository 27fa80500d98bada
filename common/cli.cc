#include "common/cli.h"

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"

namespace kvf::cli {

std::vector<std::string> parseFlags(int argc, char** argv, const char* usage) {
  absl::FlagsUsageConfig config;
  // Flags of this project are defined outside Abseil's own sources.
  config.contains_help_flags = [](absl::string_view path) {
    return path.find("absl/") == absl::string_view::npos;
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  std::vector<std::string> positional;
  for (size_t i = 1; i < rest.size(); ++i) positional.emplace_back(rest[i]);
  return positional;
}

}  // namespace kvf::cli
