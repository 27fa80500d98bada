#include "common/cli.h"

#include <cstdlib>
#include <iostream>

#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
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
  // absl::ParseCommandLine exits with status 1 after printing --help; asked-for help is not a
  // failure, so parse with usage flags ignored and answer them here (help: exit 0). Bad flags
  // still abort with Abseil's message and a non-zero status.
  namespace fi = absl::flags_internal;
  std::vector<char*> rest = fi::ParseCommandLineImpl(
      argc, argv, fi::ArgvListAction::kRemoveParsedArgs, fi::UsageFlagsAction::kIgnoreUsage,
      fi::OnUndefinedFlag::kAbortIfUndefined);
  int usage_exit = fi::HandleUsageFlags(std::cout, absl::ProgramUsageMessage());
  if (usage_exit != -1) std::exit(usage_exit == 1 ? 0 : usage_exit);
  std::vector<std::string> positional;
  for (size_t i = 1; i < rest.size(); ++i) positional.emplace_back(rest[i]);
  return positional;
}

}  // namespace kvf::cli
