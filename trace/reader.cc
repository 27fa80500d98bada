#include "trace/reader.h"

#include <filesystem>

#include "absl/container/flat_hash_map.h"

#include "common/status.h"
#include "trace/agentic_reader.h"
#include "trace/json_line.h"
#include "trace/line_source.h"

namespace kvf::trace {

namespace {

constexpr size_t kMaxKeptProblems = 100;
constexpr int32_t kMooncakeBlockSize = 512;
constexpr int32_t kBailianBlockSize = 16;
constexpr size_t kMaxIdBytes = 4096;

// Reads one JSONL format; Mooncake and session lines share a field table (session is a
// superset), bailian has its own.
class JsonlReader final : public RequestReader {
 public:
  JsonlReader(std::unique_ptr<LineSource> source, TraceFormat format, ReaderOptions options)
      : source_(std::move(source)), format_(format), options_(std::move(options)) {}

  absl::StatusOr<bool> next(Request* out) override {
    std::string_view line;
    while (true) {
      KVF_ASSIGN_OR_RETURN(bool more, source_->next(&line));
      if (!more) return false;
      if (line.find_first_not_of(" \t") == std::string_view::npos) continue;  // blank line
      ReadProblem problem;
      if (parseLine(line, out, &problem)) return true;
      problem.file = source_->path();
      problem.line = source_->lineNumber();
      KVF_RETURN_IF_ERROR(report(options_.on_error, std::move(problem)));
    }
  }
  TraceFormat format() const override { return format_; }
  int64_t bytesRead() const override { return source_->bytesConsumed(); }
  int64_t bytesTotal() const override { return source_->fileSize(); }

 private:
  bool parseLine(std::string_view line, Request* out, ReadProblem* problem);
  bool parseField(std::string_view key, JsonLineScanner& s, Request* out, uint32_t* seen);
  bool validate(Request& r, uint32_t seen, ReadProblem* problem);

