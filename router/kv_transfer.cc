#include "router/kv_transfer.h"

#include <cstddef>

#include <boost/json.hpp>

#include "common/json.h"
#include "common/status.h"
#include "common/strings.h"

namespace kvf::router {
namespace {

namespace bj = boost::json;

constexpr std::string_view kParamsKey = protocol::kKvTransferParamsKey;

// The body's text after its opening brace, for splicing a member in without re-serializing a
// large prompt; nullopt when the body does not start with '{' after whitespace.
std::optional<size_t> afterOpeningBrace(std::string_view body) {
  size_t i = body.find_first_not_of(" \t\r\n");
  if (i == std::string_view::npos || body[i] != '{') return std::nullopt;
  return i + 1;
}

}  // namespace

absl::StatusOr<std::string> withKvTransferParams(std::string_view body, bool client_params,
                                                 const KvTransferParams* params) {
  // The common case: the client sent none, so the body is spliced, not re-serialized.
  if (!client_params) {
    if (params == nullptr) return std::string(body);
    auto at = afterOpeningBrace(body);
    if (!at) return absl::InvalidArgumentError("request body must be a JSON object");
    std::string member =
        strCat("\"", kParamsKey, "\":", bj::serialize(protocol::kvTransferParamsJson(*params)));
    std::string_view rest = body.substr(*at);
    size_t next = rest.find_first_not_of(" \t\r\n");
    bool empty = next != std::string_view::npos && rest[next] == '}';
    return strCat(body.substr(0, *at), member, empty ? "" : ",", rest);
  }
  auto obj = json::parseObject(body);
  if (!obj.ok()) return obj.status();
  obj->erase(kParamsKey);
  if (params != nullptr) (*obj)[kParamsKey] = protocol::kvTransferParamsJson(*params);
  return bj::serialize(*obj);
}

absl::StatusOr<std::string> remotePrefillBody(std::string_view body, int64_t lease_ms) {
  auto obj = json::parseObject(body);
  if (!obj.ok()) return obj.status();
  obj->erase(kParamsKey);
  obj->erase("stream_options");
  obj->erase("max_completion_tokens");
  obj->erase("min_tokens");  // a client's min_tokens > 1 would make max_tokens 1 invalid
  (*obj)["stream"] = false;
  (*obj)["max_tokens"] = 1;
  if (obj->contains("n")) (*obj)["n"] = 1;
  if (obj->contains("best_of")) (*obj)["best_of"] = 1;
  KvTransferParams params;
  params.do_remote_decode = true;
  params.lease_ms = lease_ms;
  (*obj)[kParamsKey] = protocol::kvTransferParamsJson(params);
  return bj::serialize(*obj);
}

absl::StatusOr<KvTransferParams> parseRemotePrefillResponse(std::string_view body,
                                                            std::string_view worker_url) {
  auto obj = json::parseObject(body);
  if (!obj.ok()) return obj.status();
  const auto* p = obj->if_contains(kParamsKey);
  if (p == nullptr || !p->is_object()) {
    return absl::InvalidArgumentError("prefill response has no kv_transfer_params object");
  }
  protocol::KvTransferLimits limits;
  limits.max_block_hashes = kMaxTransferBlockHashes;
  limits.max_lease_id_bytes = kMaxLeaseIdBytes;
  KVF_ASSIGN_OR_RETURN(KvTransferParams out, protocol::parseKvTransferParams(*p, limits));
  out.source = std::string(worker_url);
  out.deadline_ms = 0;  // P's answer names what to fetch; D's deadline is D's business
  out.do_remote_decode = false;
  out.lease_ms = 0;
  if (!out.block_hashes || out.block_hashes->empty()) {
    return absl::InvalidArgumentError("prefill response names no block_hashes");
  }
  return out;
}

absl::StatusOr<std::string> nixlPrefillBody(std::string_view body) {
  auto obj = json::parseObject(body);
  if (!obj.ok()) return obj.status();
  obj->erase("stream_options");
  obj->erase("min_tokens");
  obj->erase("min_completion_tokens");
  (*obj)["stream"] = false;
  (*obj)["max_tokens"] = 1;
  if (obj->contains("max_completion_tokens")) (*obj)["max_completion_tokens"] = 1;
  (*obj)[kParamsKey] = protocol::nixlPrefillLegParams();
  return bj::serialize(*obj);
}

NixlSideChannel nixlSideChannel(const InstanceConfig& holder) {
  NixlSideChannel out;
  out.host = holder.host;
  std::string host;
  uint16_t port = 0;
  if (!holder.worker_url.empty() && parseInstanceUrl(holder.worker_url, &host, &port).ok()) {
    out.host = std::move(host);
    out.port = port;
  }
  return out;
}

absl::StatusOr<bj::value> parseNixlPrefillResponse(std::string_view body,
                                                   const NixlSideChannel& side_channel) {
  auto obj = json::parseObject(body);
  if (!obj.ok()) return obj.status();
  const auto* p = obj->if_contains(kParamsKey);
  if (p == nullptr || p->is_null()) {
    return absl::InvalidArgumentError("prefill response has kv_transfer_params null");
  }
  protocol::KvTransferLimits limits;
  limits.max_block_hashes = kMaxTransferBlockHashes;
  limits.max_lease_id_bytes = kMaxLeaseIdBytes;
  KVF_ASSIGN_OR_RETURN(protocol::NixlRemoteParams n, protocol::parseNixlRemoteParams(*p, limits));
  if (n.remote_host != side_channel.host ||
      (side_channel.port && n.remote_port != *side_channel.port)) {
    return absl::PermissionDeniedError(
        strCat("prefill response names side channel ", n.remote_host, ":", n.remote_port,
               ", the registry names ", side_channel.host, ":",
               side_channel.port ? std::to_string(*side_channel.port) : std::string("*")));
  }
  return *p;
}

absl::StatusOr<std::string> withRawKvTransferParams(std::string_view body,
                                                    const bj::value& params) {
  auto obj = json::parseObject(body);
  if (!obj.ok()) return obj.status();
  (*obj)[kParamsKey] = params;
  return bj::serialize(*obj);
}

ResponseReport readResponseReport(std::string_view json_text) {
  ResponseReport report;
  bool has_usage = json_text.find("\"usage\"") != std::string_view::npos;
  bool has_transfer = json_text.find("\"kv_transfer_result\"") != std::string_view::npos;
  if (!has_usage && !has_transfer) return report;
  // The DOM lives in a stack arena: a response body parsed into the default heap cost ~20
  // allocations per request (a fifth of the router's); larger bodies spill to the heap.
  alignas(std::max_align_t) unsigned char arena[8192];
  bj::monotonic_resource resource(arena, sizeof(arena));
  auto obj = json::parseObject(json_text, 64, bj::storage_ptr(&resource));
  if (!obj.ok()) return report;
  if (const auto* usage = obj->if_contains("usage"); usage && usage->is_object()) {
    const auto* details = usage->as_object().if_contains("prompt_tokens_details");
    if (details == nullptr || !details->is_object()) {
      report.cached_tokens = 0;
    } else if (auto c = json::getIntOr(details->as_object(), "cached_tokens", 0); c.ok()) {
      report.cached_tokens = *c;
    }
  }
  const auto* t = obj->if_contains(protocol::kKvTransferResultKey);
  if (t != nullptr && t->is_object())
    report.transfer = protocol::parseKvTransferResult(t->as_object());
  return report;
}

}  // namespace kvf::router
