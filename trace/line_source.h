// Buffered line-by-line file reading for the JSONL readers: large reads, lines returned as views
// into the buffer (valid until the next call), line numbers counted, line length bounded.
// Single-threaded.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvf::trace {

class LineSource {
 public:
  static absl::StatusOr<std::unique_ptr<LineSource>> open(const std::string& path,
                                                          size_t max_line_bytes);
  ~LineSource();
  LineSource(const LineSource&) = delete;
  LineSource& operator=(const LineSource&) = delete;

  // The next line without its '\n' (and '\r'); false at end of file.
  absl::StatusOr<bool> next(std::string_view* line);
  int64_t lineNumber() const { return line_number_; }
  int64_t bytesConsumed() const { return consumed_; }
  int64_t fileSize() const { return file_size_; }
  const std::string& path() const { return path_; }

 private:
  LineSource(std::string path, std::FILE* file, size_t max_line_bytes, int64_t file_size);
  absl::Status fill();

  std::string path_;
  std::FILE* file_;
  size_t max_line_bytes_;
  int64_t file_size_;
  std::vector<char> buffer_;
  size_t begin_ = 0;  // start of unread data
  size_t end_ = 0;    // end of valid data
  bool eof_ = false;
  int64_t line_number_ = 0;
  int64_t consumed_ = 0;
};

}  // namespace kvf::trace
