#include "common/cli.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "common/strings.h"
#include "common/version.h"

namespace kvf::cli {

namespace {

// Flags that Abseil defines itself (--helpfull, --flagfile, ...) are not part of our command
// lines: Abseil's own handling of them exits with status 1, not 0 or 2.
bool isOwnFlag(const absl::CommandLineFlag& flag) {
  return !flag.IsRetired() && flag.Filename().find("absl/") == std::string::npos;
}

absl::CommandLineFlag* findOwnFlag(std::string_view name) {
  absl::CommandLineFlag* flag =
      absl::FindCommandLineFlag(absl::string_view(name.data(), name.size()));
  return flag != nullptr && isOwnFlag(*flag) ? flag : nullptr;
}

std::string typeName(const absl::CommandLineFlag& flag) {
  if (flag.IsOfType<bool>()) return "bool";
  if (flag.IsOfType<int32_t>()) return "int";
  if (flag.IsOfType<int64_t>()) return "int64";
  if (flag.IsOfType<uint32_t>()) return "uint32";
  if (flag.IsOfType<uint64_t>()) return "uint64";
  if (flag.IsOfType<double>()) return "number";
  if (flag.IsOfType<std::string>()) return "string";
  if (flag.IsOfType<std::vector<std::string>>()) return "list";
  return "value";
}

// Appends `text` wrapped at `width` columns, every line indented by `indent` spaces.
void appendWrapped(std::string& out, std::string_view text, size_t indent, size_t width) {
  size_t column = 0;
  size_t at = 0;
  while (at < text.size()) {
    if (text[at] == '\n') {
      out += '\n';
      column = 0;
      ++at;
      continue;
    }
    size_t end = text.find_first_of(" \n", at);
    if (end == std::string_view::npos) end = text.size();
    std::string_view word = text.substr(at, end - at);
    if (column == 0) {
      out.append(indent, ' ');
      column = indent;
    } else if (column + 1 + word.size() > width) {
      out += '\n';
      out.append(indent, ' ');
      column = indent;
    } else {
      out += ' ';
      ++column;
    }
    out += word;
    column += word.size();
    at = end < text.size() && text[end] == ' ' ? end + 1 : end;
  }
  if (column != 0) out += '\n';
}

std::string programName(const char* argv0) {
  return argv0 != nullptr ? std::filesystem::path(argv0).filename().string() : "kvf";
}

// Sets `flag` from `value` or fails with a usage error naming it.
void setFlag(const std::string& program, absl::CommandLineFlag& flag, std::string_view value) {
  std::string error;
  if (!flag.ParseFrom(absl::string_view(value.data(), value.size()), &error)) {
    failUsage(program, strCat("--", std::string_view(flag.Name().data(), flag.Name().size()),
                              ": bad value '", value, "': ", error));
  }
}

}  // namespace

std::string helpText(std::string_view usage) {
  std::string out(usage);
  if (!out.empty() && out.back() != '\n') out += '\n';
  out += "\nFlags:\n  -h, --help\n";
  appendWrapped(out, "Print this help and exit.", 6, 100);
  out += "  --version\n";
  appendWrapped(out, "Print the version, git revision and build type, and exit.", 6, 100);
  std::vector<absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (isOwnFlag(*flag)) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  for (const absl::CommandLineFlag* flag : flags) {
    std::string name(flag->Name().data(), flag->Name().size());
    std::string fallback = flag->DefaultValue();
    if (flag->IsOfType<std::string>()) fallback = strCat("\"", fallback, "\"");
    out += strCat("  --", name, "=<", typeName(*flag), ">  (default: ", fallback, ")\n");
    appendWrapped(out, flag->Help(), 6, 100);
  }
  return out;
}

std::string versionText(std::string_view program) { return strCat(program, " ", buildVersion()); }

void failUsage(std::string_view program, std::string_view message) {
  std::cerr << program << ": " << message << " (see " << program << " --help)" << std::endl;
  std::exit(kExitUsage);
}

std::vector<std::string> parseFlags(int argc, char** argv, std::string_view usage) {
  const std::string program = programName(argc > 0 ? argv[0] : nullptr);
  std::vector<std::string> positional;
  bool flags_ended = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (flags_ended || arg.size() < 2 || arg[0] != '-') {
      positional.emplace_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_ended = true;
      continue;
    }
    std::string_view body = arg.substr(arg[1] == '-' ? 2 : 1);
    size_t eq = body.find('=');
    std::string_view name = body.substr(0, eq);
    if (name == "h" || name == "help" || name == "helpfull" || name == "helpshort") {
      std::cout << helpText(usage);
      std::exit(0);
    }
    if (name == "version") {
      std::cout << versionText(program) << "\n";
      std::exit(0);
    }
    absl::CommandLineFlag* flag = findOwnFlag(name);
    if (flag == nullptr && eq == std::string_view::npos && name.substr(0, 2) == "no") {
      absl::CommandLineFlag* negated = findOwnFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) {
        setFlag(program, *negated, "false");
        continue;
      }
    }
    if (flag == nullptr) failUsage(program, strCat("unknown flag ", arg.substr(0, arg.find('='))));
    if (eq != std::string_view::npos) {
      setFlag(program, *flag, body.substr(eq + 1));
    } else if (flag->IsOfType<bool>()) {
      setFlag(program, *flag, "true");
    } else if (i + 1 < argc) {
      setFlag(program, *flag, argv[++i]);
    } else {
      failUsage(program, strCat("--", name, " needs a value"));
    }
  }
  return positional;
}

}  // namespace kvf::cli
