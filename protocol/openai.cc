#include "protocol/openai.h"

#include <cmath>

#include <boost/json.hpp>

#include "common/status.h"
#include "common/strings.h"

namespace kvf::protocol {
namespace bj = boost::json;
namespace {

absl::Status invalid(std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(strCat(kKvTransferParamsKey, ".", field, ": ", what));
}

absl::Status readString(const bj::object& o, std::string_view key, size_t max, std::string* out) {
  const bj::value* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) return absl::OkStatus();
  if (!v->is_string()) return invalid(key, "must be a string");
  if (v->as_string().size() > max) return invalid(key, strCat("longer than ", max, " bytes"));
  *out = std::string(v->as_string());
  return absl::OkStatus();
}

// An integer member in [0, max]: 1e3 counts as an integer, as JSON encoders write it.
absl::Status readCount(const bj::object& o, std::string_view key, int64_t max, int64_t* out) {
  const bj::value* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) return absl::OkStatus();
  int64_t x = 0;
  if (v->is_int64()) {
    x = v->as_int64();
  } else if (v->is_uint64()) {
    x = INT64_MAX;  // out of range below
  } else if (v->is_double() && v->as_double() == std::floor(v->as_double())) {
    double d = v->as_double();
    x = std::fabs(d) < 9e18 ? static_cast<int64_t>(d) : (d > 0 ? INT64_MAX : INT64_MIN);
  } else {
    return invalid(key, "must be an integer");
  }
  if (x < 0 || x > max) return invalid(key, strCat("must be in [0, ", max, "]"));
  *out = x;
  return absl::OkStatus();
}

// A JSON array of unsigned 64-bit integers (block hashes, block ids) named `field` in errors.
absl::Status readU64Array(const bj::value& v, size_t max, std::string_view field,
                          std::vector<uint64_t>* out) {
  if (!v.is_array()) return invalid(field, "must be an array");
  const bj::array& arr = v.as_array();
  if (arr.size() > max) {
    return invalid(field, strCat(arr.size(), " entries exceed the limit of ", max));
  }
  out->reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    if (arr[i].is_uint64()) {
      out->push_back(arr[i].as_uint64());
    } else if (arr[i].is_int64() && arr[i].as_int64() >= 0) {
      out->push_back(static_cast<uint64_t>(arr[i].as_int64()));
    } else {
      return invalid(strCat(field, "[", i, "]"), "must be a non-negative integer");
    }
  }
  return absl::OkStatus();
}

absl::Status readHashes(const bj::value& v, size_t max, std::vector<EngineBlockHash>* out) {
  std::vector<uint64_t> raw;
  KVF_RETURN_IF_ERROR(readU64Array(v, max, "block_hashes", &raw));
  out->reserve(raw.size());
  for (uint64_t h : raw) out->emplace_back(h);
  return absl::OkStatus();
}

int64_t intOrZero(const bj::object& o, std::string_view key) {
  const bj::value* v = o.if_contains(key);
  if (v == nullptr) return 0;
  if (v->is_int64()) return v->as_int64();
  if (v->is_uint64()) return static_cast<int64_t>(std::min<uint64_t>(v->as_uint64(), INT64_MAX));
  return 0;
}

}  // namespace

std::string_view apiPath(ApiKind kind) {
  return kind == ApiKind::kChat ? "/v1/chat/completions" : "/v1/completions";
}

