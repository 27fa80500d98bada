#include "router/kv_transfer.h"

#include <cstddef>

#include <boost/json.hpp>

#include "common/json.h"
#include "common/strings.h"

namespace kvf::router {
namespace {

namespace bj = boost::json;

constexpr std::string_view kParamsKey = "kv_transfer_params";

bj::object paramsObject(const KvTransferParams& p) {
  bj::object o;
  o["source"] = p.source;
  if (!p.block_hashes.empty()) {
    bj::array hashes;
    hashes.reserve(p.block_hashes.size());
    for (uint64_t h : p.block_hashes) hashes.push_back(h);
    o["block_hashes"] = std::move(hashes);
  }
  if (!p.lease_id.empty()) o["lease_id"] = p.lease_id;
  return o;
}

// The body's text after its opening brace, for splicing a member in without re-serializing a
// large prompt; nullopt when the body does not start with '{' after whitespace.
std::optional<size_t> afterOpeningBrace(std::string_view body) {
  size_t i = body.find_first_not_of(" \t\r\n");
  if (i == std::string_view::npos || body[i] != '{') return std::nullopt;
  return i + 1;
}

}  // namespace

absl::StatusOr<std::string> withKvTransferParams(std::string_view body,
                                                 const KvTransferParams* params) {
  // The common case: the client sent none, so the body is spliced, not re-serialized.
  if (body.find(kParamsKey) == std::string_view::npos) {
    if (params == nullptr) return std::string(body);
    auto at = afterOpeningBrace(body);
    if (!at) return absl::InvalidArgumentError("request body must be a JSON object");
    std::string member = strCat("\"", kParamsKey, "\":", bj::serialize(paramsObject(*params)));
    std::string_view rest = body.substr(*at);
    size_t next = rest.find_first_not_of(" \t\r\n");
    bool empty = next != std::string_view::npos && rest[next] == '}';
    return strCat(body.substr(0, *at), member, empty ? "" : ",", rest);
  }
  auto obj = json::parseObject(body);
  if (!obj.ok()) return obj.status();
  obj->erase(kParamsKey);
  if (params != nullptr) (*obj)[kParamsKey] = paramsObject(*params);
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
  bj::object params;
  params["do_remote_decode"] = true;
  params["lease_ms"] = lease_ms;
  (*obj)[kParamsKey] = std::move(params);
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
  const bj::object& params = p->as_object();
  KvTransferParams out;
  out.source = std::string(worker_url);
  if (const auto* h = params.if_contains("block_hashes")) {
    if (!h->is_array()) return absl::InvalidArgumentError("block_hashes must be an array");
    const bj::array& list = h->as_array();
    if (list.size() > kMaxTransferBlockHashes) {
      return absl::InvalidArgumentError(strCat("block_hashes has ", list.size(),
                                               " entries (at most ", kMaxTransferBlockHashes, ")"));
    }
    out.block_hashes.reserve(list.size());
    for (const auto& v : list) {
      if (v.is_uint64()) {
        out.block_hashes.push_back(v.as_uint64());
      } else if (v.is_int64() && v.as_int64() >= 0) {
        out.block_hashes.push_back(static_cast<uint64_t>(v.as_int64()));
      } else {
        return absl::InvalidArgumentError("block_hashes entries must be unsigned 64-bit integers");
      }
    }
  }
  if (const auto* l = params.if_contains("lease_id")) {
    if (!l->is_string() || l->as_string().size() > kMaxLeaseIdBytes) {
      return absl::InvalidArgumentError(
          strCat("lease_id must be a string of at most ", kMaxLeaseIdBytes, " bytes"));
    }
    out.lease_id = std::string(l->as_string());
  }
  if (out.block_hashes.empty()) {
    return absl::InvalidArgumentError("prefill response names no block_hashes");
  }
  return out;
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
  const auto* t = obj->if_contains("kv_transfer_result");
  if (t != nullptr && t->is_object()) {
    const bj::object& r = t->as_object();
    KvTransferResult result;
    auto status = json::getString(r, "status");
    if (status.ok()) result.status = std::string(status->substr(0, 32));
    result.pushed_tokens = json::getIntOr(r, "pushed_tokens", 0).value_or(0);
    result.pushed_bytes = json::getIntOr(r, "pushed_bytes", 0).value_or(0);
    if (auto reason = json::getString(r, "reason"); reason.ok()) {
      result.reason = std::string(reason->substr(0, 256));
    }
    if (!result.status.empty()) report.transfer = std::move(result);
  }
  return report;
}

}  // namespace kvf::router
