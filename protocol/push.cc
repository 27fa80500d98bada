#include "protocol/push.h"

#include <span>

#include <boost/json.hpp>

#include "common/json.h"
#include "common/status.h"
#include "common/strings.h"

namespace kvf::protocol {
namespace bj = boost::json;
namespace {

absl::Status invalid(std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(strCat(field, ": ", what));
}

absl::StatusOr<std::string> stringField(const bj::object& o, std::string_view key, size_t max,
                                        bool required) {
  const bj::value* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) {
    if (required) return invalid(key, "is required");
    return std::string();
  }
  if (!v->is_string()) return invalid(key, "must be a string");
  if (v->as_string().size() > max) return invalid(key, strCat("longer than ", max, " bytes"));
  return std::string(v->as_string());
}

absl::StatusOr<uint64_t> u64Value(const bj::value& v, std::string_view field) {
  if (v.is_uint64()) return v.as_uint64();
  if (v.is_int64() && v.as_int64() >= 0) return static_cast<uint64_t>(v.as_int64());
  return invalid(field, "must be a non-negative integer");
}

absl::StatusOr<uint64_t> u64Field(const bj::object& o, std::string_view key, bool required,
                                  uint64_t fallback = 0) {
  const bj::value* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) {
    if (required) return invalid(key, "is required");
    return fallback;
  }
  return u64Value(*v, key);
}

absl::StatusOr<std::vector<uint64_t>> u64Array(const bj::object& o, std::string_view key,
                                               size_t max, bool required) {
  std::vector<uint64_t> out;
  const bj::value* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) {
    if (required) return invalid(key, "is required");
    return out;
  }
  if (!v->is_array()) return invalid(key, "must be an array of integers");
  const bj::array& arr = v->as_array();
  if (arr.size() > max)
    return invalid(key, strCat(arr.size(), " entries exceed the limit of ", max));
  out.reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    KVF_ASSIGN_OR_RETURN(uint64_t x, u64Value(arr[i], strCat(key, "[", i, "]")));
    out.push_back(x);
  }
  return out;
}

bj::array toArray(std::span<const uint64_t> v) {
  bj::array a;
  a.reserve(v.size());
  for (uint64_t x : v) a.emplace_back(x);
  return a;
}

bj::array toArray(std::span<const EngineBlockHash> v) { return toArray(rawHashes(v)); }

absl::StatusOr<std::vector<EngineBlockHash>> hashArray(const bj::object& o, std::string_view key,
                                                       size_t max, bool required) {
  KVF_ASSIGN_OR_RETURN(std::vector<uint64_t> raw, u64Array(o, key, max, required));
  return std::vector<EngineBlockHash>(raw.begin(), raw.end());
}

}  // namespace

std::string serializeWorkerInfo(const WorkerInfo& info) {
  bj::object o;
  o["instance_id"] = info.instance_id;
  o["transport_address"] = info.transport_address;
  o["transports"] = info.transports;
  o["block_size"] = info.block_size;
  o["block_bytes"] = info.block_bytes;
  return bj::serialize(o);
}

absl::StatusOr<WorkerInfo> parseWorkerInfo(std::string_view body, const PushLimits& limits) {
  KVF_ASSIGN_OR_RETURN(bj::object o, json::parseObject(body, 8));
  WorkerInfo info;
  KVF_ASSIGN_OR_RETURN(info.instance_id,
                       stringField(o, "instance_id", limits.max_string_bytes, false));
  KVF_ASSIGN_OR_RETURN(info.transport_address,
                       stringField(o, "transport_address", limits.max_blob_bytes, true));
  KVF_ASSIGN_OR_RETURN(info.transports,
                       stringField(o, "transports", limits.max_string_bytes, false));
  KVF_ASSIGN_OR_RETURN(uint64_t bs, u64Field(o, "block_size", true));
  if (bs < 1 || bs > 1024) return invalid("block_size", "must be in [1, 1024]");
  info.block_size = static_cast<int64_t>(bs);
  KVF_ASSIGN_OR_RETURN(info.block_bytes, u64Field(o, "block_bytes", true));
  return info;
}

std::string serializePushRequest(const PushRequest& r) {
  bj::object o;
  o["request_id"] = r.request_id;
  o["receiver_url"] = r.receiver_url;
  o["block_hashes"] = toArray(r.block_hashes);
  o["receiver_address"] = r.receiver_address;
  o["rkey"] = r.rkey;
  o["block_addrs"] = toArray(r.block_addrs);
  o["block_bytes"] = r.block_bytes;
  o["landing_id"] = r.landing_id;
  o["deadline_ms"] = r.deadline_ms;
  if (!r.lease_id.empty()) o["lease_id"] = r.lease_id;
  return bj::serialize(o);
}

