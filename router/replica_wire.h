// The wire form of router replicas' load messages (router/core/peer_load.h), sent over ZMQ
// PUB/SUB as two frames: a msgpack payload and its HMAC-SHA256 under a key derived from the
// cluster's worker token. The payload is
//   ["kvf-replica-load", 1, kind (0 delta, 1 snapshot), replica, epoch, seq, sent_unix_ns,
//    [[instance, running, pending_prefill_tokens, ongoing_tokens], ...]]
// Decoding assumes a hostile sender: the MAC is checked before anything is parsed, and every
// count and string is bounded. Pure functions, safe from any thread.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "router/core/peer_load.h"

namespace kvf::router {

// HMAC-SHA256(worker_token, a label of its own), so replica messages and kv_transfer_params
// never share a key. Empty for an empty token.
std::string replicaLoadKey(std::string_view worker_token);

struct ReplicaWireLimits {
  size_t max_entries = 1024;
  size_t max_id_bytes = 256;  // replica and instance ids
};

std::string encodeReplicaMessage(const ReplicaMessage& message);
std::string signReplicaPayload(std::string_view key, std::string_view payload);  // 32 bytes

// PermissionDenied when `mac` is not the payload's MAC under `key`; InvalidArgument naming
// the field when the payload is malformed or past `limits`.
absl::StatusOr<ReplicaMessage> decodeReplicaMessage(std::string_view key, std::string_view payload,
                                                    std::string_view mac,
                                                    const ReplicaWireLimits& limits = {});

}  // namespace kvf::router
