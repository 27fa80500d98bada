#include "trace/agentic_reader.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "common/json.h"
#include "common/status.h"

namespace kvf::trace {

namespace {

namespace bj = boost::json;

constexpr int kIdShift = 40;
constexpr HashId kMaxLocalId = HashId{1} << kIdShift;
constexpr int kMaxSubagentDepth = 8;
// Bounds that keep every time and length inside int64_t nanoseconds and tokens, nested
// sub-agents' offsets included: about 115 days per time, 2^40 tokens per request.
constexpr double kMaxSeconds = 1e7;
constexpr double kMaxTokens = 1099511627776.0;

// A problem in one conversation file, with the JSON path of the field at fault.
struct FieldError {
  std::string field;
  std::string message;
};

std::optional<double> numberOf(const bj::value* v) {
  if (v == nullptr) return std::nullopt;
  if (v->is_int64()) return static_cast<double>(v->as_int64());
  if (v->is_uint64()) return static_cast<double>(v->as_uint64());
  if (v->is_double()) return v->as_double();
  return std::nullopt;
}

class ConversationParser {
 public:
  ConversationParser(HashId id_base, int32_t block_size, std::vector<Request>* out)
      : id_base_(id_base), block_size_(block_size), out_(out) {}

  // Appends the requests of `reqs` (one session) and, recursively, of nested sub-agents.
  std::optional<FieldError> walk(const bj::array& reqs, const std::string& path,
                                 const std::string& session, Nanos offset,
                                 const std::string& spawner, int depth) {
    if (depth > kMaxSubagentDepth) return FieldError{path, "sub-agents nested too deep"};
    int32_t turn = 0;
    std::string previous = spawner;
    for (size_t i = 0; i < reqs.size(); ++i) {
      std::string field = strCat(path, "[", i, "]");
      const bj::object* obj = reqs[i].if_object();
      if (obj == nullptr) return FieldError{field, "not an object"};
      auto t = numberOf(obj->if_contains("t"));
      if (!t || !(*t >= 0 && *t <= kMaxSeconds)) {
        return FieldError{field + ".t", strCat("missing or outside [0, ", kMaxSeconds, "] s")};
      }
      Nanos at = offset + secondsToNanos(*t);
      const bj::value* type = obj->if_contains("type");
      if (type != nullptr && type->is_string() && type->as_string() == "subagent") {
        const bj::value* nested = obj->if_contains("requests");
        if (nested == nullptr || !nested->is_array()) {
          return FieldError{field + ".requests", "missing or not an array"};
        }
        std::string agent = strCat("sub", ++subagents_);
        if (const bj::value* a = obj->if_contains("agent_id"); a != nullptr && a->is_string()) {
          agent = std::string(a->as_string());
        }
        auto err = walk(nested->as_array(), field + ".requests", session + "/" + agent, at,
                        previous, depth + 1);
        if (err) return err;
        continue;
      }
      Request r;
      r.arrival = at;
      r.block_size = block_size_;
      r.session_id = session;
      r.turn = ++turn;
      r.id = strCat(session, "#", turn);
      r.parent_id = previous;
      if (type != nullptr && type->is_string()) r.type = std::string(type->as_string());
      if (auto err = fillRequest(*obj, field, &r)) return err;
      previous = r.id;
      out_->push_back(std::move(r));
    }
    return std::nullopt;
  }

 private:
  std::optional<FieldError> fillRequest(const bj::object& obj, const std::string& field,
                                        Request* r) {
    auto in = numberOf(obj.if_contains("in"));
    auto out = numberOf(obj.if_contains("out"));
    auto tokens = [](std::optional<double> v) {
      return v && *v >= 0 && *v <= kMaxTokens && *v == std::floor(*v);
    };
    if (!tokens(in)) return FieldError{field + ".in", "missing, not an integer or past 2^40"};
    if (!tokens(out)) return FieldError{field + ".out", "missing, not an integer or past 2^40"};
    r->input_length = static_cast<int64_t>(*in);
    r->output_length = static_cast<int64_t>(*out);
    if (auto think = numberOf(obj.if_contains("think_time")); think) {
      if (!(*think >= 0 && *think <= kMaxSeconds)) {
        return FieldError{field + ".think_time", strCat("outside [0, ", kMaxSeconds, "] s")};
      }
      r->think_time = secondsToNanos(*think);
    }
    const bj::value* ids = obj.if_contains("hash_ids");
    if (ids == nullptr || !ids->is_array()) return FieldError{field + ".hash_ids", "missing"};
    r->hash_ids.reserve(ids->as_array().size());
    for (const bj::value& v : ids->as_array()) {
      int64_t local = v.is_int64() ? v.as_int64() : (v.is_uint64() ? -2 : -1);
      if (v.is_uint64() && v.as_uint64() < kMaxLocalId) local = static_cast<int64_t>(v.as_uint64());
      if (local < 0 || static_cast<HashId>(local) >= kMaxLocalId) {
        return FieldError{field + ".hash_ids", "ids must be integers in [0, 2^40)"};
      }
      r->hash_ids.push_back(id_base_ | static_cast<HashId>(local));
    }
    if (!blockCountConsistent(*r)) {
      return FieldError{field + ".hash_ids",
                        strCat("has ", r->hash_ids.size(), " ids for in=", r->input_length,
                               " and block_size ", r->block_size)};
    }
    return std::nullopt;
  }

