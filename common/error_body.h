// The error body and its `param`: vLLM (v0.10.1 on) and OpenAI answer
// {"error": {"message", "type", "param", "code"}}, `param` the request field at fault (null
// when none) and `code` the HTTP status; the openai SDKs expose both. A status carries its param
// as a payload (withParam) from where the field is known to the HTTP layer that writes the body.
// Header functions are pure; safe from any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace kvf::json {

std::string errorBodyWithParam(std::string_view message, std::string_view type, int code,
                               std::optional<std::string_view> param);

// The request field a validation message names, where the error did not carry one:
// `missing field "x"`, `"x" must ...`, `'x' must ...`, `x[3] ...`, `x.y ...`, `x: ...`;
// nullopt when it names none.
std::optional<std::string> paramFromMessage(std::string_view message);

// `status` with `param` attached (a non-OK status only), and the param a status carries.
absl::Status withParam(absl::Status status, std::string_view param);
std::optional<std::string> paramOf(const absl::Status& status);

}  // namespace kvf::json
