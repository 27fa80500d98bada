#include "common/error_body.h"

#include <cctype>

#include <boost/json.hpp>

#include "absl/strings/cord.h"

namespace kvf::json {
namespace {

constexpr char kParamPayloadUrl[] = "type.kvfabric/param";

}  // namespace

std::string errorBodyWithParam(std::string_view message, std::string_view type, int code,
                               std::optional<std::string_view> param) {
  namespace bj = boost::json;
  bj::object error;
  error["message"] = bj::string_view(message.data(), message.size());
  error["type"] = bj::string_view(type.data(), type.size());
  if (param) {
    error["param"] = bj::string_view(param->data(), param->size());
  } else {
    error["param"] = nullptr;
  }
  error["code"] = code;
  bj::object body;
  body["error"] = std::move(error);
  return bj::serialize(body);
}

std::optional<std::string> paramFromMessage(std::string_view message) {
  constexpr std::string_view kMissing = "missing field ";
  if (message.starts_with(kMissing)) message.remove_prefix(kMissing.size());
  if (message.starts_with('"') || message.starts_with('\'')) {
    size_t end = message.find(message[0], 1);
    if (end == std::string_view::npos || end == 1) return std::nullopt;
    message = message.substr(1, end - 1);
    return std::string(message.substr(0, message.find_first_of("[.")));
  }
  size_t end = 0;
  while (end < message.size() &&
         (std::isalnum(static_cast<unsigned char>(message[end])) || message[end] == '_')) {
    ++end;
  }
  if (end == 0 || end == message.size()) return std::nullopt;
  if (message[end] != '[' && message[end] != '.' && message[end] != ':') return std::nullopt;
  return std::string(message.substr(0, end));
}

absl::Status withParam(absl::Status status, std::string_view param) {
  if (!status.ok()) {
    status.SetPayload(kParamPayloadUrl, absl::Cord(absl::string_view(param.data(), param.size())));
  }
  return status;
}

std::optional<std::string> paramOf(const absl::Status& status) {
  auto param = status.GetPayload(kParamPayloadUrl);  // an absl::optional
  if (!param) return std::nullopt;
  return std::string(*param);
}

}  // namespace kvf::json