absl::StatusOr<KvTransferParams> parseKvTransferParams(const bj::value& params,
                                                       const KvTransferLimits& limits) {
  if (!params.is_object()) {
    return absl::InvalidArgumentError(strCat(kKvTransferParamsKey, ": must be an object"));
  }
  const bj::object& o = params.as_object();
  KvTransferParams p;
  KVF_RETURN_IF_ERROR(readString(o, "source", limits.max_source_bytes, &p.source));
  KVF_RETURN_IF_ERROR(readString(o, "lease_id", limits.max_lease_id_bytes, &p.lease_id));
  if (const bj::value* h = o.if_contains("block_hashes"); h != nullptr && !h->is_null()) {
    std::vector<EngineBlockHash> hashes;
    KVF_RETURN_IF_ERROR(readHashes(*h, limits.max_block_hashes, &hashes));
    p.block_hashes = std::move(hashes);
  }
  if (const bj::value* d = o.if_contains("do_remote_decode"); d != nullptr && !d->is_null()) {
    if (!d->is_bool()) return invalid("do_remote_decode", "must be a boolean");
    p.do_remote_decode = d->as_bool();
  }
  KVF_RETURN_IF_ERROR(readCount(o, "deadline_ms", limits.max_deadline_ms, &p.deadline_ms));
  KVF_RETURN_IF_ERROR(readCount(o, "lease_ms", limits.max_lease_ms, &p.lease_ms));
  if (p.do_remote_decode && !p.source.empty()) {
    return absl::InvalidArgumentError(
        strCat(kKvTransferParamsKey, ": do_remote_decode and source are exclusive"));
  }
  return p;
}

bj::object kvTransferParamsJson(const KvTransferParams& p) {
  bj::object o;
  if (!p.source.empty()) o["source"] = p.source;
  if (p.block_hashes) {
    bj::array hashes;
    hashes.reserve(p.block_hashes->size());
    for (EngineBlockHash h : *p.block_hashes) hashes.emplace_back(h.value());
    o["block_hashes"] = std::move(hashes);
  }
  if (!p.lease_id.empty()) o["lease_id"] = p.lease_id;
  if (p.deadline_ms > 0) o["deadline_ms"] = p.deadline_ms;
  if (p.do_remote_decode) o["do_remote_decode"] = true;
  if (p.lease_ms > 0) o["lease_ms"] = p.lease_ms;
  return o;
}

bj::object nixlPrefillLegParams() {
  bj::object o;
  o["do_remote_decode"] = true;
  o["do_remote_prefill"] = false;
  o["remote_engine_id"] = nullptr;
  o["remote_block_ids"] = nullptr;
  o["remote_host"] = nullptr;
  o["remote_port"] = nullptr;
  return o;
}

bool isNixlDecodeLeg(const bj::value& params) {
  const bj::object* o = params.if_object();
  if (o == nullptr) return false;
  const bj::value* v = o->if_contains("do_remote_prefill");
  return v != nullptr && v->is_bool() && v->as_bool();
}

