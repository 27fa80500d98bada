// Boost.JSON helpers: parsing with a Status result, typed field access with clear errors,
// and OpenAI-style error bodies. Stateless; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <boost/json.hpp>

#include "absl/status/statusor.h"

namespace kvf::json {

namespace bj = boost::json;

// Parses a JSON document; `max_depth` bounds nesting so hostile input cannot exhaust the stack.
// `storage` (e.g. a caller-owned bj::monotonic_resource for a document that dies with the
// request) holds the DOM; by default large documents get a shared arena of their own.
absl::StatusOr<bj::value> parse(std::string_view text, int max_depth = 64,
                                bj::storage_ptr storage = {});

// Parses and requires a top-level object.
absl::StatusOr<bj::object> parseObject(std::string_view text, int max_depth = 64,
                                       bj::storage_ptr storage = {});

// `{"error": {"message": ..., "type": ..., "code": ...}}` as serialized text.
std::string errorBody(std::string_view message, std::string_view type, int code);

// The OpenAI error `type` conventionally used for an HTTP status.
std::string_view errorTypeForStatus(int status);

// Typed accessors on an object field: NotFound when absent (or null), InvalidArgument naming the
// field when present with the wrong type or out of range.
absl::StatusOr<int64_t> getInt(const bj::object& obj, std::string_view key);
absl::StatusOr<double> getNumber(const bj::object& obj, std::string_view key);
absl::StatusOr<bool> getBool(const bj::object& obj, std::string_view key);
absl::StatusOr<std::string_view> getString(const bj::object& obj, std::string_view key);

// Like the getters above, but absent/null gives `fallback`.
absl::StatusOr<int64_t> getIntOr(const bj::object& obj, std::string_view key, int64_t fallback);
absl::StatusOr<double> getNumberOr(const bj::object& obj, std::string_view key, double fallback);
absl::StatusOr<bool> getBoolOr(const bj::object& obj, std::string_view key, bool fallback);

// Serializes a value.
inline std::string serialize(const bj::value& v) { return bj::serialize(v); }

}  // namespace kvf::json