  HashId id_base_;
  int32_t block_size_;
  std::vector<Request>* out_;
  int subagents_ = 0;
};

// Streams the directory in arrival order without holding it: conversation k starts at
// starts_[k] (non-decreasing in file order) and none of its requests comes earlier, so a
// file is parsed only once the merge reaches its start. Memory is the pending requests of the
// conversations that have started, not the trace. Ties keep file order, then file order of
// requests (the order a stable sort of the whole directory would give).
class AgenticReader final : public RequestReader {
 public:
  absl::Status open(const std::string& dir, const ReaderOptions& options);

  absl::StatusOr<bool> next(Request* out) override {
    while (next_file_ < files_.size() &&
           (heap_.empty() || starts_[next_file_] <= heap_.front().request.arrival)) {
      size_t index = next_file_++;
      KVF_RETURN_IF_ERROR(loadFile(index));
    }
    if (heap_.empty()) return false;
    std::pop_heap(heap_.begin(), heap_.end(), Later{});
    *out = std::move(heap_.back().request);
    heap_.pop_back();
    return true;
  }
  TraceFormat format() const override { return TraceFormat::kAgentic; }
  int64_t bytesRead() const override { return bytes_read_; }
  int64_t bytesTotal() const override { return bytes_total_; }

 private:
  struct Pending {
    Request request;
    size_t file = 0;
    size_t seq = 0;  // position inside its file
  };
  // Max-heap comparator that puts the earliest (arrival, file, seq) on top.
  struct Later {
    bool operator()(const Pending& a, const Pending& b) const {
      if (a.request.arrival != b.request.arrival) return a.request.arrival > b.request.arrival;
      if (a.file != b.file) return a.file > b.file;
      return a.seq > b.seq;
    }
  };

  absl::Status loadFile(size_t index);

  ReaderOptions options_;
  std::vector<std::filesystem::path> files_;
  std::vector<Nanos> starts_;
  size_t next_file_ = 0;
  std::vector<Pending> heap_;
  int64_t bytes_read_ = 0;
  int64_t bytes_total_ = 0;
};

absl::Status AgenticReader::loadFile(size_t index) {
  const std::filesystem::path& file = files_[index];
  std::ifstream in(file, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) return absl::DataLossError(strCat("cannot read ", file.string()));
  std::string body = text.str();
  bytes_read_ += static_cast<int64_t>(body.size());
  ReadProblem problem{file.string(), 0, "", ""};
  auto doc = json::parseObject(body);
  if (!doc.ok()) {
    problem.message = std::string(doc.status().message());
    return report(options_.on_error, std::move(problem));
  }
  int32_t block_size = options_.block_size;
  if (block_size <= 0) {
    auto bs = numberOf(doc->if_contains("block_size"));
    if (!bs || *bs < 1 || *bs > (1 << 24) || *bs != std::floor(*bs)) {
      problem.field = "block_size";
      problem.message = "missing or not a positive integer";
      return report(options_.on_error, std::move(problem));
    }
    block_size = static_cast<int32_t>(*bs);
  }
  std::string conversation = file.stem().string();
  if (const bj::value* id = doc->if_contains("id"); id != nullptr && id->is_string()) {
    conversation = std::string(id->as_string());
  }
  const bj::value* reqs = doc->if_contains("requests");
  if (reqs == nullptr || !reqs->is_array()) {
    problem.field = "requests";
    problem.message = "missing or not an array";
    return report(options_.on_error, std::move(problem));
  }
  std::vector<Request> parsed;
  ConversationParser parser(static_cast<HashId>(index + 1) << kIdShift, block_size, &parsed);
  if (auto err = parser.walk(reqs->as_array(), "requests", conversation, starts_[index], "", 0)) {
    problem.field = err->field;
    problem.message = err->message;
    return report(options_.on_error, std::move(problem));  // skip drops the whole conversation
  }
  for (size_t i = 0; i < parsed.size(); ++i) {
    heap_.push_back(Pending{std::move(parsed[i]), index, i});
    std::push_heap(heap_.begin(), heap_.end(), Later{});
  }
  return absl::OkStatus();
}

absl::Status AgenticReader::open(const std::string& dir, const ReaderOptions& options) {
  options_ = options;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.is_regular_file() && entry.path().extension() == ".json") {
      files_.push_back(entry.path());
      bytes_total_ += static_cast<int64_t>(entry.file_size(ec));
    }
  }
  if (ec) return absl::NotFoundError(strCat("cannot list ", dir, ": ", ec.message()));
  if (files_.size() >= (size_t{1} << (64 - kIdShift)) - 1) {
    return absl::InvalidArgumentError(strCat(dir, ": too many conversation files"));
  }
  std::sort(files_.begin(), files_.end());
  const ConversationArrivals& arrivals = options.arrivals;
  if (arrivals.kind == ConversationArrivals::Kind::kPoisson && !(arrivals.rate_per_s > 0)) {
    return absl::InvalidArgumentError("conversation arrival rate must be > 0");
  }
  std::mt19937_64 rng(arrivals.seed);
  double start_s = 0;
  for (size_t i = 0; i < files_.size(); ++i) {
    if (i > 0) {
      if (arrivals.kind == ConversationArrivals::Kind::kSequential) {
        start_s += arrivals.gap_s;
      } else {
        double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;  // [0, 1)
        start_s += -std::log1p(-u) / arrivals.rate_per_s;
      }
    }
    starts_.push_back(secondsToNanos(start_s));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RequestReader>> openAgenticDirectory(const std::string& dir,
                                                                    const ReaderOptions& options) {
  auto reader = std::make_unique<AgenticReader>();
  KVF_RETURN_IF_ERROR(reader->open(dir, options));
  return std::unique_ptr<RequestReader>(std::move(reader));
}

}  // namespace kvf::trace
