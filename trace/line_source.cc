#include "trace/line_source.h"

#include <sys/stat.h>
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/strings.h"

namespace kvf::trace {

namespace {
constexpr size_t kReadChunk = size_t{4} << 20;
}

absl::StatusOr<std::unique_ptr<LineSource>> LineSource::open(const std::string& path,
                                                             size_t max_line_bytes) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::NotFoundError(strCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  int64_t size = ::fstat(fileno(file), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
  return std::unique_ptr<LineSource>(new LineSource(path, file, max_line_bytes, size));
}

LineSource::LineSource(std::string path, std::FILE* file, size_t max_line_bytes, int64_t file_size)
    : path_(std::move(path)),
      file_(file),
      max_line_bytes_(max_line_bytes),
      file_size_(file_size),
      // A file smaller than a read chunk needs no more than itself (fill() grows the buffer
      // when a line needs it): opening many small files does not zero 4 MiB each time.
      buffer_(std::min(kReadChunk, static_cast<size_t>(std::max<int64_t>(file_size, 0)) + 4096)) {}

LineSource::~LineSource() { std::fclose(file_); }

absl::Status LineSource::fill() {
  if (begin_ > 0) {
    std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  if (buffer_.size() - end_ < kReadChunk / 2) {
    if (buffer_.size() > max_line_bytes_ + kReadChunk) {
      return absl::InvalidArgumentError(
          strCat(path_, ":", line_number_ + 1, ": line longer than ", max_line_bytes_, " bytes"));
    }
    buffer_.resize(buffer_.size() * 2);
  }
  size_t n = std::fread(buffer_.data() + end_, 1, buffer_.size() - end_, file_);
  if (n == 0) {
    if (std::ferror(file_)) {
      return absl::DataLossError(strCat("read error on ", path_, ": ", std::strerror(errno)));
    }
    eof_ = true;
  }
  end_ += n;
  return absl::OkStatus();
}

absl::StatusOr<bool> LineSource::next(std::string_view* line) {
  size_t scanned = begin_;
  while (true) {
    const void* nl = std::memchr(buffer_.data() + scanned, '\n', end_ - scanned);
    if (nl != nullptr) {
      size_t pos = static_cast<size_t>(static_cast<const char*>(nl) - buffer_.data());
      size_t len = pos - begin_;
      if (len > max_line_bytes_) {
        return absl::InvalidArgumentError(
            strCat(path_, ":", line_number_ + 1, ": line longer than ", max_line_bytes_, " bytes"));
      }
      *line = std::string_view(buffer_.data() + begin_, len);
      if (!line->empty() && line->back() == '\r') line->remove_suffix(1);
      consumed_ += static_cast<int64_t>(len + 1);
      begin_ = pos + 1;
      ++line_number_;
      return true;
    }
    if (eof_) {
      if (begin_ == end_) return false;
      *line = std::string_view(buffer_.data() + begin_, end_ - begin_);
      if (!line->empty() && line->back() == '\r') line->remove_suffix(1);
      consumed_ += static_cast<int64_t>(end_ - begin_);
      begin_ = end_;
      ++line_number_;
      return true;
    }
    size_t unread = end_ - begin_;
    auto status = fill();
    if (!status.ok()) return status;
    scanned = begin_ + unread;
  }
}

}  // namespace kvf::trace
