#include "trace/writer.h"

#include <cerrno>
#include <charconv>
#include <cstring>

#include "common/strings.h"
#include "trace/json_line.h"

namespace kvf::trace {

namespace {

constexpr size_t kFlushBytes = size_t{1} << 20;

void appendInt(std::string* out, uint64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  out->append(buf, end);
}

void appendSigned(std::string* out, int64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  out->append(buf, end);
}

// Nanoseconds as exact decimal milliseconds ("1500", "1500.25").
void appendMillis(std::string* out, int64_t ns) {
  if (ns < 0) {
    out->push_back('-');
    ns = -ns;
  }
  appendInt(out, static_cast<uint64_t>(ns / 1000000));
  int64_t frac = ns % 1000000;
  if (frac == 0) return;
  char digits[7];
  for (int i = 5; i >= 0; --i) {
    digits[i] = static_cast<char>('0' + frac % 10);
    frac /= 10;
  }
  int len = 6;
  while (len > 0 && digits[len - 1] == '0') --len;
  out->push_back('.');
  out->append(digits, static_cast<size_t>(len));
}

}  // namespace

void appendSessionLine(const Request& r, std::string* out) {
  out->append("{\"timestamp\": ");
  appendMillis(out, r.arrival);
  out->append(", \"input_length\": ");
  appendSigned(out, r.input_length);
  out->append(", \"output_length\": ");
  appendSigned(out, r.output_length);
  out->append(", \"block_size\": ");
  appendSigned(out, r.block_size);
  if (!r.id.empty()) {
    out->append(", \"id\": ");
    appendJsonString(out, r.id);
  }
  if (!r.session_id.empty()) {
    out->append(", \"session_id\": ");
    appendJsonString(out, r.session_id);
  }
  if (r.turn > 0) {
    out->append(", \"turn\": ");
    appendSigned(out, r.turn);
  }
  if (!r.parent_id.empty()) {
    out->append(", \"parent_id\": ");
    appendJsonString(out, r.parent_id);
  }
  if (r.think_time >= 0) {
    out->append(", \"think_time_ms\": ");
    appendMillis(out, r.think_time);
  }
  if (!r.type.empty()) {
    out->append(", \"type\": ");
    appendJsonString(out, r.type);
  }
  out->append(", \"hash_ids\": [");
  for (size_t i = 0; i < r.hash_ids.size(); ++i) {
    if (i > 0) out->append(", ");
    appendInt(out, r.hash_ids[i]);
  }
  out->append("]}\n");
}

absl::StatusOr<std::unique_ptr<SessionWriter>> SessionWriter::create(const std::string& path) {
  std::FILE* file = path == "-" ? stdout : std::fopen(path.c_str(), "wb");
  if (file == nullptr) {
    return absl::PermissionDeniedError(strCat("cannot create ", path, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<SessionWriter>(new SessionWriter(path, file));
}

SessionWriter::~SessionWriter() { (void)close(); }

absl::Status SessionWriter::flushBuffer() {
  if (buffer_.empty()) return absl::OkStatus();
  size_t n = std::fwrite(buffer_.data(), 1, buffer_.size(), file_);
  buffer_.clear();
  if (n == 0 || std::ferror(file_)) {
    return absl::DataLossError(strCat("write error on ", path_, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status SessionWriter::write(const Request& r) {
  if (file_ == nullptr) return absl::FailedPreconditionError("writer is closed");
  appendSessionLine(r, &buffer_);
  if (buffer_.size() >= kFlushBytes) return flushBuffer();
  return absl::OkStatus();
}

absl::Status SessionWriter::close() {
  if (file_ == nullptr) return absl::OkStatus();
  absl::Status status = flushBuffer();
  int rc = file_ == stdout ? std::fflush(file_) : std::fclose(file_);
  file_ = nullptr;
  if (rc != 0 && status.ok()) {
    status = absl::DataLossError(strCat("closing ", path_, ": ", std::strerror(errno)));
  }
  return status;
}

}  // namespace kvf::trace
