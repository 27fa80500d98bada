// kvf-trace: read, analyse, sample and synthesise prefix-structured request traces.
// Wires the trace/ library to a command line; see docs/traces.md.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "common/cli.h"
#include "common/status.h"
#include "trace/cli.h"

ABSL_FLAG(std::string, format, "auto",
          "Input format: auto, mooncake, session, bailian or agentic (a directory).");
ABSL_FLAG(std::string, on_error, "stop",
          "Bad input records: 'stop' (fail with file, line and field) or 'skip' (report them "
          "and go on).");
ABSL_FLAG(int32_t, block_size, 0, "Override the trace block size (0: the format's).");
ABSL_FLAG(std::string, conversation_arrivals, "poisson",
          "Agentic directory: how conversations start: 'poisson' (rate --conversation_rate) or "
          "'sequential' (every --conversation_gap_s).");
ABSL_FLAG(double, conversation_rate, 1.0 / 60.0,
          "Agentic directory: Poisson conversation arrivals per second.");
ABSL_FLAG(double, conversation_gap_s, 60.0, "Agentic directory: gap for 'sequential'.");
ABSL_FLAG(uint64_t, conversation_seed, 1, "Agentic directory: seed of the arrival process.");
ABSL_FLAG(bool, json, false, "stats: print one JSON object per input instead of a table.");
ABSL_FLAG(std::vector<std::string>, rr_instances, std::vector<std::string>({"2", "4", "8", "16"}),
          "stats: instance counts for the round-robin hit ratio (sum <= 64).");
ABSL_FLAG(std::vector<std::string>, sticky_instances, std::vector<std::string>({"8"}),
          "stats: instance counts for the session-sticky hit ratio (with --rr_instances, sum <= "
          "64).");
ABSL_FLAG(double, qps_window_s, 60.0, "stats: window length for the peak QPS.");
ABSL_FLAG(bool, chain_ids, false,
          "stats/sample: the trace's ids hash single blocks (not prefix-chained); chain them so "
          "an equal id after a different prefix counts as a different block.");
ABSL_FLAG(std::string, output, "", "sample/synth/convert: output session JSONL ('-': stdout).");
ABSL_FLAG(double, window_start_s, 0.0, "sample: start of the time window (s from trace start).");
ABSL_FLAG(double, window_s, 600.0, "sample: window length in seconds (<= 0: whole trace).");
ABSL_FLAG(double, sample_ratio, 1.0, "sample: share of sessions kept (0, 1].");
ABSL_FLAG(double, max_single_turn_ratio, 1.0,
          "sample: cap on the share of single-turn sessions among the kept sessions [0, 1].");
ABSL_FLAG(uint64_t, seed, 42, "sample: seed of the session choice.");
ABSL_FLAG(bool, rebase_time, true, "sample: shift arrivals so the window starts at 0.");
ABSL_FLAG(int64_t, requests, 0, "synth: override the config's request count (0: keep).");
ABSL_FLAG(bool, progress, true, "Show progress on stderr for long runs.");

namespace {

constexpr char kUsage[] =
    R"(kvf-trace: read, analyse, sample and synthesise prefix-structured request traces.

Usage: kvf-trace COMMAND [flags] ARGS

Commands:
  stats FILE|DIR...      statistics of each trace (table, or --json)
  convert FILE|DIR       rewrite any supported trace as session JSONL (--output)
  sample FILE|DIR        window+thin sampling (--window_start_s --window_s --sample_ratio
                         --max_single_turn_ratio --seed --output); prints before/after figures
  synth [CONFIG.yaml]    synthetic agentic trace (--output; default config without a file)
  bench FILE|DIR         parse and stats throughput on one core

See docs/traces.md for formats and the definition of every statistic; the repository carries
the Mooncake traces in data/traces/mooncake/. Exit status: 0 done, 1 a trace or file could not
be read or written, 2 a bad command line.)";

