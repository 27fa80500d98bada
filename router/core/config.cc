#include "router/core/config.h"

#include <algorithm>
#include <charconv>
#include <set>

#include "common/strings.h"

namespace kvf::router {

absl::Status parseInstanceUrl(std::string_view url, std::string* host, uint16_t* port) {
  constexpr std::string_view kScheme = "http://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    return absl::InvalidArgumentError(strCat("url \"", url, "\" must start with http://"));
  }
  std::string_view rest = url.substr(kScheme.size());
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || rest.find('/') != std::string_view::npos) {
    return absl::InvalidArgumentError(strCat("url \"", url, "\" must be http://host:port"));
  }
  unsigned value = 0;
  std::string_view port_text = rest.substr(colon + 1);
  auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), value);
  if (ec != std::errc() || ptr != port_text.data() + port_text.size() || value == 0 ||
      value > 65535) {
    return absl::InvalidArgumentError(strCat("url \"", url, "\" has an invalid port"));
  }
  *host = std::string(rest.substr(0, colon));
  *port = static_cast<uint16_t>(value);
  return absl::OkStatus();
}

std::string rankEndpoint(const std::string& endpoint, int rank) {
  if (rank == 0 || endpoint.empty()) return endpoint;
  size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos) return endpoint;
  unsigned port = 0;
  const char* begin = endpoint.data() + colon + 1;
  const char* end = endpoint.data() + endpoint.size();
  auto [ptr, ec] = std::from_chars(begin, end, port);
  if (ec != std::errc() || ptr != end) return endpoint;
  return endpoint.substr(0, colon + 1) + std::to_string(port + static_cast<unsigned>(rank));
}

void parseInstanceConfig(config::ConfigMap& map, InstanceConfig* out) {
  map.require("id");
  map.require("url");
  map.get("id", &out->id);
  map.get("url", &out->url);
  if (!out->url.empty()) {
    absl::Status s = parseInstanceUrl(out->url, &out->host, &out->port);
    if (!s.ok()) map.fail("url", std::string(s.message()));
  }
  map.get("worker_url", &out->worker_url);
  map.get("kv_capacity_blocks", &out->kv_capacity_blocks, 0, uint64_t{1} << 32);
  if (!out->worker_url.empty()) {
    std::string host;
    uint16_t port = 0;
    absl::Status s = parseInstanceUrl(out->worker_url, &host, &port);
    if (!s.ok()) map.fail("worker_url", std::string(s.message()));
    while (out->worker_url.back() == '/') out->worker_url.pop_back();
  }
  map.get("kv_connector", &out->kv_connector);
  if (out->kv_connector != "kvfabric" && out->kv_connector != "nixl") {
    map.fail("kv_connector", "must be kvfabric or nixl");
  } else if (out->kv_connector == "kvfabric" && out->worker_url.empty() &&
             map.has("kv_connector")) {
    map.fail("kv_connector", "kvfabric needs worker_url");
  }
  if (auto ev = map.map("kv_events")) {
    ev->get("endpoint", &out->kv_events.endpoint);
    ev->get("replay_endpoint", &out->kv_events.replay_endpoint);
    ev->get("topic", &out->kv_events.topic);
    ev->get("data_parallel_size", &out->kv_events.data_parallel_size, 1, 64);
    if (out->kv_events.endpoint.empty() && !out->kv_events.replay_endpoint.empty()) {
      ev->fail("replay_endpoint", "needs kv_events.endpoint");
    }
    if (out->kv_events.data_parallel_size > 1 &&
        rankEndpoint(out->kv_events.endpoint, 1) == out->kv_events.endpoint) {
      ev->fail("data_parallel_size", "needs a tcp endpoint with a port (rank r uses port + r)");
    }
    ev->rejectUnknownKeys();
  }
  map.rejectUnknownKeys();
}