  std::unique_ptr<LineSource> source_;
  TraceFormat format_;
  ReaderOptions options_;
  absl::flat_hash_map<std::string, std::string> bailian_root_;  // chat_id -> session root
  int64_t parent_chat_ = -1;
  int64_t chat_id_ = -1;
};

enum Seen : uint32_t {
  kTimestamp = 1,
  kInput = 2,
  kOutput = 4,
  kHashIds = 8,
  kBlockSize = 16,
  kChatId = 32,
};

bool fieldError(ReadProblem* problem, std::string_view field, std::string message) {
  problem->field = std::string(field);
  problem->message = std::move(message);
  return false;
}

}  // namespace

std::string ReadProblem::toString() const {
  std::string out = file;
  if (line > 0) out += strCat(":", line);
  out += ": ";
  if (!field.empty()) out += strCat("field '", field, "': ");
  out += message;
  return out;
}

absl::Status RequestReader::report(OnError policy, ReadProblem problem) {
  if (policy == OnError::kStop) return absl::InvalidArgumentError(problem.toString());
  ++skipped_;
  if (problems_.size() < kMaxKeptProblems) problems_.push_back(std::move(problem));
  return absl::OkStatus();
}

bool JsonlReader::parseField(std::string_view key, JsonLineScanner& s, Request* out,
                             uint32_t* seen) {
  const bool bailian = format_ == TraceFormat::kBailian;
  if (key == "hash_ids") {
    *seen |= kHashIds;
    return s.readUintArray(&out->hash_ids);
  }
  if (key == "timestamp") {
    *seen |= kTimestamp;
    // Mooncake and session timestamps are milliseconds, bailian seconds; kept exactly in ns.
    return s.readScaled(bailian ? 9 : 6, &out->arrival);
  }
  if (key == "input_length") {
    *seen |= kInput;
    return s.readInt(&out->input_length);
  }
  if (key == "output_length") {
    *seen |= kOutput;
    return s.readInt(&out->output_length);
  }
  if (key == "type") return s.isNull() || s.readString(&out->type);
  if (key == "turn") {
    int64_t turn = 0;
    if (s.isNull()) return true;
    if (!s.readInt(&turn)) return false;
    if (turn < 0 || turn > (int64_t{1} << 30)) return false;
    out->turn = static_cast<int32_t>(turn);
    return true;
  }
  if (bailian) {
    if (key == "chat_id") {
      *seen |= kChatId;
      return s.readInt(&chat_id_);
    }
    if (key == "parent_chat_id") return s.isNull() || s.readInt(&parent_chat_);
    return s.skipValue();
  }
  if (key == "block_size") {
    int64_t bs = 0;
    *seen |= kBlockSize;
    if (!s.readInt(&bs)) return false;
    out->block_size = bs > 0 && bs <= (1 << 24) ? static_cast<int32_t>(bs) : -1;
    return true;
  }
  if (key == "session_id") return s.isNull() || s.readIdText(&out->session_id);
  if (key == "id") return s.isNull() || s.readIdText(&out->id);
  if (key == "parent_id") return s.isNull() || s.readIdText(&out->parent_id);
  if (key == "think_time_ms") {
    if (s.isNull()) return true;
    return s.readScaled(6, &out->think_time);
  }
  return s.skipValue();  // unknown fields are ignored (forward compatibility)
}

bool JsonlReader::parseLine(std::string_view line, Request* out, ReadProblem* problem) {
  out->arrival = 0;
  out->input_length = out->output_length = 0;
  out->block_size = 0;
  out->hash_ids.clear();
  out->id.clear();
  out->session_id.clear();
  out->parent_id.clear();
  out->type.clear();
  out->turn = 0;
  out->think_time = -1;
  parent_chat_ = -1;
  chat_id_ = -1;
  JsonLineScanner s(line);
  if (!s.begin()) return fieldError(problem, "", s.error());
  uint32_t seen = 0;
  std::string_view key;
  while (s.nextKey(&key)) {
    if (!parseField(key, s, out, &seen)) {
      if (s.error().starts_with("unexpected text after")) return fieldError(problem, "", s.error());
      return fieldError(problem, key, s.error().empty() ? "value out of range" : s.error());
    }
  }
  if (!s.done()) return fieldError(problem, "", s.error());
  return validate(*out, seen, problem);
}

bool JsonlReader::validate(Request& r, uint32_t seen, ReadProblem* problem) {
  static constexpr std::pair<uint32_t, std::string_view> kRequired[] = {{kTimestamp, "timestamp"},
                                                                        {kInput, "input_length"},
                                                                        {kOutput, "output_length"},
                                                                        {kHashIds, "hash_ids"}};
  for (const auto& [bit, name] : kRequired) {
    if ((seen & bit) == 0) return fieldError(problem, name, "missing");
  }
  if (r.arrival < 0) return fieldError(problem, "timestamp", "negative");
  if (r.input_length < 0) return fieldError(problem, "input_length", "negative");
  if (r.output_length < 0) return fieldError(problem, "output_length", "negative");
  if (r.think_time < -1) return fieldError(problem, "think_time_ms", "negative");
  if (r.block_size < 0) return fieldError(problem, "block_size", "must be in [1, 16777216]");
  if (r.id.size() > kMaxIdBytes || r.session_id.size() > kMaxIdBytes ||
      r.parent_id.size() > kMaxIdBytes) {
    return fieldError(problem, "id", "longer than 4096 bytes");
  }
  if (format_ == TraceFormat::kBailian) {
    if ((seen & kChatId) == 0) return fieldError(problem, "chat_id", "missing");
    r.block_size = kBailianBlockSize;
    r.id = std::to_string(chat_id_);
    std::string root = r.id;
    if (parent_chat_ >= 0) {
      r.parent_id = std::to_string(parent_chat_);
      // A parent outside the file (e.g. before a window) makes this chat its session's root.
      auto it = bailian_root_.find(r.parent_id);
      if (it != bailian_root_.end()) root = it->second;
    }
    r.session_id = root;
    bailian_root_.insert_or_assign(r.id, root);
  } else if (r.block_size == 0) {
    r.block_size = kMooncakeBlockSize;
  }
  if (options_.block_size > 0) r.block_size = options_.block_size;
  if (!blockCountConsistent(r)) {
    return fieldError(
        problem, "hash_ids",
        strCat("has ", r.hash_ids.size(), " ids; input_length ", r.input_length,
               " with block_size ", r.block_size, " needs ", r.input_length / r.block_size, " or ",
               (r.input_length + r.block_size - 1) / r.block_size));
  }
  return true;
}

std::string_view formatName(TraceFormat format) {
  switch (format) {
    case TraceFormat::kAuto:
      return "auto";
    case TraceFormat::kMooncake:
      return "mooncake";
    case TraceFormat::kSession:
      return "session";
    case TraceFormat::kBailian:
      return "bailian";
    case TraceFormat::kAgentic:
      return "agentic";
  }
  return "?";
}

absl::StatusOr<TraceFormat> parseFormatName(std::string_view name) {
  for (auto f : {TraceFormat::kAuto, TraceFormat::kMooncake, TraceFormat::kSession,
                 TraceFormat::kBailian, TraceFormat::kAgentic}) {
    if (formatName(f) == name) return f;
  }
  return absl::InvalidArgumentError(
      strCat("unknown trace format '", name, "' (auto, mooncake, session, bailian, agentic)"));
}

absl::StatusOr<TraceFormat> detectFormat(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return TraceFormat::kAgentic;
  KVF_ASSIGN_OR_RETURN(auto source, LineSource::open(path, size_t{1} << 28));
  std::string_view line;
  while (true) {
    KVF_ASSIGN_OR_RETURN(bool more, source->next(&line));
    if (!more) return TraceFormat::kMooncake;  // empty file: any JSONL format reads it
    if (line.find_first_not_of(" \t") != std::string_view::npos) break;
  }
  JsonLineScanner s(line);
  if (!s.begin()) {
    return absl::InvalidArgumentError(strCat(path, ":", source->lineNumber(), ": ", s.error()));
  }
  std::string_view key;
  TraceFormat format = TraceFormat::kMooncake;
  while (s.nextKey(&key)) {
    if (key == "chat_id") return TraceFormat::kBailian;
    if (key == "session_id" || key == "block_size" || key == "turn" || key == "id") {
      format = TraceFormat::kSession;
    }
    if (!s.skipValue()) break;
  }
  return format;
}

absl::StatusOr<std::unique_ptr<RequestReader>> openTrace(const std::string& path,
                                                         const ReaderOptions& options) {
  TraceFormat format = options.format;
  if (format == TraceFormat::kAuto) {
    KVF_ASSIGN_OR_RETURN(format, detectFormat(path));
  }
  if (format == TraceFormat::kAgentic) return openAgenticDirectory(path, options);
  KVF_ASSIGN_OR_RETURN(auto source, LineSource::open(path, options.max_line_bytes));
  return std::unique_ptr<RequestReader>(new JsonlReader(std::move(source), format, options));
}

absl::StatusOr<std::vector<Request>> readAll(const std::string& path,
                                             const ReaderOptions& options) {
  KVF_ASSIGN_OR_RETURN(auto reader, openTrace(path, options));
  std::vector<Request> out;
  Request r;
  while (true) {
    KVF_ASSIGN_OR_RETURN(bool more, reader->next(&r));
    if (!more) break;
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace kvf::trace
