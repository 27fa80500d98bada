// kvf-replay: replays a trace against an OpenAI-compatible endpoint (the router or one engine)
// and writes one JSON line per finished request, then a summary table.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "common/cli.h"
#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "experiments/replay/replayer.h"
#include "experiments/replay/summary.h"
#include "trace/reader.h"
#include "trace/token_synth.h"

ABSL_FLAG(std::string, trace, "", "Trace file or directory (required).");
ABSL_FLAG(std::string, format, "auto", "Trace format: auto, mooncake, session, bailian, agentic.");
ABSL_FLAG(bool, skip_bad_lines, false, "Skip malformed trace records instead of stopping.");
ABSL_FLAG(std::string, url, "http://127.0.0.1:8000",
          "Endpoint base URL, http://host:port: the router (kvf-router listens on port 8000 "
          "unless its config says otherwise) or one engine. Several, comma-separated (router "
          "replicas): requests are dealt to them in turn (client-side round robin), each result "
          "line records its URL in `endpoint`, the summary counts requests and errors per URL, "
          "and every URL must answer GET /v1/models before the first request is sent.");
ABSL_FLAG(std::string, output, "", "Results JSONL file (required; never overwritten).");
ABSL_FLAG(bool, resume, false, "Continue an existing results file, skipping finished requests.");
ABSL_FLAG(std::string, dispatch, "timestamp",
          "timestamp: send each request at its trace time (open loop). session: send a "
          "session's next turn when the previous finished plus its think time, or at its trace "
          "time if later.");
ABSL_FLAG(double, time_scale, 1.0,
          "Trace time compression: 8 sends the requests 8x faster than their trace timestamps "
          "(1 = real time). Give kvf-engine the same --time_scale so the engines model the same "
          "load; the measured latencies are then the modelled ones divided by it.");
ABSL_FLAG(int64_t, limit, 0, "Replay only the first N requests by arrival (0 = all).");
ABSL_FLAG(double, warmup_s, 0.0,
          "Leave requests arriving before this trace time out of the summary.");
ABSL_FLAG(int64_t, max_in_flight, 0, "Cap on concurrent requests (0 = never capped).");
ABSL_FLAG(double, timeout_s, 600.0, "Per-request timeout in seconds.");
ABSL_FLAG(std::string, model, "",
          "Model name sent in requests (default: the first at /v1/models).");
ABSL_FLAG(int32_t, vocab_min, 1000, "Smallest synthesised token id.");
ABSL_FLAG(int32_t, vocab_max, 32000, "Synthesised token ids are below this.");
ABSL_FLAG(uint64_t, salt, 0, "Token synthesis salt (same salt = same prompts).");
ABSL_FLAG(double, conversation_rate, 1.0 / 60.0,
          "Agentic traces: Poisson arrival rate of conversations per second.");
ABSL_FLAG(uint64_t, seed, 1, "Agentic traces: seed of the conversation arrival process.");
ABSL_FLAG(bool, progress, true, "Show a live progress line on stderr.");

