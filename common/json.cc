#include "common/json.h"

#include <cmath>

#include "common/error_body.h"
#include "common/strings.h"

namespace kvf::json {

namespace {

constexpr int kDefaultMaxDepth = 64;
// Documents above this size get their DOM from one monotonic arena (a few large blocks
// instead of one allocation per string/array), freed with the value.
constexpr size_t kArenaThresholdBytes = 64 * 1024;

bj::parse_options parseOptions(int max_depth) {
  bj::parse_options options;
  options.max_depth = static_cast<std::size_t>(max_depth);
  return options;
}

}  // namespace

absl::StatusOr<bj::value> parse(std::string_view text, int max_depth, bj::storage_ptr storage) {
  boost::system::error_code ec;
  if (storage.get() == bj::storage_ptr().get() && text.size() > kArenaThresholdBytes) {
    storage = bj::make_shared_resource<bj::monotonic_resource>();
  }
  bj::value v;
  if (max_depth == kDefaultMaxDepth) {
    // One parser per thread: its value stack keeps the capacity grown by earlier documents,
    // so a 100k-token prompt does not regrow (and page-fault) it on every request.
    thread_local bj::parser parser(bj::storage_ptr(), parseOptions(kDefaultMaxDepth));
    parser.reset(std::move(storage));
    parser.write(text.data(), text.size(), ec);
    if (!ec) v = parser.release();
    parser.reset();
  } else {
    v = bj::parse(bj::string_view(text.data(), text.size()), ec, std::move(storage),
                  parseOptions(max_depth));
  }
  if (ec) return absl::InvalidArgumentError(strCat("malformed JSON: ", ec.message()));
  return v;
}

absl::StatusOr<bj::object> parseObject(std::string_view text, int max_depth,
                                       bj::storage_ptr storage) {
  auto v = parse(text, max_depth, std::move(storage));
  if (!v.ok()) return v.status();
  if (!v->is_object()) return absl::InvalidArgumentError("request body must be a JSON object");
  return std::move(v->as_object());
}

std::string errorBody(std::string_view message, std::string_view type, int code) {
  return errorBodyWithParam(message, type, code, std::nullopt);
}

std::string_view errorTypeForStatus(int status) {
  switch (status) {
    case 400:
    case 411:
    case 413:
    case 415:
    case 422:
    case 431:
      return "invalid_request_error";
    case 401:
    case 403:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 405:
      return "method_not_allowed";
    case 408:
      return "timeout_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

namespace {

const bj::value* field(const bj::object& obj, std::string_view key) {
  auto it = obj.find(bj::string_view(key.data(), key.size()));
  if (it == obj.end() || it->value().is_null()) return nullptr;
  return &it->value();
}

absl::Status wrongType(std::string_view key, std::string_view expected) {
  return absl::InvalidArgumentError(strCat("'", key, "' must be ", expected));
}

absl::Status missing(std::string_view key) {
  return absl::NotFoundError(strCat("'", key, "' is required"));
}

}  // namespace

absl::StatusOr<int64_t> getInt(const bj::object& obj, std::string_view key) {
  const bj::value* v = field(obj, key);
  if (!v) return missing(key);
  if (v->is_int64()) return v->as_int64();
  if (v->is_uint64()) {
    if (v->as_uint64() > static_cast<uint64_t>(INT64_MAX))
      return wrongType(key, "an integer in range");
    return static_cast<int64_t>(v->as_uint64());
  }
  if (v->is_double()) {
    double d = v->as_double();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15)
      return static_cast<int64_t>(d);
  }
  return wrongType(key, "an integer");
}

absl::StatusOr<double> getNumber(const bj::object& obj, std::string_view key) {
  const bj::value* v = field(obj, key);
  if (!v) return missing(key);
  if (v->is_double()) return v->as_double();
  if (v->is_int64()) return static_cast<double>(v->as_int64());
  if (v->is_uint64()) return static_cast<double>(v->as_uint64());
  return wrongType(key, "a number");
}

absl::StatusOr<bool> getBool(const bj::object& obj, std::string_view key) {
  const bj::value* v = field(obj, key);
  if (!v) return missing(key);
  if (v->is_bool()) return v->as_bool();
  return wrongType(key, "a boolean");
}

absl::StatusOr<std::string_view> getString(const bj::object& obj, std::string_view key) {
  const bj::value* v = field(obj, key);
  if (!v) return missing(key);
  if (v->is_string()) return std::string_view(v->as_string().data(), v->as_string().size());
  return wrongType(key, "a string");
}

absl::StatusOr<int64_t> getIntOr(const bj::object& obj, std::string_view key, int64_t fallback) {
  if (!field(obj, key)) return fallback;
  return getInt(obj, key);
}

absl::StatusOr<double> getNumberOr(const bj::object& obj, std::string_view key, double fallback) {
  if (!field(obj, key)) return fallback;
  return getNumber(obj, key);
}

absl::StatusOr<bool> getBoolOr(const bj::object& obj, std::string_view key, bool fallback) {
  if (!field(obj, key)) return fallback;
  return getBool(obj, key);
}

}  // namespace kvf::json
