// kvf-router configuration: one YAML file parsed once into RouterConfig (defaults in the
// struct), validated with every problem reported by field path. Read-only after parsing.
// See docs/router.md for the reference.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/config.h"
#include "membership/membership_config.h"
#include "policy/cache_index.h"
#include "policy/policy.h"
#include "policy/registry.h"

namespace kvf::router {

struct KvEventsConfig {
  std::string endpoint;         // ZMQ PUB endpoint, e.g. tcp://127.0.0.1:5557; empty: no events
  std::string replay_endpoint;  // ZMQ ROUTER endpoint for gap recovery; empty: none
  std::string topic = "kv-events";
};

struct InstanceConfig {
  std::string id;
  std::string url;   // http://host:port
  std::string host;  // parsed from url
  uint16_t port = 0;
  KvEventsConfig kv_events;
  // The engine's worker control server (http://host:port), for KV push and prefill offload;
  // empty: the instance never takes part in either.
  std::string worker_url;
  // How KV reaches a decode instance from this one as the holder (prefill instance P or cache
  // holder C): "kvfabric" (the decode instance's worker pulls from worker_url with kvfabric's
  // push) or "nixl" (vLLM's NixlConnector: a first leg with do_remote_decode to this instance,
  // its remote_* answer passed unchanged to the decode instance, which reads the blocks).
  // Default: kvfabric with a worker_url.
  std::string kv_connector = "kvfabric";
};

struct HealthConfig {
  Nanos interval = 1 * kNanosPerSecond;
  Nanos timeout = 1 * kNanosPerSecond;
  int unhealthy_threshold = 2;  // consecutive failed checks -> ejected
  int healthy_threshold = 1;    // consecutive passed checks -> re-admitted
  bool scrape_metrics = true;   // read waiting / KV usage from the engine's /metrics
};

// Where instances come from besides `instances:`: nowhere (static), or etcd leases.
enum class MembershipSource { kStatic, kEtcd };

struct RouterConfig {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;
  size_t max_body_bytes = 32u << 20;
  size_t max_connections = 4096;             // client connections (common/http_server.h)
  size_t max_connections_per_client = 1024;  // per source address; 0: no per-client cap
  std::vector<InstanceConfig> instances;
  MembershipSource membership = MembershipSource::kStatic;
  membership::EtcdConfig etcd;  // membership.etcd (source: etcd)
  policy::PolicyConfig policy;
  policy::CacheIndexConfig index;
  HealthConfig health;
  int max_attempts = 3;               // connection attempts per request (first + retries)
  int circuit_failure_threshold = 5;  // consecutive request failures -> circuit open
  Nanos circuit_open = 10 * kNanosPerSecond;
  Nanos connect_timeout = 2 * kNanosPerSecond;
  Nanos read_timeout = 600 * kNanosPerSecond;  // longest gap between upstream bytes
  // String and chat prompts are tokenized through an admitted instance's POST /tokenize so
  // they hash exactly; false (or a failed call) falls back to the approximate text index.
  bool tokenize = false;
  Nanos tokenize_timeout = 2 * kNanosPerSecond;
  std::string decision_log;               // JSONL path; empty: no log
  std::string admin_token;                // bearer token; empty: admin API disabled
  size_t max_kv_event_bytes = 64u << 20;  // one batch payload
  // io.busy_poll_us: after handling an event, the io thread polls without sleeping for this
  // long before it blocks (0: block at once). See docs/router.md ("io").
  Nanos busy_poll = 0;
};

// Parses "http://host:port" (no path); InvalidArgument otherwise.
absl::Status parseInstanceUrl(std::string_view url, std::string* host, uint16_t* port);

void parseInstanceConfig(config::ConfigMap& map, InstanceConfig* out);
// `policies`: where `policy.kind` is looked up (must outlive the config).
absl::StatusOr<RouterConfig> loadRouterConfig(
    const std::string& path,
    const policy::PolicyRegistry& policies = policy::PolicyRegistry::builtin());
absl::StatusOr<RouterConfig> parseRouterConfig(
    std::string_view yaml, std::string_view source,
    const policy::PolicyRegistry& policies = policy::PolicyRegistry::builtin());

}  // namespace kvf::router
