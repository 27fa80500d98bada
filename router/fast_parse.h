// Single-pass read of the common request shape: a /v1/completions body whose "prompt" is a
// flat array of token ids. A strict JSON scanner collects model, stream, max_tokens, user and
// the token ids without building a DOM (a 100k-token prompt is 100k DOM values) and validates
// the rest of the document as it skips it. Anything else - text or batch prompts, unexpected types,
// duplicate fields, bad JSON - answers nullopt and parseRequest() takes the DOM path, which owns
// every error message, so both paths accept and reject the same bodies. Pure; safe from any thread.
#pragma once

#include <optional>
#include <string_view>

#include "router/request_parse.h"

namespace kvf::router {

// The body-derived fields of ParsedRequest (session = body "user" only; the caller applies the
// X-Session-Id header and the session length bound). nullopt: use the DOM path.
std::optional<ParsedRequest> fastParseTokenCompletion(std::string_view body);

}  // namespace kvf::router
