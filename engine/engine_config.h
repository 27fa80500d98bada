// Configuration of one emulated engine instance (kvf-engine --config engine.yaml): server
// address, profile, cache and scheduler limits, time scale and KV-event sockets. Parsed once in
// parseEngineConfig() with every problem reported by field path; command-line flags override
// per-instance fields afterwards. Plain value; read-only after startup.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/scheduler.h"
#include "engine/timing_model.h"

namespace kvf::engine {

struct CacheConfig {
  int block_size = 16;
  int64_t num_gpu_blocks = 0;  // 0: profile kv_cache_tokens / block_size
  size_t payload_bytes_per_block = 256;
  bool enable_prefix_caching = true;
};

struct KvEventsConfig {
  bool enabled = true;
  std::string endpoint = "tcp://*:5557";
  std::string replay_endpoint = "tcp://*:5558";  // empty disables replay
  std::string topic = "kv-events";
  int64_t buffer_batches = 10000;
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
  int64_t max_body_bytes = 64 * 1024 * 1024;
  std::string log_level = "info";
};

// Parses YAML text; profile paths are resolved relative to `base_dir`.
absl::StatusOr<EngineConfig> parseEngineConfig(std::string_view text, std::string_view source,
                                               const std::string& base_dir);
absl::StatusOr<EngineConfig> loadEngineConfig(const std::string& path);
// Fills derived fields (blocks, max_model_len, model name) and checks cross-field limits.
absl::Status finalizeEngineConfig(EngineConfig* config);

}  // namespace kvf::engine