absl::StatusOr<PushRequest> parsePushRequest(std::string_view body, const PushLimits& limits) {
  KVF_ASSIGN_OR_RETURN(bj::object o, json::parseObject(body, 8));
  PushRequest r;
  KVF_ASSIGN_OR_RETURN(r.request_id, stringField(o, "request_id", limits.max_string_bytes, false));
  KVF_ASSIGN_OR_RETURN(r.block_hashes, hashArray(o, "block_hashes", limits.max_blocks, true));
  if (r.block_hashes.empty()) return invalid("block_hashes", "must not be empty");
  KVF_ASSIGN_OR_RETURN(r.receiver_url,
                       stringField(o, "receiver_url", limits.max_string_bytes, true));
  if (!r.receiver_url.starts_with("http://")) {
    return invalid("receiver_url", "must be http://host:port");
  }
  KVF_ASSIGN_OR_RETURN(r.receiver_address,
                       stringField(o, "receiver_address", limits.max_blob_bytes, true));
  KVF_ASSIGN_OR_RETURN(r.rkey, stringField(o, "rkey", limits.max_blob_bytes, true));
  KVF_ASSIGN_OR_RETURN(r.block_addrs, u64Array(o, "block_addrs", limits.max_blocks, true));
  if (r.block_addrs.size() != r.block_hashes.size()) {
    return invalid("block_addrs", strCat(r.block_addrs.size(), " addresses for ",
                                         r.block_hashes.size(), " block_hashes"));
  }
  KVF_ASSIGN_OR_RETURN(r.block_bytes, u64Field(o, "block_bytes", true));
  KVF_ASSIGN_OR_RETURN(r.landing_id, u64Field(o, "landing_id", true));
  if (r.landing_id == 0) return invalid("landing_id", "must be non-zero");
  KVF_ASSIGN_OR_RETURN(uint64_t deadline, u64Field(o, "deadline_ms", false, 1000));
  if (deadline < 1 || deadline > 60'000) return invalid("deadline_ms", "must be in [1, 60000]");
  r.deadline_ms = static_cast<int64_t>(deadline);
  KVF_ASSIGN_OR_RETURN(r.lease_id, stringField(o, "lease_id", limits.max_string_bytes, false));
  return r;
}

std::string serializePushResponse(const PushResponse& r) {
  bj::object o;
  o["pushed_hashes"] = toArray(r.pushed_hashes);
  o["checksums"] = toArray(r.checksums);
  o["missing_hashes"] = toArray(r.missing_hashes);
  o["pushed_blocks"] = r.pushed_hashes.size();
  o["pushed_bytes"] = r.pushed_bytes;
  o["put_issued"] = r.put_issued;
  if (!r.error.empty()) o["error"] = r.error;
  o["elapsed_us"] = r.elapsed_us;
  return bj::serialize(o);
}

absl::StatusOr<PushResponse> parsePushResponse(std::string_view body, const PushLimits& limits) {
  KVF_ASSIGN_OR_RETURN(bj::object o, json::parseObject(body, 8));
  PushResponse r;
  KVF_ASSIGN_OR_RETURN(r.pushed_hashes, hashArray(o, "pushed_hashes", limits.max_blocks, true));
  KVF_ASSIGN_OR_RETURN(r.checksums, u64Array(o, "checksums", limits.max_blocks, false));
  if (!r.checksums.empty() && r.checksums.size() != r.pushed_hashes.size()) {
    return invalid("checksums", "must have one entry per pushed hash");
  }
  KVF_ASSIGN_OR_RETURN(r.missing_hashes, hashArray(o, "missing_hashes", limits.max_blocks, false));
  KVF_ASSIGN_OR_RETURN(r.pushed_bytes, u64Field(o, "pushed_bytes", false));
  KVF_ASSIGN_OR_RETURN(r.put_issued, json::getBoolOr(o, "put_issued", true));
  KVF_ASSIGN_OR_RETURN(r.error, stringField(o, "error", limits.max_string_bytes * 4, false));
  KVF_ASSIGN_OR_RETURN(uint64_t us, u64Field(o, "elapsed_us", false));
  // A day in microseconds: far past any push deadline, and inside int64_t, so the value
  // keeps its sign when the response is written again.
  constexpr uint64_t kMaxElapsedUs = 86'400ull * 1'000'000ull;
  if (us > kMaxElapsedUs) return invalid("elapsed_us", strCat("exceeds ", kMaxElapsedUs));
  r.elapsed_us = static_cast<int64_t>(us);
  return r;
}

std::string serializeLandingClaim(const LandingClaim& claim) {
  bj::object o;
  o["landing_id"] = claim.landing_id;
  return bj::serialize(o);
}

absl::StatusOr<LandingClaim> parseLandingClaim(std::string_view body) {
  KVF_ASSIGN_OR_RETURN(bj::object o, json::parseObject(body, 4));
  LandingClaim c;
  KVF_ASSIGN_OR_RETURN(c.landing_id, u64Field(o, "landing_id", true));
  if (c.landing_id == 0) return invalid("landing_id", "must be non-zero");
  return c;
}

std::string serializeLandingGrant(const LandingGrant& g) {
  bj::object o;
  o["landing_id"] = g.landing_id;
  o["transport_address"] = g.transport_address;
  o["rkey"] = g.rkey;
  o["block_addrs"] = toArray(g.block_addrs);
  o["block_bytes"] = g.block_bytes;
  return bj::serialize(o);
}

absl::StatusOr<LandingGrant> parseLandingGrant(std::string_view body, const PushLimits& limits) {
  KVF_ASSIGN_OR_RETURN(bj::object o, json::parseObject(body, 8));
  LandingGrant g;
  KVF_ASSIGN_OR_RETURN(g.landing_id, u64Field(o, "landing_id", true));
  KVF_ASSIGN_OR_RETURN(g.transport_address,
                       stringField(o, "transport_address", limits.max_blob_bytes, true));
  KVF_ASSIGN_OR_RETURN(g.rkey, stringField(o, "rkey", limits.max_blob_bytes, true));
  KVF_ASSIGN_OR_RETURN(g.block_addrs, u64Array(o, "block_addrs", limits.max_blocks, true));
  if (g.block_addrs.empty()) return invalid("block_addrs", "must not be empty");
  KVF_ASSIGN_OR_RETURN(g.block_bytes, u64Field(o, "block_bytes", true));
  return g;
}

std::string serializeNixlMetaRequest(const NixlMetaRequest& r) {
  bj::object o;
  o["remote_request_id"] = r.remote_request_id;
  o["block_ids"] = toArray(r.block_ids);
  return bj::serialize(o);
}

absl::StatusOr<NixlMetaRequest> parseNixlMetaRequest(std::string_view body,
                                                     const PushLimits& limits) {
  KVF_ASSIGN_OR_RETURN(bj::object o, json::parseObject(body, 8));
  NixlMetaRequest r;
  KVF_ASSIGN_OR_RETURN(r.remote_request_id,
                       stringField(o, "remote_request_id", limits.max_string_bytes, true));
  KVF_ASSIGN_OR_RETURN(r.block_ids, u64Array(o, "block_ids", limits.max_blocks, true));
  if (r.block_ids.empty()) return invalid("block_ids", "must not be empty");
  return r;
}

std::string serializeNixlMetaResponse(const NixlMetaResponse& r) {
  bj::object o;
  o["engine_id"] = r.engine_id;
  o["rkey"] = r.rkey;
  o["block_ids"] = toArray(r.block_ids);
  o["block_hashes"] = toArray(r.block_hashes);
  o["checksums"] = toArray(r.checksums);
  o["lease_remaining_ms"] = r.lease_remaining_ms;
  return bj::serialize(o);
}

absl::StatusOr<NixlMetaResponse> parseNixlMetaResponse(std::string_view body,
                                                       const PushLimits& limits) {
  KVF_ASSIGN_OR_RETURN(bj::object o, json::parseObject(body, 8));
  NixlMetaResponse r;
  KVF_ASSIGN_OR_RETURN(r.engine_id, stringField(o, "engine_id", limits.max_string_bytes, false));
  KVF_ASSIGN_OR_RETURN(r.rkey, stringField(o, "rkey", limits.max_blob_bytes, true));
  KVF_ASSIGN_OR_RETURN(r.block_ids, u64Array(o, "block_ids", limits.max_blocks, true));
  KVF_ASSIGN_OR_RETURN(r.block_hashes, hashArray(o, "block_hashes", limits.max_blocks, true));
  KVF_ASSIGN_OR_RETURN(r.checksums, u64Array(o, "checksums", limits.max_blocks, true));
  if (r.block_hashes.size() != r.block_ids.size() || r.checksums.size() != r.block_ids.size()) {
    return invalid("block_hashes", "block_ids, block_hashes and checksums differ in length");
  }
  KVF_ASSIGN_OR_RETURN(uint64_t ms, u64Field(o, "lease_remaining_ms", false));
  r.lease_remaining_ms = static_cast<int64_t>(std::min<uint64_t>(ms, INT64_MAX));
  return r;
}

std::string serializeNixlNotify(const NixlNotify& r) {
  bj::object o;
  o["remote_request_id"] = r.remote_request_id;
  return bj::serialize(o);
}

absl::StatusOr<NixlNotify> parseNixlNotify(std::string_view body, const PushLimits& limits) {
  KVF_ASSIGN_OR_RETURN(bj::object o, json::parseObject(body, 8));
  NixlNotify r;
  KVF_ASSIGN_OR_RETURN(r.remote_request_id,
                       stringField(o, "remote_request_id", limits.max_string_bytes, true));
  return r;
}

}  // namespace kvf::protocol
