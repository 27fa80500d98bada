// Writer for our session JSONL format: one request per line, a superset of Mooncake's fields
// (timestamp in ms, input_length, output_length, hash_ids) plus block_size and every optional
// field that is known. Reading the output back gives the same Requests. Single-threaded.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "trace/request.h"

namespace kvf::trace {

// Appends one session-JSONL line (with '\n') for `r` to `out`.
void appendSessionLine(const Request& r, std::string* out);

class SessionWriter {
 public:
  // Creates (truncates) `path`; "-" writes to stdout.
  static absl::StatusOr<std::unique_ptr<SessionWriter>> create(const std::string& path);
  ~SessionWriter();
  SessionWriter(const SessionWriter&) = delete;
  SessionWriter& operator=(const SessionWriter&) = delete;

  absl::Status write(const Request& r);
  // Flushes and closes; reports any write error. Called by the destructor if not before.
  absl::Status close();

 private:
  SessionWriter(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  absl::Status flushBuffer();

  std::string path_;
  std::FILE* file_;
  std::string buffer_;
};

}  // namespace kvf::trace
