#include "trace/cli.h"

#include <chrono>
#include <cstdio>

#include <sys/resource.h>

#include <fmt/format.h>

#include "common/json.h"
#include "common/status.h"
#include "trace/json_line.h"
#include "trace/line_source.h"
#include "trace/synth.h"
#include "trace/writer.h"

namespace kvf::trace {

namespace {

using SteadyTime = std::chrono::steady_clock;

// Prints "\r<label>: 42% of 120.0 MB" (or a request count) to stderr at most once a second.
class Progress {
 public:
  Progress(std::string label, bool enabled, bool bytes = true)
      : label_(std::move(label)), enabled_(enabled), bytes_(bytes) {}
  void operator()(int64_t done, int64_t total) {
    if (!enabled_) return;
    auto now = SteadyTime::now();
    if (now - last_ < std::chrono::seconds(1)) return;
    last_ = now;
    shown_ = true;
    if (!bytes_) {
      fmt::print(stderr, "\r{}: {} of {} requests", label_, done, total);
    } else if (total > 0) {
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
  bool bytes_;
  bool shown_ = false;
  SteadyTime::time_point last_ = SteadyTime::now();
};

void printSkipped(const RequestReader& reader) {
  if (reader.skipped() == 0) return;
  fmt::print(stderr, "skipped {} bad records; the first ones:\n", reader.skipped());
  for (const auto& p : reader.problems()) fmt::print(stderr, "  {}\n", p.toString());
}

absl::Status runStats(const std::vector<std::string>& args, const CliOptions& o) {
  for (const std::string& path : args) {
    KVF_ASSIGN_OR_RETURN(auto reader, openTrace(path, o.reader));
    Progress progress("stats " + path, o.progress);
    auto stats = computeStats(*reader, o.stats, [&](int64_t d, int64_t t) { progress(d, t); });
    if (!stats.ok()) return annotate(stats.status(), path);
    printSkipped(*reader);
    if (o.json) {
      std::string json = formatStatsJson(*stats);
      std::string prefix = "\"path\": ";
      appendJsonString(&prefix, path);
      prefix += fmt::format(", \"format\": \"{}\", ", formatName(reader->format()));
      json.insert(1, prefix);
      fmt::print("{}", json);
    } else {
      fmt::print("== {} ({})\n{}", path, formatName(reader->format()), formatStatsTable(*stats));
    }
  }
  return absl::OkStatus();
}

absl::Status runConvert(const std::vector<std::string>& args, const CliOptions& o) {
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
  KVF_ASSIGN_OR_RETURN(auto writer, SessionWriter::create(o.output));
  KVF_ASSIGN_OR_RETURN(auto report,
                       sampleTrace(args[0], o.reader, o.sample, o.stats, writer.get()));
  KVF_RETURN_IF_ERROR(writer->close());
  fmt::print(o.output == "-" ? stderr : stdout, "{}", formatSampleReport(report));
  return absl::OkStatus();
}

absl::Status runSynth(const std::vector<std::string>& args, const CliOptions& o) {
  SynthConfig config;
  if (!args.empty()) {
    KVF_ASSIGN_OR_RETURN(config, loadSynthConfig(args[0]));
  }
  if (o.synth_requests > 0) config.requests = o.synth_requests;
  KVF_ASSIGN_OR_RETURN(auto writer, SessionWriter::create(o.output));
  Progress progress("synth", o.progress && o.output != "-", /*bytes=*/false);
  int64_t n = 0;
  KVF_RETURN_IF_ERROR(synthesize(config, [&](const Request& r) {
    if ((++n & 0xFFFF) == 0) progress(n, config.requests);
    return writer->write(r);
  }));
  return writer->close();
}

double secondsSince(SteadyTime::time_point start) {
  return std::chrono::duration<double>(SteadyTime::now() - start).count();
}

int64_t peakRssBytes() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

// The same JSONL through Boost.JSON's DOM parser with field extraction, for comparison with the
// hand-written scanner the readers use.
absl::StatusOr<int64_t> boostJsonPass(const std::string& path, int64_t* bytes) {
  KVF_ASSIGN_OR_RETURN(auto source, LineSource::open(path, size_t{1} << 28));
  std::string_view line;
  int64_t requests = 0, checksum = 0;
  boost::json::parser parser;
  while (true) {
    KVF_ASSIGN_OR_RETURN(bool more, source->next(&line));
    if (!more) break;
    parser.reset();
    boost::system::error_code ec;
    parser.write(line.data(), line.size(), ec);
    if (ec)
      return absl::InvalidArgumentError(
          strCat(path, ":", source->lineNumber(), ": ", ec.message()));
    boost::json::value v = parser.release();
    const auto& obj = v.as_object();
    checksum += obj.at("input_length").to_number<int64_t>();
    for (const auto& id : obj.at("hash_ids").as_array()) checksum += id.to_number<int64_t>();
    ++requests;
  }
  *bytes = source->bytesConsumed();
  return requests + (checksum & 0);
}

absl::Status runBench(const std::vector<std::string>& args, const CliOptions& o) {
  auto start = SteadyTime::now();
  KVF_ASSIGN_OR_RETURN(auto reader, openTrace(args[0], o.reader));
  Request r;
  int64_t requests = 0, ids = 0;
  while (true) {
    KVF_ASSIGN_OR_RETURN(bool more, reader->next(&r));
    if (!more) break;
    ++requests;
    ids += static_cast<int64_t>(r.hash_ids.size());
  }
  double parse_s = secondsSince(start);
  double mb = static_cast<double>(reader->bytesRead()) / 1e6;
  fmt::print(
      "parse ({}): {} requests, {} hash ids, {:.1f} MB in {:.2f} s = {:.0f} MB/s, "
      "{:.0f} requests/s\n",
      formatName(reader->format()), requests, ids, mb, parse_s, mb / parse_s,
      static_cast<double>(requests) / parse_s);
  if (reader->format() != TraceFormat::kAgentic) {
    int64_t bytes = 0;
    start = SteadyTime::now();
    KVF_ASSIGN_OR_RETURN(int64_t n, boostJsonPass(args[0], &bytes));
    double s = secondsSince(start);
    fmt::print("parse (Boost.JSON DOM, for comparison): {} requests, {:.0f} MB/s\n", n,
               static_cast<double>(bytes) / 1e6 / s);
  }
  int64_t rss_before = peakRssBytes();
  start = SteadyTime::now();
  KVF_ASSIGN_OR_RETURN(reader, openTrace(args[0], o.reader));
  KVF_ASSIGN_OR_RETURN(auto stats, computeStats(*reader, o.stats));
  double stats_s = secondsSince(start);
  int64_t rss = peakRssBytes();
  fmt::print(
      "stats (parse + every statistic): {:.2f} s; {} unique blocks; peak RSS {:.0f} MB "
      "({:.0f} MB before stats, {:.1f} bytes per unique block)\n",
      stats_s, stats.unique_blocks, static_cast<double>(rss) / 1e6,
      static_cast<double>(rss_before) / 1e6,
      stats.unique_blocks > 0
          ? static_cast<double>(rss - rss_before) / static_cast<double>(stats.unique_blocks)
          : 0.0);
  return absl::OkStatus();
}

}  // namespace

absl::Status checkCommandLine(const std::string& command, const std::vector<std::string>& args,
                              const CliOptions& options) {
  auto fail = [](const std::string& message) { return absl::InvalidArgumentError(message); };
  if (command == "stats")
    return args.empty() ? fail("stats needs FILE|DIR arguments") : absl::OkStatus();
  if (command == "convert" || command == "sample") {
    return args.size() != 1 || options.output.empty()
               ? fail(strCat(command, " needs one FILE|DIR and --output"))
               : absl::OkStatus();
  }
  if (command == "synth") {
    return args.size() > 1 || options.output.empty()
               ? fail("synth takes at most one CONFIG.yaml and needs --output")
               : absl::OkStatus();
  }
  if (command == "bench")
    return args.size() != 1 ? fail("bench needs one FILE|DIR") : absl::OkStatus();
  return fail(strCat("unknown command '", command, "' (stats, convert, sample, synth, bench)"));
}

absl::Status runCommand(const std::string& command, const std::vector<std::string>& args,
                        const CliOptions& options) {
  KVF_RETURN_IF_ERROR(checkCommandLine(command, args, options));
  if (command == "stats") return runStats(args, options);
  if (command == "convert") return runConvert(args, options);
  if (command == "sample") return runSample(args, options);
  if (command == "synth") return runSynth(args, options);
  return runBench(args, options);
}

}  // namespace kvf::trace
