// The `etcd:` block shared by everything that takes part in etcd membership (the engine's and
// the router's `membership:` blocks, kvf-register's flags), and the record an instance
// registers: {id, url, kv_events, worker_url} as JSON under <prefix><id>. Plain values, parsed
// once; see docs/configuration.md ("Membership in etcd").
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/config.h"
#include "membership/etcd_client.h"

namespace kvf::membership {

inline constexpr char kDefaultPrefix[] = "/kvfabric/instances/";
inline constexpr size_t kMaxIdBytes = 128;
inline constexpr size_t kMaxRecordBytes = 16 * 1024;

struct EtcdConfig {
  // Out of line: inlined into a large config struct's value-initialization, the strings trip
  // GCC 12's -Wmaybe-uninitialized at -O3.
  EtcdConfig();

  std::vector<std::string> endpoints;   // http://host:port
  std::string prefix = kDefaultPrefix;  // every key starts with it
  int64_t lease_ttl_s = 10;             // registrants: the lease's time to live
  double request_timeout_s = 2;         // each call to etcd
  double probe_interval_s = 1;          // watchers: how often etcd's liveness is checked
};

enum class EtcdRole { kRegistrant, kWatcher };

// Reads `map` (the etcd: block) into `out`; lease_ttl_s is a registrant's key, probe_interval_s
// a watcher's, and the other role's key is rejected as unknown.
void parseEtcdConfig(config::ConfigMap& map, EtcdRole role, EtcdConfig* out);
EtcdClientOptions clientOptions(const EtcdConfig& config);

struct InstanceRecord {
  std::string id;
  std::string url;                 // http://host:port of the OpenAI server
  std::string kv_events_endpoint;  // ZMQ PUB endpoint to connect to; empty: none
  std::string kv_replay_endpoint;
  std::string kv_topic;    // empty: the router's default
  std::string worker_url;  // empty: no KV push
};

// An id is 1-128 bytes of [A-Za-z0-9._:-]: it becomes the last segment of a key and a metric
// label.
absl::Status validateInstanceId(std::string_view id);
std::string instanceKey(std::string_view prefix, std::string_view id);
// The JSON value registered for an instance (the router reads it as an `instances:` entry).
std::string encodeInstanceRecord(const InstanceRecord& record);
// A bind endpoint as peers connect to it: "tcp://*:5557" or "tcp://0.0.0.0:5557" with
// `advertise_host` in place of the wildcard; other endpoints unchanged.
std::string connectableEndpoint(std::string_view bind_endpoint, std::string_view advertise_host);

}  // namespace kvf::membership