namespace {

using namespace kvf;

struct ReplayFlags {
  std::string trace_path, output, dispatch;
  experiments::ReplayOptions options;
  std::vector<experiments::EndpointAddress> endpoints;
  trace::ReaderOptions reader;
};

// Every check of the command line itself: a failure here is a usage error (exit 2).
absl::StatusOr<ReplayFlags> readFlags() {
  ReplayFlags f;
  f.trace_path = absl::GetFlag(FLAGS_trace);
  f.output = absl::GetFlag(FLAGS_output);
  if (f.trace_path.empty()) return absl::InvalidArgumentError("--trace is required");
  if (f.output.empty()) return absl::InvalidArgumentError("--output is required");
  experiments::ReplayOptions& options = f.options;
  f.dispatch = absl::GetFlag(FLAGS_dispatch);
  if (f.dispatch == "session") {
    options.dispatch = experiments::DispatchMode::kSession;
  } else if (f.dispatch != "timestamp") {
    return absl::InvalidArgumentError("--dispatch must be timestamp or session");
  }
  options.time_scale = absl::GetFlag(FLAGS_time_scale);
  if (!(options.time_scale > 0)) return absl::InvalidArgumentError("--time_scale must be > 0");
  options.limit = absl::GetFlag(FLAGS_limit);
  if (options.limit < 0) return absl::InvalidArgumentError("--limit must be >= 0");
  options.warmup_s = absl::GetFlag(FLAGS_warmup_s);
  options.max_in_flight = absl::GetFlag(FLAGS_max_in_flight);
  options.timeout =
      std::chrono::milliseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_timeout_s) * 1000));
  options.model = absl::GetFlag(FLAGS_model);
  options.progress = absl::GetFlag(FLAGS_progress);
  KVF_ASSIGN_OR_RETURN(f.endpoints, experiments::parseEndpointList(absl::GetFlag(FLAGS_url)));
  KVF_ASSIGN_OR_RETURN(f.reader.format, trace::parseFormatName(absl::GetFlag(FLAGS_format)));
  f.reader.on_error =
      absl::GetFlag(FLAGS_skip_bad_lines) ? trace::OnError::kSkip : trace::OnError::kStop;
  f.reader.arrivals.rate_per_s = absl::GetFlag(FLAGS_conversation_rate);
  f.reader.arrivals.seed = absl::GetFlag(FLAGS_seed);
  return f;
}

absl::Status run(const ReplayFlags& f) {
  const experiments::ReplayOptions& options = f.options;
  KVF_ASSIGN_OR_RETURN(std::vector<trace::Request> requests,
                       trace::readAll(f.trace_path, f.reader));
  experiments::assignMissingIds(&requests);
  trace::TokenSynthOptions synth_options;
  synth_options.vocab_min = absl::GetFlag(FLAGS_vocab_min);
  synth_options.vocab_max = absl::GetFlag(FLAGS_vocab_max);
  synth_options.salt = absl::GetFlag(FLAGS_salt);

  KVF_ASSIGN_OR_RETURN(auto log,
                       experiments::ResultLog::open(f.output, absl::GetFlag(FLAGS_resume)));
  log::info("replay starting", "trace", f.trace_path, "requests", requests.size(), "done",
            log->done().size(), "dispatch", f.dispatch, "time_scale", options.time_scale);

  absl::Status status =
      experiments::replayTrace(requests, f.endpoints, options, synth_options, log.get());
  std::printf(
      "%s",
      experiments::formatSummary(experiments::summarize(log->results(), options.warmup_s)).c_str());
  std::printf("results: %s\n", f.output.c_str());
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  auto args = kvf::cli::parseFlags(
      argc, argv,
      "kvf-replay: replays a trace against an OpenAI-compatible endpoint (the router or one\n"
      "engine) and measures TTFT, TPOT and E2E per request (docs/experiments.md).\n\n"
      "Usage: kvf-replay --trace T.jsonl --output results.jsonl [--url http://127.0.0.1:8000]\n"
      "                  [--limit N] [--time_scale S] [--dispatch timestamp|session]\n"
      "       kvf-replay ... --url http://127.0.0.1:8000,http://127.0.0.1:8001  (replicas,\n"
      "                  round robin)\n\n"
      "Prints a progress line on stderr, then a summary table (failed requests are counted\n"
      "there, and per URL when there are several).\n"
      "Exit status: 0 the replay ran, 1 it could not run (endpoint, trace or results file), 2 a\n"
      "bad command line.");
  if (!args.empty()) kvf::cli::failUsage("kvf-replay", "unexpected argument '" + args[0] + "'");
  auto flags = readFlags();
  if (!flags.ok()) kvf::cli::failUsage("kvf-replay", std::string(flags.status().message()));
  kvf::log::init("kvf-replay");
  absl::Status status = run(*flags);
  if (!status.ok()) {
    std::fprintf(stderr, "kvf-replay: %s\n", std::string(status.message()).c_str());
    return kvf::cli::kExitFailure;
  }
  return 0;
}
