#include "trace/cli.h"

#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "common/status.h"
#include "trace/writer.h"

namespace kvf::trace {

namespace {

using SteadyTime = std::chrono::steady_clock;

// Prints "\r<label> 42% (120 MB)" to stderr at most once a second.
class Progress {
 public:
  Progress(std::string label, bool enabled) : label_(std::move(label)), enabled_(enabled) {}
  void operator()(int64_t done, int64_t total) {
    if (!enabled_) return;
    auto now = SteadyTime::now();
    if (now - last_ < std::chrono::seconds(1)) return;
    last_ = now;
    shown_ = true;
    if (total > 0) {
      fmt::print(stderr, "\r{}: {:.0f}% of {:.1f} MB", label_,
                 100.0 * static_cast<double>(done) / static_cast<double>(total),
                 static_cast<double>(total) / 1e6);
    } else {
      fmt::print(stderr, "\r{}: {:.1f} MB", label_, static_cast<double>(done) / 1e6);
    }
  }
  ~Progress() {
    if (shown_) fmt::print(stderr, "\n");
  }

 private:
  std::string label_;
  bool enabled_;
  bool shown_ = false;
  SteadyTime::time_point last_ = SteadyTime::now();
};

void printSkipped(const RequestReader& reader) {
  if (reader.skipped() == 0) return;
  fmt::print(stderr, "skipped {} bad records; the first ones:\n", reader.skipped());
  for (const auto& p : reader.problems()) fmt::print(stderr, "  {}\n", p.toString());
}

absl::Status runStats(const std::vector<std::string>& args, const CliOptions& o) {
  if (args.empty()) return absl::InvalidArgumentError("stats needs FILE|DIR arguments");
  for (const std::string& path : args) {
    KVF_ASSIGN_OR_RETURN(auto reader, openTrace(path, o.reader));
    Progress progress("stats " + path, o.progress);
    auto stats = computeStats(*reader, o.stats, [&](int64_t d, int64_t t) { progress(d, t); });
    if (!stats.ok()) return annotate(stats.status(), path);
    printSkipped(*reader);
    if (o.json) {
      std::string json = formatStatsJson(*stats);
      json.insert(1, fmt::format("\"path\": \"{}\", \"format\": \"{}\", ", path,
                                 formatName(reader->format())));
      fmt::print("{}", json);
    } else {
      fmt::print("== {} ({})\n{}", path, formatName(reader->format()), formatStatsTable(*stats));
    }
  }
  return absl::OkStatus();
}

absl::Status runConvert(const std::vector<std::string>& args, const CliOptions& o) {
  if (args.size() != 1 || o.output.empty()) {
    return absl::InvalidArgumentError("convert needs one FILE|DIR and --output");
  }
  KVF_ASSIGN_OR_RETURN(auto reader, openTrace(args[0], o.reader));
  KVF_ASSIGN_OR_RETURN(auto writer, SessionWriter::create(o.output));
  Request r;
  while (true) {
    KVF_ASSIGN_OR_RETURN(bool more, reader->next(&r));
    if (!more) break;
    KVF_RETURN_IF_ERROR(writer->write(r));
  }
  printSkipped(*reader);
  return writer->close();
}

absl::Status runSample(const std::vector<std::string>& args, const CliOptions& o) {
  if (args.size() != 1 || o.output.empty()) {
    return absl::InvalidArgumentError("sample needs one FILE|DIR and --output");
  }
  KVF_ASSIGN_OR_RETURN(auto writer, SessionWriter::create(o.output));
  KVF_ASSIGN_OR_RETURN(auto report,
                       sampleTrace(args[0], o.reader, o.sample, o.stats, writer.get()));
  KVF_RETURN_IF_ERROR(writer->close());
  fmt::print(o.output == "-" ? stderr : stdout, "{}", formatSampleReport(report));
  return absl::OkStatus();
}

}  // namespace

absl::Status runCommand(const std::string& command, const std::vector<std::string>& args,
                        const CliOptions& options) {
  if (command == "stats") return runStats(args, options);
  if (command == "convert") return runConvert(args, options);
  if (command == "sample") return runSample(args, options);
  return absl::InvalidArgumentError(
      strCat("unknown command '", command, "' (stats, convert, sample)"));
}

}  // namespace kvf::trace
