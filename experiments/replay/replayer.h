// Trace-driven replay against OpenAI-compatible endpoints (routers or engines). Dispatch
// follows the trace: `timestamp` sends each request at its trace time (open loop, no
// concurrency cap unless asked), `session` sends a session's next turn when the previous one
// finished plus its think time, or at its trace time if that is later. Every finished request
// is appended to the ResultLog at once. With several endpoints (router replicas), requests are
// dealt to them in turn (client-side round robin) and each result names the one it went to.
// Runs on one executor (single-threaded io_context).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/http_client.h"
#include "experiments/replay/result_log.h"
#include "trace/request.h"
#include "trace/token_synth.h"

namespace kvf::experiments {

enum class DispatchMode { kTimestamp, kSession };

struct ReplayOptions {
  DispatchMode dispatch = DispatchMode::kTimestamp;
  double time_scale = 1.0;    // > 1 compresses trace time (2 = twice as fast); 1 = real time
  int64_t limit = 0;          // replay only the first N requests (0 = all)
  double warmup_s = 0;        // requests arriving before this trace time are left out of summaries
  int64_t max_in_flight = 0;  // 0 = never capped
  std::chrono::milliseconds timeout{600'000};
  std::string model;     // empty: the first model the endpoint lists at /v1/models
  bool progress = true;  // live progress line on stderr
};

// Builds the prompt token ids of a trace request (deterministic token synthesis).
using PromptBuilder = std::function<std::vector<int32_t>(const trace::Request&)>;

// One endpoint a replay sends to: its base URL (recorded in each result when there are several)
// and the client that talks to it.
struct ReplayEndpoint {
  std::string url;
  std::shared_ptr<http::HttpClient> client;
};

// Where `--url` points: http://host:port.
struct EndpointAddress {
  std::string url;  // as given, without trailing slashes
  std::string host;
  uint16_t port = 0;
};

// Parses a comma-separated list of http://host:port URLs (at least one; no duplicates).
absl::StatusOr<std::vector<EndpointAddress>> parseEndpointList(std::string_view urls);

struct ReplayProgress {
  int64_t total = 0, done = 0, in_flight = 0, errors = 0, skipped = 0;
};

class Replayer {
 public:
  // One endpoint; results do not name it.
  Replayer(std::shared_ptr<http::HttpClient> client, ReplayOptions options, PromptBuilder prompt,
           ResultLog* log);
  // Several endpoints, dealt requests in turn. Before the first request every endpoint must
  // answer GET /v1/models (run() fails naming the one that does not).
  Replayer(std::vector<ReplayEndpoint> endpoints, ReplayOptions options, PromptBuilder prompt,
           ResultLog* log);

  // Replays `requests` (any order; they are sorted by arrival). Requests already in the log
  // (resume) are skipped; the clock starts at the first remaining request. Completes when every
  // dispatched request finished. Errors only for result-log write failures.
  asio::awaitable<absl::Status> run(std::vector<trace::Request> requests);

  const ReplayProgress& progress() const { return progress_; }

 private:
  asio::awaitable<void> sendOne(const trace::Request& request, Nanos sent_at);
  asio::awaitable<void> runSession(std::vector<const trace::Request*> turns);
  asio::awaitable<void> waitUntil(Nanos t);
  asio::awaitable<void> waitForSlot();
  asio::awaitable<void> reportProgress();
  asio::awaitable<absl::Status> checkEndpoints();
  Nanos now() const;
  Nanos traceToWall(Nanos arrival) const;

  std::vector<ReplayEndpoint> endpoints_;
  size_t next_endpoint_ = 0;  // round robin
  ReplayOptions options_;
  PromptBuilder prompt_;
  ResultLog* log_;
  ReplayProgress progress_;
  absl::Status log_status_;
  Nanos start_wall_ = 0;
  Nanos trace_origin_ = 0;
  bool finished_ = false;
};

std::string formatProgress(const ReplayProgress& p, double elapsed_s);

// Gives every request without an id its index in `requests` ("r<i>"), so ids, and with them
// --resume and the prompt keys below, are stable across runs of the same trace.
void assignMissingIds(std::vector<trace::Request>* requests);

// Replays `requests` (ids assigned) against `endpoints` (round robin when several) on a private
// io_context and returns when every request finished. Prompts come from trace/'s token
// synthesis keyed by each request's index in `requests`.
absl::Status replayTrace(const std::vector<trace::Request>& requests,
                         const std::vector<EndpointAddress>& endpoints,
                         const ReplayOptions& options, const trace::TokenSynthOptions& synth,
                         ResultLog* log);

}  // namespace kvf::experiments
