// The router's side of the KV push contract (protocol/openai.h holds the types and their one
// parse/serialize; docs/protocols.md, kv_transfer_params): building the bodies sent to D
// (push-migrate, decode half of an offload) and to P (prefill half), and reading P's answer and
// D's kv_transfer_result. Client-supplied kv_transfer_params are always stripped: only the
// router may point an engine at a peer. Pure; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/value.hpp>

#include "absl/status/statusor.h"
#include "protocol/openai.h"
#include "router/core/config.h"

namespace kvf::router {

// What D receives: source (worker URL of the holder or P), block_hashes (absent: D's own prompt
// hashes), lease_id (from P's answer; empty for push-migrate).
using protocol::KvTransferParams;
using protocol::KvTransferResult;
using protocol::TransferOutcome;

// Bounds on what a peer may hand back.
inline constexpr size_t kMaxTransferBlockHashes = size_t{1} << 20;
inline constexpr size_t kMaxLeaseIdBytes = 256;

// The request body with the client's `kv_transfer_params` removed (`client_params`: the parse
// found the member, ParsedRequest::has_kv_transfer_params) and, if `params` is given, ours
// added. Removal works on the parsed document, never on the text: a key spelled with escapes
// is the same key to the engine's parser. `body` must be a JSON object (parseRequest checked).
absl::StatusOr<std::string> withKvTransferParams(std::string_view body, bool client_params,
                                                 const KvTransferParams* params);

// The prefill half of an offload: non-streaming, max_tokens 1 (max_completion_tokens,
// min_tokens and stream_options dropped, n = 1) and kv_transfer_params {do_remote_decode: true,
// lease_ms}.
absl::StatusOr<std::string> remotePrefillBody(std::string_view body, int64_t lease_ms);

// P's answer: its `kv_transfer_params` {source, block_hashes, lease_id}, validated and bounded;
// block_hashes must be present and non-empty. The source is replaced by `worker_url` (P's
// configured worker): a peer never redirects D.
absl::StatusOr<KvTransferParams> parseRemotePrefillResponse(std::string_view body,
                                                            std::string_view worker_url);

// NixlConnector dialect. The first leg, as vLLM's toy_proxy_server builds it: the client's
// body with kv_transfer_params {do_remote_decode: true, do_remote_prefill: false, remote_*:
// null}, stream false, max_tokens 1 (max_completion_tokens 1 when present), stream_options,
// min_tokens and min_completion_tokens removed.
absl::StatusOr<std::string> nixlPrefillBody(std::string_view body);
// Where the router lets a holder's NIXL answer send D: the holder's side channel as the
// router's registry names it (an instance's worker_url, else only the host of its url).
struct NixlSideChannel {
  std::string host;
  std::optional<uint16_t> port;  // nullopt: any port on `host`
};
// The side channel that `holder`'s config names.
NixlSideChannel nixlSideChannel(const InstanceConfig& holder);
// P's answer: its kv_transfer_params object, returned unchanged once it holds every field D
// needs (protocol::parseNixlRemoteParams) and its remote_host / remote_port name `side_channel`
// (a peer never redirects D, which sends its worker token there); InvalidArgument for null (P
// kept nothing) or a missing field, so that D never gets params it will not read;
// PermissionDenied for a side channel the registry does not name.
absl::StatusOr<boost::json::value> parseNixlPrefillResponse(std::string_view body,
                                                            const NixlSideChannel& side_channel);
// The client's body (its kv_transfer_params stripped) with `params` as kv_transfer_params.
absl::StatusOr<std::string> withRawKvTransferParams(std::string_view body,
                                                    const boost::json::value& params);

// From a response body or stream event: usage.prompt_tokens_details.cached_tokens and
// kv_transfer_result (D's report on the transfer), each when present (a parse is attempted only
// when the text names them). A status name this build does not know reads as kUnknown.
struct ResponseReport {
  std::optional<int64_t> cached_tokens;
  std::optional<KvTransferResult> transfer;
};
ResponseReport readResponseReport(std::string_view json_text);

}  // namespace kvf::router
