#include "membership/membership_config.h"

#include <boost/json.hpp>

#include "common/strings.h"

namespace kvf::membership {

EtcdConfig::EtcdConfig() = default;

void parseEtcdConfig(config::ConfigMap& map, EtcdRole role, EtcdConfig* out) {
  map.require("endpoints");
  map.get("endpoints", &out->endpoints);
  if (map.has("endpoints") && out->endpoints.empty()) map.fail("endpoints", "must not be empty");
  for (const std::string& endpoint : out->endpoints) {
    absl::Status s = validateEndpoint(endpoint);
    if (!s.ok()) map.fail("endpoints", std::string(s.message()));
  }
  map.get("prefix", &out->prefix);
  if (out->prefix.empty()) map.fail("prefix", "must not be empty (it scopes every key)");
  map.get("request_timeout_s", &out->request_timeout_s, 0.01, 600);
  if (role == EtcdRole::kRegistrant) {
    map.get("lease_ttl_s", &out->lease_ttl_s, 2, 3600);
  } else {
    map.get("probe_interval_s", &out->probe_interval_s, 0.01, 600);
  }
  map.rejectUnknownKeys();
}

EtcdClientOptions clientOptions(const EtcdConfig& config) {
  EtcdClientOptions options;
  options.endpoints = config.endpoints;
  options.request_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(config.request_timeout_s * 1000));
  return options;
}

absl::Status validateInstanceId(std::string_view id) {
  if (id.empty() || id.size() > kMaxIdBytes) {
    return absl::InvalidArgumentError(strCat("instance id must be 1-", kMaxIdBytes, " bytes"));
  }
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          strCat("instance id \"", id, "\" may hold only letters, digits and . _ : -"));
    }
  }
  return absl::OkStatus();
}

std::string instanceKey(std::string_view prefix, std::string_view id) { return strCat(prefix, id); }

std::string encodeInstanceRecord(const InstanceRecord& record) {
  namespace bj = boost::json;
  auto text = [](const std::string& s) { return bj::string_view(s.data(), s.size()); };
  bj::object o;
  o["id"] = text(record.id);
  o["url"] = text(record.url);
  if (!record.kv_events_endpoint.empty()) {
    bj::object events;
    events["endpoint"] = text(record.kv_events_endpoint);
    if (!record.kv_replay_endpoint.empty()) {
      events["replay_endpoint"] = text(record.kv_replay_endpoint);
    }
    if (!record.kv_topic.empty()) events["topic"] = text(record.kv_topic);
    o["kv_events"] = std::move(events);
  }
  if (!record.worker_url.empty()) o["worker_url"] = text(record.worker_url);
  return bj::serialize(o);
}

std::string connectableEndpoint(std::string_view bind_endpoint, std::string_view advertise_host) {
  for (std::string_view wildcard : {"://*:", "://0.0.0.0:"}) {
    size_t at = bind_endpoint.find(wildcard);
    if (at != std::string_view::npos) {
      return strCat(bind_endpoint.substr(0, at), "://", advertise_host, ":",
                    bind_endpoint.substr(at + wildcard.size()));
    }
  }
  return std::string(bind_endpoint);
}

}  // namespace kvf::membership
