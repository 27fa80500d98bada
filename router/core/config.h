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
#include "router/core/admission.h"

namespace kvf::router {

struct KvEventsConfig {
  std::string endpoint;         // ZMQ PUB endpoint, e.g. tcp://127.0.0.1:5557; empty: no events
  std::string replay_endpoint;  // ZMQ ROUTER endpoint for gap recovery; empty: none
  // A prefix filter, as ZMQ subscriptions are; "" (vLLM's default) receives every topic.
  std::string topic;
  // vLLM with data parallelism publishes one stream per rank, rank r on the endpoint's (and the
  // replay endpoint's) port + r; each is subscribed and indexed as its own stream.
  int data_parallel_size = 1;
};

// The endpoint of data-parallel rank `rank`: the port after the last ':' plus rank (vLLM's
// offset_endpoint_port for tcp); rank 0 and empty endpoints unchanged.
std::string rankEndpoint(const std::string& endpoint, int rank);

struct InstanceConfig {
  std::string id;
  std::string url;   // http://host:port
  std::string host;  // parsed from url
  uint16_t port = 0;
  KvEventsConfig kv_events;
  // The engine's worker control server (http://host:port), for KV push and prefill offload;
  // empty: the instance never takes part in either.
  std::string worker_url;
  // The engine's KV capacity in blocks (per data-parallel rank): what its KV events may make
  // the router index. 0: learned from the engine's /metrics (vllm:cache_config_info's
  // num_gpu_blocks), else only index.max_blocks_per_instance bounds it.
  uint64_t kv_capacity_blocks = 0;
  // How KV reaches a decode instance from this one as the holder (prefill instance P or cache
  // holder C): "kvfabric" (the decode instance's worker pulls from worker_url with kvfabric's
  // push) or "nixl" (vLLM's NixlConnector: a first leg with do_remote_decode to this instance,
  // its remote_* answer passed unchanged to the decode instance, which reads the blocks). With
  // nixl, worker_url (optional) is the instance's NIXL side channel: its answer's remote_host
  // and remote_port must name it (without one, remote_host must be the host of `url`).
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

// Router replicas (docs/router.md "Replicas"): this replica publishes its in-flight load per
// instance on `publish` (ZMQ PUB) and subscribes to each of `peers`; every message is signed
// with a key derived from worker_token. Off while `id` is empty.
struct ReplicasConfig {
  std::string id;                                  // this replica's id, unique among the replicas
  std::string publish;                             // ZMQ endpoint it binds, e.g. tcp://0.0.0.0:7600
  std::vector<std::string> peers;                  // the other replicas' publish endpoints
  Nanos sync_interval = 1 * kNanosPerMilli;        // deltas batched this long
  Nanos snapshot_interval = 100 * kNanosPerMilli;  // a full snapshot (and heartbeat) this often
  Nanos peer_timeout = 500 * kNanosPerMilli;       // silent this long: its load is dropped
  size_t max_message_bytes = 256u << 10;
  size_t max_peers = 64;
  // A message whose send time is further than this from the receiver's clock is refused (with
  // the per-epoch sequence, this bounds replays of captured messages).
  Nanos max_clock_skew = 30 * kNanosPerSecond;
  bool enabled() const { return !id.empty(); }
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
  ReplicasConfig replicas;
  OverloadConfig overload;            // saturation, the router-side queue and shedding
  int max_attempts = 3;               // connection attempts per request (first + retries)
  int circuit_failure_threshold = 5;  // consecutive request failures -> circuit open
  Nanos circuit_open = 10 * kNanosPerSecond;
  Nanos connect_timeout = 2 * kNanosPerSecond;
  Nanos read_timeout = 600 * kNanosPerSecond;  // longest gap between upstream bytes
  // An instance with requests in flight that shows no sign of life (no byte on any of its
  // responses, no health answer) for this long is stalled: its requests without a first byte
  // are retried elsewhere, its started streams end with an SSE error, and it takes nothing new
  // until a health check passes (docs/router.md "Stalls"). 0: off. Must exceed health.interval.
  Nanos stall_timeout = 5 * kNanosPerSecond;
  // No new attempt (retry) starts later than this after the request arrived.
  Nanos retry_deadline = 30 * kNanosPerSecond;
  // String and chat prompts are tokenized through an admitted instance's POST /tokenize so
  // they hash exactly; false (or a failed call) falls back to the approximate text index.
  bool tokenize = false;
  Nanos tokenize_timeout = 2 * kNanosPerSecond;
  std::string decision_log;               // JSONL path; empty: no log
  std::string admin_token;                // bearer token; empty: admin API disabled
  size_t max_kv_event_bytes = 32u << 20;  // one batch payload (kv_events.max_message_bytes)
  // An instance with events that served requests but published nothing for this long is
  // flagged events_silent (kv_events.silent_after_s).
  Nanos kv_events_silent_after = 30 * kNanosPerSecond;
  // Model names that are LoRA adapters (vLLM: --lora-modules name=path): a request for one is
  // hashed with the adapter's name, as the engine hashes its blocks. Any other model name is a
  // base model.
  std::vector<std::string> lora_adapters;
  // Output tokens (the `requests:` block): a request without max_tokens gets
  // default_max_tokens (0: vLLM's default, 16 for completions and the rest of the context for
  // chat); a larger one is capped at max_tokens_limit (0: none). Either rewrites the body the
  // engine sees; the load accounting uses the value the engine will use. max_model_len (0:
  // learned from the engines' /v1/models) sizes chat's "rest of the context".
  int64_t default_max_tokens = 0;
  int64_t max_tokens_limit = 0;
  int64_t max_model_len = 0;
  // The cluster's worker token (`worker_token`; empty: env KVF_WORKER_TOKEN, read in main).
  // The router signs the kv_transfer_params it sends with a key derived from it; engines act
  // only on signed params (docs/security.md). Empty: sent unsigned (insecure engines only).
  std::string worker_token;
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
