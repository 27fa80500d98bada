// The worker control API used for KV push (docs/protocols.md, "KV push"):
// GET /kv/info (a worker's transport address and block geometry) and POST /kv/push (a receiver
// asks a holder to push blocks into its registered KV pool). Parsing bounds every count and
// size, because peers are not trusted; errors name the field. Pure functions; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "protocol/wire_types.h"

namespace kvf::protocol {

struct PushLimits {
  size_t max_blocks = 65536;        // block_hashes / block_addrs per push
  size_t max_blob_bytes = 1 << 17;  // base64 transport address or rkey
  size_t max_string_bytes = 1024;   // ids
};

// GET /kv/info answer.
struct WorkerInfo {
  std::string instance_id;
  std::string transport_address;  // base64 of the opaque transport worker address
  std::string transports;         // what UCX resolved, for logs
  int64_t block_size = 0;         // tokens per block
  uint64_t block_bytes = 0;       // payload bytes per block
};

// POST /kv/push body. The holder pushes the leading run of `block_hashes` it holds; block i
// goes to `block_addrs[i]` (block_bytes each) in the receiver's region with rkey `rkey`, and
// the put's completion notice names `landing_id`. Before any write the holder claims the
// landing from the receiver's own worker API at `receiver_url` (POST /kv/claim) and writes only
// what the receiver's answer (a LandingGrant) names, with the address and key from that answer.
struct PushRequest {
  std::string request_id;    // for logs
  std::string receiver_url;  // the receiver's worker URL, http://host:port
  std::vector<EngineBlockHash> block_hashes;
  std::string receiver_address;  // base64 of the receiver's transport worker address
  std::string rkey;              // base64 of the packed remote key of the receiver's region
  std::vector<uint64_t> block_addrs;
  uint64_t block_bytes = 0;
  uint64_t landing_id = 0;
  int64_t deadline_ms = 1000;  // for the put, from when the holder received the request
  std::string lease_id;        // optional: release this remote-decode lease when done
};

// POST /kv/push answer (HTTP 200 whenever the request was valid). `error` empty: the put
// completed (flushed, notice sent) or nothing was pushed; otherwise the put failed and
// `put_issued` says whether writes may still reach the receiver.
struct PushResponse {
  std::vector<EngineBlockHash> pushed_hashes;  // the leading run pushed, in order
  std::vector<uint64_t> checksums;             // xxh3-64 per pushed block as the holder sent it
  std::vector<EngineBlockHash>
      missing_hashes;  // the rest of block_hashes (not held, or after a gap)
  uint64_t pushed_bytes = 0;
  bool put_issued = false;
  std::string error;
  int64_t elapsed_us = 0;  // holder-side time from request to completion
};

// NixlConnector side channel (docs/protocols.md, "NixlConnector dialect"): what a decode
// instance's worker asks the holder's worker before it reads (vLLM's handshake, GET_META_MSG,
// plus the heartbeat that extends the lease) and the notification that ends the hold.
// POST /kv/nixl/meta body: the holder's request id (its lease) and the block ids D will read.
struct NixlMetaRequest {
  std::string remote_request_id;
  std::vector<uint64_t> block_ids;
};

// POST /kv/nixl/meta answer (HTTP 200; 404 when no lease holds the request's blocks). Each
// entry of `block_ids` that the lease holds comes back with the block's engine hash and the
// xxh3-64 of its payload now; the lease was extended (a heartbeat).
struct NixlMetaResponse {
  std::string engine_id;
  // base64 of the packed remote key of the holder's KV pool (transport/remote_key.h): it carries
  // the pool's base address and length, which the reader checks every block against.
  std::string rkey;
  std::vector<uint64_t> block_ids;
  std::vector<EngineBlockHash> block_hashes;
  std::vector<uint64_t> checksums;
  int64_t lease_remaining_ms = 0;
};

// POST /kv/nixl/notify body: D is done with the blocks of `remote_request_id` (read, or given
// up); the holder releases its lease.
struct NixlNotify {
  std::string remote_request_id;
};

std::string serializeNixlMetaRequest(const NixlMetaRequest& r);
absl::StatusOr<NixlMetaRequest> parseNixlMetaRequest(std::string_view body,
                                                     const PushLimits& limits);
std::string serializeNixlMetaResponse(const NixlMetaResponse& r);
absl::StatusOr<NixlMetaResponse> parseNixlMetaResponse(std::string_view body,
                                                       const PushLimits& limits);
std::string serializeNixlNotify(const NixlNotify& r);
absl::StatusOr<NixlNotify> parseNixlNotify(std::string_view body, const PushLimits& limits);

// POST /kv/claim body: a holder claims an outstanding landing of this (receiving) worker.
struct LandingClaim {
  uint64_t landing_id = 0;
};

// POST /kv/claim answer: what the holder may write for the landing, and nothing else. A
// landing is granted once; unknown, closed or already claimed landings are refused (4xx).
struct LandingGrant {
  uint64_t landing_id = 0;
  std::string transport_address;  // base64 of the receiver's transport worker address
  std::string rkey;               // base64 of the packed remote key of the landing region
  std::vector<uint64_t> block_addrs;
  uint64_t block_bytes = 0;
};

std::string serializeWorkerInfo(const WorkerInfo& info);
absl::StatusOr<WorkerInfo> parseWorkerInfo(std::string_view body, const PushLimits& limits);
std::string serializePushRequest(const PushRequest& request);
absl::StatusOr<PushRequest> parsePushRequest(std::string_view body, const PushLimits& limits);
std::string serializePushResponse(const PushResponse& response);
absl::StatusOr<PushResponse> parsePushResponse(std::string_view body, const PushLimits& limits);
std::string serializeLandingClaim(const LandingClaim& claim);
absl::StatusOr<LandingClaim> parseLandingClaim(std::string_view body);
std::string serializeLandingGrant(const LandingGrant& grant);
absl::StatusOr<LandingGrant> parseLandingGrant(std::string_view body, const PushLimits& limits);

}  // namespace kvf::protocol
