// Streaming trace readers: one RequestReader per trace file or directory, yielding Requests in
// file order. Formats: Mooncake JSONL, our session JSONL (a superset of Mooncake's), Alibaba
// bailian JSONL and the agentic-coding conversation directory. Bad records are reported with
// file, line and field, then either stop reading or are skipped (ReaderOptions::on_error).
// A reader is single-threaded; distinct readers are independent.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "trace/request.h"

namespace kvf::trace {

enum class TraceFormat { kAuto, kMooncake, kSession, kBailian, kAgentic };

std::string_view formatName(TraceFormat format);
// "auto", "mooncake", "session", "bailian", "agentic".
absl::StatusOr<TraceFormat> parseFormatName(std::string_view name);

enum class OnError { kStop, kSkip };

// How conversations of the agentic-coding directory are placed on one time axis (the files have
// no absolute time). Turns inside a conversation keep their recorded offsets `t`.
struct ConversationArrivals {
  enum class Kind { kPoisson, kSequential };
  Kind kind = Kind::kPoisson;
  // kPoisson: conversation starts form a Poisson process with this rate (conversations/s),
  // drawn from `seed`. kSequential: each conversation starts `gap_s` after the previous one
  // started, in file-name order.
  double rate_per_s = 1.0 / 60.0;
  double gap_s = 60.0;
  uint64_t seed = 1;
};

struct ReaderOptions {
  TraceFormat format = TraceFormat::kAuto;
  OnError on_error = OnError::kStop;
  // Overrides the format's block size (Mooncake 512, bailian 16, session: per line, default
  // 512); 0 keeps the format's.
  int32_t block_size = 0;
  ConversationArrivals arrivals;
  // Lines longer than this are errors (bounds memory on corrupt input).
  size_t max_line_bytes = size_t{1} << 28;
};

// One rejected record.
struct ReadProblem {
  std::string file;
  int64_t line = 0;   // 1-based; 0 when not line-oriented
  std::string field;  // empty when the record as a whole is malformed
  std::string message;
  std::string toString() const;  // "file:line: field 'x': message"
};

class RequestReader {
 public:
  virtual ~RequestReader() = default;
  // Reads the next request into *out (every field is overwritten). Returns true when a request
  // was read and false at the end of the trace. Under OnError::kStop a bad record returns
  // InvalidArgument with ReadProblem::toString(); under kSkip it is counted, kept in problems()
  // (the first 100) and skipped. I/O errors always return an error.
  virtual absl::StatusOr<bool> next(Request* out) = 0;
  virtual TraceFormat format() const = 0;
  // Bytes of input consumed so far and the total (for progress; total 0 when unknown).
  virtual int64_t bytesRead() const = 0;
  virtual int64_t bytesTotal() const = 0;

  int64_t skipped() const { return skipped_; }
  const std::vector<ReadProblem>& problems() const { return problems_; }

 protected:
  // Records a problem; returns the error to return under kStop, or OK under kSkip.
  absl::Status report(OnError policy, ReadProblem problem);

 private:
  int64_t skipped_ = 0;
  std::vector<ReadProblem> problems_;
};

// Detects the format of `path`: a directory is the agentic-coding format; a JSONL file is
// bailian when its first record has "chat_id", session when it has any of our session fields
// ("session_id", "block_size", "turn", "id"), else Mooncake.
absl::StatusOr<TraceFormat> detectFormat(const std::string& path);

// Opens a reader for `path` (a file, or a directory for kAgentic).
absl::StatusOr<std::unique_ptr<RequestReader>> openTrace(const std::string& path,
                                                         const ReaderOptions& options = {});

// Reads a whole trace into memory (tests, small traces, the sampler).
absl::StatusOr<std::vector<Request>> readAll(const std::string& path,
                                             const ReaderOptions& options = {});

}  // namespace kvf::trace
