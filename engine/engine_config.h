// Configuration of one emulated engine instance (kvf-engine --config engine.yaml): server
// address, profile, cache and scheduler limits, time scale and KV-event sockets. Parsed once in
// parseEngineConfig() with every problem reported by field path; command-line flags override
// per-instance fields afterwards. Plain value; read-only after startup.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/scheduler.h"
#include "engine/timing_model.h"
#include "membership/membership_config.h"
#include "worker/tiers/tiered_store.h"

namespace kvf::engine {

// Where the pool's block payloads live (docs/configuration.md, cache.payload_memory).
enum class PayloadLocation : uint8_t {
  kHost,    // the pool's own host allocation (every build)
  kDevice,  // device memory on CUDA device 0 (CUDA builds with a device; live engine only)
};

struct CacheConfig {
  int block_size = 16;
  int64_t num_gpu_blocks = 0;  // 0: profile kv_cache_tokens / block_size
  size_t payload_bytes_per_block = 256;
  bool enable_prefix_caching = true;
  PayloadLocation payload_memory = PayloadLocation::kHost;
};

struct KvEventsConfig {
  bool enabled = true;
  std::string endpoint = "tcp://*:5557";
  std::string replay_endpoint = "tcp://*:5558";  // empty disables replay
  std::string topic;                             // vLLM's default: "" (KVEventsConfig.topic)
  int64_t buffer_batches = 10000;
  // Replay buffer bound in encoded bytes. 8 MiB binds before the batch count at ordinary loads
  // (minutes of events at 2 MB/min), so the buffer's memory stops changing once it is full,
  // whatever the mix of batch sizes; a replay only has to cover a reconnect's gap.
  int64_t buffer_bytes = int64_t{8} << 20;
};

// The worker control server (KV push, docs/protocols.md "KV push").
struct WorkerConfig {
  int port = 0;  // 0: disabled (kvf-engine --worker_port N enables it)
  std::string host = "127.0.0.1";
  // The cluster's worker token: bearer token for /kv/* and, through a derived key, what
  // authenticates the router's kv_transfer_params (docs/security.md). Empty: env
  // KVF_WORKER_TOKEN. With neither, the engine refuses to start unless `insecure` is set.
  std::string token;
  // Runs the worker API without authentication and accepts unsigned kv_transfer_params: any
  // client of the engine's port may then point it at a peer or pin its cache (test only).
  bool insecure = false;
  // How far a signed kv_transfer_params' time may be from this engine's clock.
  int64_t transfer_auth_window_ms = 30000;
  // The URL peers reach this worker at (a push names it; the holder claims the landing there).
  // Empty: http://<membership.advertise_host or host>:<port>.
  std::string advertise_url;
  // The cluster's worker URLs (the router's registry). Non-empty: pushes only to receivers
  // listed here (docs/security.md).
  std::vector<std::string> peers;
  int64_t max_push_blocks = 65536;  // blocks per push (both directions)
  // With tiers: the bounce region pushes read disk blocks into (docs/tiers.md). 0: pushes
  // serve no block from disk.
  int64_t push_bounce_mib = 64;
  std::string transports = "shm";         // UCX transports (transport::TransportOptions)
  std::string net_devices;                // UCX_NET_DEVICES for tcp/rdma; empty: all
  int64_t push_deadline_cap_ms = 1000;    // cap of the default receiver deadline
  int64_t push_deadline_margin_ms = 100;  // default deadline = modelled transfer + margin
  // Layer-wise push: the pushed KV is usable layer by layer, so the modelled transfer overlaps
  // the first prefill step (it ends at max(step, transfer + step / layers)). false: the
  // request waits for the whole modelled transfer before it is scheduled.
  bool layerwise = true;
  // Which dialect of kv_transfer_params this engine answers: "kvfabric" (source/lease_id, the
  // holder pushes) or "nixl" (vLLM's NixlConnector: P returns remote_* fields, D reads).
  std::string kv_connector = "kvfabric";
  std::string engine_id;  // nixl: P's remote_engine_id; empty: the instance id
  // Remote-decode leases pin KV for a peer: bounded in time, in number and in blocks so that
  // no sender can pin the cache (docs/security.md). Requests beyond a bound are refused (429).
  // A NIXL-dialect lease is a lease: the same bounds hold, and a heartbeat (/kv/nixl/meta)
  // never extends one past max_lease_ms from its start.
  int64_t default_lease_ms = 30000;  // do_remote_decode without lease_ms (vLLM's kv_lease_duration)
  int64_t max_lease_ms = 60000;
  int64_t max_leases = 64;            // held plus being prefilled
  double max_leased_fraction = 0.25;  // of the KV cache's blocks, held plus being prefilled
  // TEST ONLY fault injection on the holder side: "" (none), "corrupt" (push damaged bytes
  // with the checksums of the good ones), "corrupt_content" (damaged bytes, matching
  // checksums), "stall" (wait fault_stall_ms before pushing).
  std::string fault;
  int64_t fault_stall_ms = 3000;
};

// Self-registration in etcd (docs/configuration.md, "Membership in etcd"): the engine puts
// {id, url, kv_events, worker_url} under <prefix><instance_id> with a lease it keeps alive, and
// revokes the lease on SIGTERM.
struct MembershipConfig {
  bool enabled = false;  // a membership.etcd block is present
  membership::EtcdConfig etcd;
  // The host routers reach this engine at; empty: `host` (required when host is a wildcard).
  std::string advertise_host;
};

struct EngineConfig {
  std::string instance_id = "engine-0";
  std::string served_model_name;  // default: the profile's model name
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string profile_path;  // as written; resolved relative to the config file
  Profile profile;
  int64_t max_model_len = 0;  // 0: the profile's
  double time_scale = 1.0;    // > 1 runs the modelled clock faster than wall time
  CacheConfig cache;
  SchedulerConfig scheduler;
  KvEventsConfig kv_events;
  WorkerConfig worker;
  MembershipConfig membership;
  // KV tiers below the pool (docs/tiers.md, `tiers:`); absent: none (the default). The block
  // size is the pool's payload_bytes_per_block; budgets count the tiers' slots (4 KiB each).
  std::optional<worker::TieredStoreOptions> tiers;
  int64_t max_body_bytes = 64 * 1024 * 1024;
  int64_t max_connections = 4096;             // client connections (common/http_server.h)
  int64_t max_connections_per_client = 1024;  // per source address; 0: no per-client cap
  std::string log_level = "info";
  // Niceness added to the HTTP thread (0-19) so the step thread wins the CPU when many engines
  // share few cores: step deadlines stay on time while request parsing waits a little.
  int64_t io_thread_nice = 5;
};

// Parses YAML text; profile paths are resolved relative to `base_dir`.
absl::StatusOr<EngineConfig> parseEngineConfig(std::string_view text, std::string_view source,
                                               const std::string& base_dir);
absl::StatusOr<EngineConfig> loadEngineConfig(const std::string& path);
// Fills derived fields (blocks, max_model_len, model name) and checks cross-field limits.
absl::Status finalizeEngineConfig(EngineConfig* config);
// The cross-field rules of cache.payload_memory: device (payload bytes, no worker port), checked
// by finalizeEngineConfig and again once command-line flags have been applied.
absl::Status checkPayloadMemory(const EngineConfig& config);

}  // namespace kvf::engine