absl::StatusOr<kvf::trace::CliOptions> cliOptions() {
  kvf::trace::CliOptions o;
  KVF_ASSIGN_OR_RETURN(o.reader.format, kvf::trace::parseFormatName(absl::GetFlag(FLAGS_format)));
  std::string on_error = absl::GetFlag(FLAGS_on_error);
  if (on_error != "stop" && on_error != "skip") {
    return absl::InvalidArgumentError("--on_error must be 'stop' or 'skip'");
  }
  o.reader.on_error = on_error == "skip" ? kvf::trace::OnError::kSkip : kvf::trace::OnError::kStop;
  o.reader.block_size = absl::GetFlag(FLAGS_block_size);
  if (o.reader.block_size < 0) return absl::InvalidArgumentError("--block_size must be >= 0");
  std::string arrivals = absl::GetFlag(FLAGS_conversation_arrivals);
  if (arrivals != "poisson" && arrivals != "sequential") {
    return absl::InvalidArgumentError("--conversation_arrivals must be poisson or sequential");
  }
  o.reader.arrivals.kind = arrivals == "poisson"
                               ? kvf::trace::ConversationArrivals::Kind::kPoisson
                               : kvf::trace::ConversationArrivals::Kind::kSequential;
  o.reader.arrivals.rate_per_s = absl::GetFlag(FLAGS_conversation_rate);
  o.reader.arrivals.gap_s = absl::GetFlag(FLAGS_conversation_gap_s);
  o.reader.arrivals.seed = absl::GetFlag(FLAGS_conversation_seed);
  o.stats.round_robin_instances.clear();
  for (const std::string& n : absl::GetFlag(FLAGS_rr_instances)) {
    try {
      o.stats.round_robin_instances.push_back(std::stoi(n));
    } catch (const std::exception&) {
      return absl::InvalidArgumentError("--rr_instances takes integers, e.g. 2,4,8");
    }
  }
  o.stats.sticky_instances.clear();
  for (const std::string& n : absl::GetFlag(FLAGS_sticky_instances)) {
    try {
      o.stats.sticky_instances.push_back(std::stoi(n));
    } catch (const std::exception&) {
      return absl::InvalidArgumentError("--sticky_instances takes integers, e.g. 8");
    }
  }
  o.stats.qps_window_s = absl::GetFlag(FLAGS_qps_window_s);
  o.stats.chain_ids = absl::GetFlag(FLAGS_chain_ids);
  o.json = absl::GetFlag(FLAGS_json);
  o.output = absl::GetFlag(FLAGS_output);
  o.sample.window_start_s = absl::GetFlag(FLAGS_window_start_s);
  o.sample.window_s = absl::GetFlag(FLAGS_window_s);
  o.sample.sample_ratio = absl::GetFlag(FLAGS_sample_ratio);
  o.sample.max_single_turn_ratio = absl::GetFlag(FLAGS_max_single_turn_ratio);
  o.sample.seed = absl::GetFlag(FLAGS_seed);
  o.sample.rebase_time = absl::GetFlag(FLAGS_rebase_time);
  o.synth_requests = absl::GetFlag(FLAGS_requests);
  o.progress = absl::GetFlag(FLAGS_progress);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args = kvf::cli::parseFlags(argc, argv, kUsage);
  if (args.empty()) kvf::cli::failUsage("kvf-trace", "a COMMAND is required");
  auto options = cliOptions();
  if (!options.ok()) kvf::cli::failUsage("kvf-trace", std::string(options.status().message()));
  std::string command = args[0];
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (absl::Status s = kvf::trace::checkCommandLine(command, rest, *options); !s.ok()) {
    kvf::cli::failUsage("kvf-trace", std::string(s.message()));
  }
  absl::Status status = kvf::trace::runCommand(command, rest, *options);
  if (!status.ok()) {
    std::cerr << "kvf-trace " << command << ": " << status.message() << "\n";
    return kvf::cli::kExitFailure;
  }
  return 0;
}