namespace {

absl::Status requireString(const bj::object& o, std::string_view key, size_t max,
                           std::string* out) {
  KVF_RETURN_IF_ERROR(readString(o, key, max, out));
  if (out->empty()) return invalid(key, "is required");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<NixlRemoteParams> parseNixlRemoteParams(const bj::value& params,
                                                       const KvTransferLimits& limits,
                                                       bool require_request_id) {
  if (!params.is_object()) {
    return absl::InvalidArgumentError(strCat(kKvTransferParamsKey, ": must be an object"));
  }
  const bj::object& o = params.as_object();
  NixlRemoteParams p;
  const bj::value* ids = o.if_contains("remote_block_ids");
  if (ids == nullptr || ids->is_null()) return invalid("remote_block_ids", "is required");
  if (!ids->is_array()) return invalid("remote_block_ids", "must be an array");
  const bj::array& arr = ids->as_array();
  if (!arr.empty() && arr[0].is_array()) {  // per KV cache group (vLLM v0.18+)
    if (arr.size() > 64) return invalid("remote_block_ids", "more than 64 groups");
    for (size_t g = 0; g < arr.size(); ++g) {
      KVF_RETURN_IF_ERROR(readU64Array(arr[g], limits.max_block_hashes,
                                       strCat("remote_block_ids[", g, "]"),
                                       &p.remote_block_ids.emplace_back()));
    }
  } else {
    KVF_RETURN_IF_ERROR(readU64Array(*ids, limits.max_block_hashes, "remote_block_ids",
                                     &p.remote_block_ids.emplace_back()));
  }
  KVF_RETURN_IF_ERROR(
      requireString(o, "remote_engine_id", limits.max_source_bytes, &p.remote_engine_id));
  if (require_request_id) {
    KVF_RETURN_IF_ERROR(
        requireString(o, "remote_request_id", limits.max_lease_id_bytes, &p.remote_request_id));
  } else {
    KVF_RETURN_IF_ERROR(
        readString(o, "remote_request_id", limits.max_lease_id_bytes, &p.remote_request_id));
  }
  KVF_RETURN_IF_ERROR(requireString(o, "remote_host", limits.max_source_bytes, &p.remote_host));
  const bj::value* port = o.if_contains("remote_port");
  if (port == nullptr || port->is_null()) return invalid("remote_port", "is required");
  int64_t port_value = 0;
  KVF_RETURN_IF_ERROR(readCount(o, "remote_port", 65535, &port_value));
  if (port_value < 1) return invalid("remote_port", "must be in [1, 65535]");
  p.remote_port = static_cast<uint16_t>(port_value);
  KVF_RETURN_IF_ERROR(readCount(o, "tp_size", 1 << 16, &p.tp_size));
  if (o.contains("remote_num_tokens") && !o.at("remote_num_tokens").is_null()) {
    KVF_RETURN_IF_ERROR(readCount(o, "remote_num_tokens", INT64_MAX, &p.remote_num_tokens));
  }
  return p;
}

bj::object nixlRemoteParamsJson(const NixlRemoteParams& p) {
  bj::object o;
  o["do_remote_prefill"] = true;
  o["do_remote_decode"] = false;
  bj::array groups;
  for (const auto& group : p.remote_block_ids) {
    bj::array ids;
    for (uint64_t id : group) ids.emplace_back(id);
    groups.emplace_back(std::move(ids));
  }
  o["remote_block_ids"] = std::move(groups);
  o["remote_engine_id"] = p.remote_engine_id;
  o["remote_request_id"] = p.remote_request_id;
  o["remote_host"] = p.remote_host;
  o["remote_port"] = static_cast<int64_t>(p.remote_port);  // a JSON integer, as on the wire
  o["tp_size"] = p.tp_size;
  if (p.remote_num_tokens >= 0) o["remote_num_tokens"] = p.remote_num_tokens;
  o["remote_blocks_expiry_time"] = nullptr;
  return o;
}

std::string_view transferOutcomeName(TransferOutcome outcome) {
  switch (outcome) {
    case TransferOutcome::kOk:
      return "ok";
    case TransferOutcome::kPartial:
      return "partial";
    case TransferOutcome::kFallback:
      return "fallback";
    case TransferOutcome::kUnknown:
      break;
  }
  return "unknown";
}

TransferOutcome parseTransferOutcome(std::string_view name) {
  for (TransferOutcome o :
       {TransferOutcome::kOk, TransferOutcome::kPartial, TransferOutcome::kFallback}) {
    if (name == transferOutcomeName(o)) return o;
  }
  return TransferOutcome::kUnknown;
}

TransferOutcome transferOutcomeFor(size_t used, size_t requested) {
  if (used == 0) return TransferOutcome::kFallback;
  return used < requested ? TransferOutcome::kPartial : TransferOutcome::kOk;
}

bj::object kvTransferResultJson(const KvTransferResult& r) {
  bj::object o;
  o["status"] = transferOutcomeName(r.outcome);
  o["pushed_tokens"] = r.pushed_tokens;
  o["pushed_bytes"] = r.pushed_bytes;
  o["requested_tokens"] = r.requested_tokens;
  if (!r.reason.empty()) o["reason"] = r.reason;
  return o;
}

std::optional<KvTransferResult> parseKvTransferResult(const bj::object& o) {
  const bj::value* status = o.if_contains("status");
  if (status == nullptr || !status->is_string() || status->as_string().empty()) {
    return std::nullopt;
  }
  KvTransferResult r;
  r.outcome = parseTransferOutcome(status->as_string());
  r.pushed_tokens = intOrZero(o, "pushed_tokens");
  r.pushed_bytes = intOrZero(o, "pushed_bytes");
  r.requested_tokens = intOrZero(o, "requested_tokens");
  if (const bj::value* reason = o.if_contains("reason"); reason && reason->is_string()) {
    std::string_view text = reason->as_string();
    r.reason = std::string(text.substr(0, kMaxTransferReasonBytes));
  }
  return r;
}

}  // namespace kvf::protocol
