// The OpenAI-API side of the contracts between the router and engines: the request kinds, the
// `kv_transfer_params` a request carries (vLLM's P/D connector field, with kvfabric's push and
// lease members) and the `kv_transfer_result` an engine reports, with the transfer outcome as an
// enum and its wire names. One parse and one serialize for each, used by both sides; parsing
// bounds every size and names the field in errors (peers are not trusted). Pure functions; safe
// from any thread. docs/protocols.md, "kv_transfer_params", describes the fields.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include "absl/status/statusor.h"
#include "protocol/wire_types.h"

namespace kvf::protocol {

// The two OpenAI request kinds both sides serve.
enum class ApiKind { kCompletions, kChat };
// "/v1/completions" or "/v1/chat/completions".
std::string_view apiPath(ApiKind kind);

inline constexpr std::string_view kKvTransferParamsKey = "kv_transfer_params";
inline constexpr std::string_view kKvTransferResultKey = "kv_transfer_result";

// kv_transfer_params as kvfabric reads and writes them. Receiver (D): `source` set, optionally
// with the holder's `block_hashes` and a `lease_id` to release. Prefill side of an offload (P):
// `do_remote_decode`, optionally `lease_ms`. Members vLLM's connectors add (remote_engine_id,
// ...) are not represented: an engine echoes the client's object as given.
struct KvTransferParams {
  std::string source;  // the holder's worker URL, http://host:port
  std::optional<std::vector<EngineBlockHash>> block_hashes;  // absent: the prompt's own
  std::string lease_id;
  int64_t deadline_ms = 0;  // 0: the receiver's default
  bool do_remote_decode = false;
  int64_t lease_ms = 0;  // 0: the holder's default

  // True when the params ask an engine to act (fetch from a source, or hold a lease).
  bool namesTransfer() const { return !source.empty() || do_remote_decode; }
  bool operator==(const KvTransferParams&) const = default;
};

struct KvTransferLimits {
  size_t max_block_hashes = size_t{1} << 20;
  size_t max_source_bytes = 512;
  size_t max_lease_id_bytes = 256;
  int64_t max_deadline_ms = 60'000;
  int64_t max_lease_ms = 86'400'000;
};

// InvalidArgument naming "kv_transfer_params.<field>" for a member of the wrong type or out of
// range, or for source and do_remote_decode together. Members it does not know are ignored.
absl::StatusOr<KvTransferParams> parseKvTransferParams(const boost::json::value& params,
                                                       const KvTransferLimits& limits);
// Only the members that are set (non-empty, non-zero, true).
boost::json::object kvTransferParamsJson(const KvTransferParams& params);

// ---- vLLM's NixlConnector dialect (docs/protocols.md, "NixlConnector dialect") ----
// The first leg goes to the prefill (or cache-holding) instance P with nixlPrefillLegParams();
// P answers with NixlRemoteParams (remote_* naming its blocks and side channel); the second leg
// carries P's object unchanged to the decode instance D, which reads the blocks.

// {do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids:
// null, remote_host: null, remote_port: null}, exactly as vLLM's toy_proxy_server sends it.
boost::json::object nixlPrefillLegParams();

// True for a D leg: `do_remote_prefill` is true.
bool isNixlDecodeLeg(const boost::json::value& params);

// What P returns and D needs. remote_block_ids is read flat ([ids], before v0.18) or per KV
// cache group ([[ids], ...]); group 0 holds the attention blocks D reads.
struct NixlRemoteParams {
  std::string remote_engine_id;
  std::vector<std::vector<uint64_t>> remote_block_ids;
  std::string remote_request_id;  // empty only when parsed with require_request_id false
  std::string remote_host;
  uint16_t remote_port = 0;
  int64_t tp_size = 1;
  int64_t remote_num_tokens = -1;  // -1: absent (before v0.21)
  bool operator==(const NixlRemoteParams&) const = default;
};

// Parses P's kv_transfer_params as D (and the router) must: InvalidArgument naming the first
// missing or malformed field of remote_block_ids, remote_engine_id, remote_request_id (when
// required: vLLM v0.13+), remote_host, remote_port - vLLM's "Got invalid KVTransferParams".
absl::StatusOr<NixlRemoteParams> parseNixlRemoteParams(const boost::json::value& params,
                                                       const KvTransferLimits& limits,
                                                       bool require_request_id = true);
// P's answer in the newest shape (blocks per group, remote_num_tokens, remote_blocks_expiry_time
// null), members in vLLM's order.
boost::json::object nixlRemoteParamsJson(const NixlRemoteParams& params);

// What happened to the KV a receiver asked a holder for.
enum class TransferOutcome {
  kOk,        // every requested block arrived and was used
  kPartial,   // a leading part arrived; the rest was computed locally
  kFallback,  // nothing arrived; the whole prompt was computed locally
  kUnknown,   // a peer reported a name this build does not know (a newer engine)
};
// "ok", "partial", "fallback" ("unknown" for kUnknown).
std::string_view transferOutcomeName(TransferOutcome outcome);
// kUnknown for any other name.
TransferOutcome parseTransferOutcome(std::string_view name);
// The outcome of `used` blocks out of `requested`.
TransferOutcome transferOutcomeFor(size_t used, size_t requested);

// kv_transfer_result: a receiver's report on the transfer, in its response (the final chunk
// when streaming).
struct KvTransferResult {
  TransferOutcome outcome = TransferOutcome::kFallback;
  int64_t pushed_tokens = 0;
  int64_t pushed_bytes = 0;
  int64_t requested_tokens = 0;
  std::string reason;  // why not everything arrived; empty when it did
  bool operator==(const KvTransferResult&) const = default;
};

inline constexpr size_t kMaxTransferReasonBytes = 256;

boost::json::object kvTransferResultJson(const KvTransferResult& result);
// Lenient, for a peer's report: nullopt without a string "status"; integers that are missing or
// of the wrong type read as 0; the reason is cut to kMaxTransferReasonBytes.
std::optional<KvTransferResult> parseKvTransferResult(const boost::json::object& result);

}  // namespace kvf::protocol