namespace {

void getSeconds(config::ConfigMap& map, std::string_view key, Nanos* out, double min, double max) {
  double seconds = nanosToSeconds(*out);
  map.get(key, &seconds, min, max);
  *out = secondsToNanos(seconds);
}

void parseIndex(config::ConfigMap& map, policy::CacheIndexConfig* out) {
  uint64_t block_size = out->block_size;
  map.get("block_size", &block_size, 1, 4096);
  out->block_size = block_size;
  getSeconds(map, "predicted_ttl_s", &out->predicted_ttl, 0.001, 86400);
  getSeconds(map, "approximate_ttl_s", &out->approximate_ttl, 0.001, 7 * 86400);
  uint64_t max_blocks = out->max_blocks_per_instance;
  map.get("max_blocks_per_instance", &max_blocks, 1, uint64_t{1} << 32);
  out->max_blocks_per_instance = max_blocks;
  uint64_t max_soft = out->max_soft_entries;
  map.get("max_soft_entries", &max_soft, 1, uint64_t{1} << 32);
  out->max_soft_entries = max_soft;
  map.get("table_max_load", &out->table_max_load, 0.125, 0.75);
  map.rejectUnknownKeys();
}

void parseHealth(config::ConfigMap& map, HealthConfig* out) {
  getSeconds(map, "interval_s", &out->interval, 0.01, 3600);
  getSeconds(map, "timeout_s", &out->timeout, 0.01, 600);
  map.get("unhealthy_threshold", &out->unhealthy_threshold, 1, 1000);
  map.get("healthy_threshold", &out->healthy_threshold, 1, 1000);
  map.get("scrape_metrics", &out->scrape_metrics);
  map.rejectUnknownKeys();
}

void getMillis(config::ConfigMap& map, std::string_view key, Nanos* out, int64_t min, int64_t max) {
  int64_t ms = *out / kNanosPerMilli;
  map.get(key, &ms, min, max);
  *out = ms * kNanosPerMilli;
}

void parseReplicas(config::ConfigMap& map, ReplicasConfig* out) {
  map.require("id");
  map.require("publish");
  map.get("id", &out->id);
  if (map.has("id") && (out->id.empty() || out->id.size() > 128)) {
    map.fail("id", "must be 1 to 128 characters");
  }
  map.get("publish", &out->publish);
  map.get("peers", &out->peers);
  std::set<std::string> seen;
  for (const std::string& peer : out->peers) {
    if (peer.empty() || peer == out->publish || !seen.insert(peer).second) {
      map.fail("peers", strCat("\"", peer, "\" is empty, repeated or this replica's publish"));
    }
  }
  getMillis(map, "sync_interval_ms", &out->sync_interval, 1, 10'000);
  getMillis(map, "snapshot_interval_ms", &out->snapshot_interval, 1, 60'000);
  getMillis(map, "peer_timeout_ms", &out->peer_timeout, 10, 600'000);
  uint64_t max_bytes = out->max_message_bytes;
  map.get("max_message_bytes", &max_bytes, 1024, uint64_t{64} << 20);
  out->max_message_bytes = max_bytes;
  uint64_t max_peers = out->max_peers;
  map.get("max_peers", &max_peers, 1, 1024);
  out->max_peers = max_peers;
  getSeconds(map, "max_clock_skew_s", &out->max_clock_skew, 0.1, 3600);
  if (out->snapshot_interval < out->sync_interval) {
    map.fail("snapshot_interval_ms", "must be at least sync_interval_ms");
  }
  // A live peer sends a snapshot every snapshot_interval: a shorter timeout would drop it.
  if (out->peer_timeout <= out->snapshot_interval) {
    map.fail("peer_timeout_ms", "must be longer than snapshot_interval_ms");
  }
  map.rejectUnknownKeys();
}

void parseOverload(config::ConfigMap& map, OverloadConfig* out) {
  map.get("enabled", &out->enabled);
  map.get("max_pending_prefill_tokens", &out->max_pending_prefill_tokens, 1, int64_t{1} << 40);
  map.get("max_waiting", &out->max_waiting, 1, 1'000'000);
  map.get("max_kv_usage", &out->max_kv_usage, 0.01, 1.0);
  map.get("max_running", &out->max_running, 0, 1'000'000);
  map.get("steer", &out->steer);
  map.get("max_queue", &out->max_queue, 0, 10'000'000);
  map.get("max_per_session", &out->max_per_session, 1, 10'000'000);
  getSeconds(map, "max_wait_s", &out->max_wait, 0.001, 86400);
  map.get("quantum_tokens", &out->quantum_tokens, 1, int64_t{1} << 30);
  map.get("retry_after_s", &out->retry_after_s, 1, 86400);
  map.rejectUnknownKeys();
}

void parseRoot(config::ConfigMap& root, RouterConfig* out, const policy::PolicyRegistry& policies) {
  if (auto listen = root.map("listen")) {
    listen->get("host", &out->host);
    uint32_t port = out->port;
    listen->get("port", &port, 0, 65535);
    out->port = static_cast<uint16_t>(port);
    uint64_t max_body = out->max_body_bytes;
    listen->get("max_body_bytes", &max_body, 1024, uint64_t{1} << 32);
    out->max_body_bytes = max_body;
    uint64_t max_connections = out->max_connections;
    listen->get("max_connections", &max_connections, 1, uint64_t{1} << 20);
    out->max_connections = max_connections;
    uint64_t per_client = out->max_connections_per_client;
    listen->get("max_connections_per_client", &per_client, 0, uint64_t{1} << 20);
    out->max_connections_per_client = per_client;
    listen->rejectUnknownKeys();
  }
  if (auto m = root.map("membership")) {
    m->getEnum("source", &out->membership,
               {{"static", MembershipSource::kStatic}, {"etcd", MembershipSource::kEtcd}});
    if (auto e = m->map("etcd")) {
      membership::parseEtcdConfig(*e, membership::EtcdRole::kWatcher, &out->etcd);
      if (out->membership != MembershipSource::kEtcd) m->fail("etcd", "needs source: etcd");
    } else if (out->membership == MembershipSource::kEtcd) {
      m->require("etcd");
    }
    m->rejectUnknownKeys();
  }
  // With etcd membership the static list may be empty (or absent).
  if (out->membership == MembershipSource::kStatic) root.require("instances");
  std::set<std::string> ids;
  for (auto& item : root.mapList("instances")) {
    InstanceConfig instance;
    parseInstanceConfig(item, &instance);
    if (!instance.id.empty() && !ids.insert(instance.id).second) {
      item.fail("id", strCat("duplicate instance id \"", instance.id, "\""));
    }
    out->instances.push_back(std::move(instance));
  }
  if (out->instances.size() > static_cast<size_t>(policy::kMaxInstances)) {
    root.fail("instances",
              strCat("at most ", policy::kMaxInstances, " instances, got ", out->instances.size()));
  }
  if (auto p = root.map("policy")) {
    policy::parsePolicyConfig(*p, &out->policy, policies);
    p->rejectUnknownKeys();
  }
  if (auto i = root.map("index")) parseIndex(*i, &out->index);
  if (auto h = root.map("health")) parseHealth(*h, &out->health);
  if (auto o = root.map("overload")) parseOverload(*o, &out->overload);
  if (auto r = root.map("replicas")) parseReplicas(*r, &out->replicas);
  // Unset, the stall window spans a few health intervals (at least its 5 s default).
  out->stall_timeout = std::max(out->stall_timeout, 3 * out->health.interval);
  if (auto u = root.map("upstream")) {
    u->get("max_attempts", &out->max_attempts, 1, 10);
    u->get("circuit_failure_threshold", &out->circuit_failure_threshold, 1, 1000);
    getSeconds(*u, "circuit_open_s", &out->circuit_open, 0.01, 3600);
    getSeconds(*u, "connect_timeout_s", &out->connect_timeout, 0.01, 600);
    getSeconds(*u, "read_timeout_s", &out->read_timeout, 0.1, 86400);
    getSeconds(*u, "stall_timeout_s", &out->stall_timeout, 0, 3600);
    getSeconds(*u, "retry_deadline_s", &out->retry_deadline, 0.01, 86400);
    // A live engine in a long prefill sends nothing but health answers: the stall window must
    // hold at least one health interval, or every long prefill would look stalled.
    if (out->stall_timeout > 0 && out->stall_timeout <= out->health.interval) {
      u->fail("stall_timeout_s", "must be longer than health.interval_s (or 0: off)");
    }
    u->rejectUnknownKeys();
  }
  if (auto t = root.map("tokenize")) {
    t->get("enabled", &out->tokenize);
    getSeconds(*t, "timeout_s", &out->tokenize_timeout, 0.001, 600);
    t->rejectUnknownKeys();
  }
  if (auto io = root.map("io")) {
    int64_t busy_poll_us = out->busy_poll / 1000;
    io->get("busy_poll_us", &busy_poll_us, 0, 100'000);
    out->busy_poll = busy_poll_us * 1000;
    io->rejectUnknownKeys();
  }
  if (auto k = root.map("kv_events")) {
    uint64_t max_bytes = out->max_kv_event_bytes;
    k->get("max_message_bytes", &max_bytes, 4096, uint64_t{1} << 30);
    out->max_kv_event_bytes = max_bytes;
    getSeconds(*k, "silent_after_s", &out->kv_events_silent_after, 1, 86400);
    k->rejectUnknownKeys();
  }
  root.get("lora_adapters", &out->lora_adapters);
  if (auto r = root.map("requests")) {
    r->get("default_max_tokens", &out->default_max_tokens, 0, int64_t{1} << 32);
    r->get("max_tokens_limit", &out->max_tokens_limit, 0, int64_t{1} << 32);
    r->get("max_model_len", &out->max_model_len, 0, int64_t{1} << 32);
    r->rejectUnknownKeys();
  }
  root.get("decision_log", &out->decision_log);
  root.get("worker_token", &out->worker_token);
  if (auto a = root.map("admin")) {
    a->get("token", &out->admin_token);
    a->rejectUnknownKeys();
  }
}

}  // namespace

absl::StatusOr<RouterConfig> loadRouterConfig(const std::string& path,
                                              const policy::PolicyRegistry& policies) {
  return config::parseFile<RouterConfig>(
      path, [&](config::ConfigMap& root, RouterConfig* out) { parseRoot(root, out, policies); });
}

absl::StatusOr<RouterConfig> parseRouterConfig(std::string_view yaml, std::string_view source,
                                               const policy::PolicyRegistry& policies) {
  return config::parseText<RouterConfig>(
      yaml, source,
      [&](config::ConfigMap& root, RouterConfig* out) { parseRoot(root, out, policies); });
}

}  // namespace kvf::router
