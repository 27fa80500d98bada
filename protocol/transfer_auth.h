// Authentication of kv_transfer_params from the router to an engine (docs/security.md): the
// router signs the params it adds with HMAC-SHA256 under a key derived from the cluster's worker
// token, bound to the request id, a timestamp and a random nonce, and sends the signature in the
// `x-kvf-transfer-auth` header. An engine acts on kv_transfer_params (fetches from a source,
// holds a lease) only when the signature verifies, the timestamp is within the freshness window
// and the nonce was not seen before. Because the source URL is signed, an engine only sends its
// worker token to a worker URL the router's registry named.
// signKvTransfer is pure (safe from any thread); a TransferAuthVerifier belongs to one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_set>

#include "absl/status/status.h"
#include "protocol/openai.h"

namespace kvf::protocol {

inline constexpr std::string_view kTransferAuthHeader = "x-kvf-transfer-auth";

// The signing key for kv_transfer_params: HMAC-SHA256(worker_token, a fixed label), so the token
// itself never signs and a leaked signature reveals nothing about it. Empty for an empty token.
std::string transferAuthKey(std::string_view worker_token);

// 16 random bytes from the system's CSPRNG, hex-encoded (32 characters).
std::string randomNonce();

// The header value "v1 <unix_ms> <nonce> <mac>" for `params` sent with `request_id` (the
// x-request-id header of the same request). `nonce`: randomNonce(). The MAC covers the whole
// kv_transfer_params object as Boost.JSON serializes it (members an engine does not act on
// today, e.g. a connector's remote_* fields, are covered too), so the sender must send exactly
// that object: kvTransferParamsJson(params) for the first form.
std::string signKvTransfer(std::string_view key, const KvTransferParams& params,
                           std::string_view request_id, int64_t unix_ms, std::string_view nonce);
std::string signKvTransfer(std::string_view key, const boost::json::value& params,
                           std::string_view request_id, int64_t unix_ms, std::string_view nonce);

struct TransferAuthOptions {
  int64_t freshness_ms = 30'000;  // |now - signed time| at most this
  size_t max_remembered_nonces = size_t{1} << 16;
};

// Checks signed kv_transfer_params on an engine, remembering the nonces it accepted for the
// freshness window (a replayed header is refused). Not thread-safe: one per HTTP thread.
class TransferAuthVerifier {
 public:
  TransferAuthVerifier(std::string key, TransferAuthOptions options);

  // OK when `header` is a valid signature of `params` and `request_id`, fresh and not seen
  // before; PermissionDenied naming what failed otherwise (ResourceExhausted when the nonce
  // memory is full of fresh entries).
  absl::Status verify(std::string_view header, const boost::json::value& params,
                      std::string_view request_id, int64_t now_unix_ms);

 private:
  void forgetExpired(int64_t now_unix_ms);

  std::string key_;
  TransferAuthOptions options_;
  std::unordered_set<std::string> seen_;
  std::deque<std::pair<int64_t, std::string>> by_time_;  // (signed unix ms, nonce), oldest first
};

}  // namespace kvf::protocol
