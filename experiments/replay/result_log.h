// The replayer's per-request results: one JSON object per finished request, appended and flushed
// as each finishes so a crash loses nothing; loading tolerates a torn last line so a resumed run
// continues without losing or duplicating requests. Single-threaded (the replay executor).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "experiments/replay/completion_client.h"

namespace kvf::experiments {

// Request class by tokens that still need prefill: WARM < 5k, MEDIUM 5k-20k, HEAVY > 20k.
std::string_view requestClass(int64_t new_tokens);

struct RequestResult {
  std::string request_id;
  std::string session_id;
  int32_t turn = 0;
  double arrival_s = 0;  // trace time of the request
  double sent_s = 0;     // when it was sent, relative to the replay start
  int64_t input_length = 0;
  int64_t output_length = 0;  // requested
  std::string endpoint;       // the URL it was sent to, when the replay had several (else empty)
  CompletionOutcome outcome;

  // Prompt tokens not served from cache (falls back to the input length when unknown).
  int64_t newTokens() const;
  std::string toJsonLine() const;  // without the trailing newline
  static absl::StatusOr<RequestResult> fromJsonLine(std::string_view line);
};

class ResultLog {
 public:
  // Opens `path` for appending. With `resume`, existing complete lines are loaded (a torn final
  // line is cut off); without it, an existing file is an error (never overwrite results).
  static absl::StatusOr<std::unique_ptr<ResultLog>> open(const std::string& path, bool resume);
  ~ResultLog();

  // Appends one line and flushes it to the OS.
  absl::Status append(const RequestResult& result);
  // Request ids already present (loaded on resume or appended since).
  const std::set<std::string>& done() const { return done_; }
  const std::vector<RequestResult>& results() const { return results_; }

 private:
  explicit ResultLog(std::FILE* file) : file_(file) {}
  std::FILE* file_;
  std::set<std::string> done_;
  std::vector<RequestResult> results_;
};

// Loads every complete line of a results file (for reports).
absl::StatusOr<std::vector<RequestResult>> loadResults(const std::string& path);

}  // namespace kvf::experiments
