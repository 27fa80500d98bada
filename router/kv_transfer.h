// The router's side of the KV push contract (docs/protocols.md, kv_transfer_params): building
// the bodies sent to D (push-migrate, decode half of an offload) and to P (prefill half), and
// reading P's answer and D's kv_transfer_result. Client-supplied kv_transfer_params are always
// stripped: only the router may point an engine at a peer. Pure; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvf::router {

// What the decoding instance D receives.
struct KvTransferParams {
  std::string source;                  // worker URL of the holder (or P)
  std::vector<uint64_t> block_hashes;  // empty: D uses its own prompt block hashes
  std::string lease_id;                // from P's answer; empty for push-migrate
};

// Bounds on what a peer may hand back.
inline constexpr size_t kMaxTransferBlockHashes = size_t{1} << 20;
inline constexpr size_t kMaxLeaseIdBytes = 256;

// The request body with any client `kv_transfer_params` removed and, if `params` is given,
// ours added. `body` must be a JSON object (parseRequest checked it).
absl::StatusOr<std::string> withKvTransferParams(std::string_view body,
                                                 const KvTransferParams* params);

// The prefill half of an offload: non-streaming, max_tokens 1 (max_completion_tokens,
// min_tokens and stream_options dropped, n = 1) and kv_transfer_params {do_remote_decode: true, lease_ms}.
absl::StatusOr<std::string> remotePrefillBody(std::string_view body, int64_t lease_ms);

// P's answer: its `kv_transfer_params` {source, block_hashes, lease_id}, validated and bounded.
// The source is replaced by `worker_url` (P's configured worker): a peer never redirects D.
absl::StatusOr<KvTransferParams> parseRemotePrefillResponse(std::string_view body,
                                                            std::string_view worker_url);

// D's report on the transfer (non-streaming body, or the final stream chunk).
struct KvTransferResult {
  std::string status;  // ok | partial | fallback (as the engine wrote it, at most 32 bytes)
  int64_t pushed_tokens = 0;
  int64_t pushed_bytes = 0;
  std::string reason;  // at most 256 bytes
};

// From a response body or stream event: usage.prompt_tokens_details.cached_tokens and
// kv_transfer_result, each when present (a parse is attempted only when the text names them).
struct ResponseReport {
  std::optional<int64_t> cached_tokens;
  std::optional<KvTransferResult> transfer;
};
ResponseReport readResponseReport(std::string_view json_text);

}  // namespace kvf::router
