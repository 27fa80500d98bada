#include "engine/engine_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/status.h"
#include "common/strings.h"
#include "worker/tiers/tier_config.h"

namespace kvf::engine {
namespace {

void parseCache(config::ConfigMap& m, CacheConfig* c) {
  m.get("block_size", &c->block_size, 1, 1024);
  m.get("num_gpu_blocks", &c->num_gpu_blocks, 0, int64_t{1} << 30);
  uint64_t payload = c->payload_bytes_per_block;
  m.get("payload_bytes_per_block", &payload, 0, uint64_t{1} << 24);
  c->payload_bytes_per_block = payload;
  m.get("enable_prefix_caching", &c->enable_prefix_caching);
  std::string memory = c->payload_memory == PayloadLocation::kDevice ? "device" : "host";
  m.get("payload_memory", &memory);
  if (memory == "host") {
    c->payload_memory = PayloadLocation::kHost;
  } else if (memory == "device") {
    c->payload_memory = PayloadLocation::kDevice;
  } else {
    m.fail("payload_memory", strCat("must be host or device, got '", memory, "'"));
  }
  m.rejectUnknownKeys();
}

void parseScheduler(config::ConfigMap& m, SchedulerConfig* s) {
  m.get("max_num_batched_tokens", &s->max_num_batched_tokens, 1, int64_t{1} << 24);
  m.get("max_num_seqs", &s->max_num_seqs, 1, 1 << 20);
  m.get("enable_chunked_prefill", &s->enable_chunked_prefill);
  m.get("long_prefill_token_threshold", &s->long_prefill_token_threshold, 0, int64_t{1} << 24);
  m.get("hash_seed", &s->hash_seed, 0, ~uint64_t{0});
  m.get("eos_token_id", &s->eos_token_id, -1, int64_t{1} << 24);
  std::string onboard = s->onboard == OnboardMode::kLayerwise ? "layerwise" : "whole";
  m.get("onboard", &onboard);
  if (onboard == "whole") {
    s->onboard = OnboardMode::kWhole;
  } else if (onboard == "layerwise") {
    s->onboard = OnboardMode::kLayerwise;
  } else {
    m.fail("onboard", strCat("must be whole or layerwise, got '", onboard, "'"));
  }
  m.rejectUnknownKeys();
}

void parseKvEvents(config::ConfigMap& m, KvEventsConfig* k) {
  m.get("enabled", &k->enabled);
  m.get("endpoint", &k->endpoint);
  m.get("replay_endpoint", &k->replay_endpoint);
  m.get("topic", &k->topic);
  m.get("buffer_batches", &k->buffer_batches, 1, 10'000'000);
  m.get("buffer_bytes", &k->buffer_bytes, 4096, int64_t{1} << 40);
  m.rejectUnknownKeys();
}

void parseWorker(config::ConfigMap& m, WorkerConfig* w) {
  m.get("port", &w->port, 0, 65535);
  m.get("host", &w->host);
  m.get("token", &w->token);
  m.get("insecure", &w->insecure);
  m.get("transfer_auth_window_ms", &w->transfer_auth_window_ms, 1, 600'000);
  m.get("advertise_url", &w->advertise_url);
  if (!w->advertise_url.empty() && !w->advertise_url.starts_with("http://")) {
    m.fail("advertise_url", "must be http://host:port");
  }
  m.get("peers", &w->peers);
  for (const std::string& peer : w->peers) {
    if (!peer.starts_with("http://"))
      m.fail("peers", strCat("'", peer, "' is not http://host:port"));
  }
  m.get("max_push_blocks", &w->max_push_blocks, 1, int64_t{1} << 20);
  m.get("push_bounce_mib", &w->push_bounce_mib, 0, int64_t{1} << 16);
  m.get("transports", &w->transports);
  m.get("net_devices", &w->net_devices);
  m.get("push_deadline_cap_ms", &w->push_deadline_cap_ms, 1, 60'000);
  m.get("push_deadline_margin_ms", &w->push_deadline_margin_ms, 0, 60'000);
  m.get("layerwise", &w->layerwise);
  m.get("kv_connector", &w->kv_connector);
  if (w->kv_connector != "kvfabric" && w->kv_connector != "nixl") {
    m.fail("kv_connector", "must be kvfabric or nixl");
  }
  m.get("engine_id", &w->engine_id);
  m.get("default_lease_ms", &w->default_lease_ms, 1, 86'400'000);
  m.get("max_lease_ms", &w->max_lease_ms, 1, 3'600'000);
  m.get("max_leases", &w->max_leases, 0, 1'000'000);
  m.get("max_leased_fraction", &w->max_leased_fraction, 0.0, 1.0);
  m.get("fault", &w->fault);
  if (!w->fault.empty() && w->fault != "corrupt" && w->fault != "corrupt_content" &&
      w->fault != "stall") {
    m.fail("fault", "must be one of corrupt, corrupt_content, stall (test only)");
  }
  m.get("fault_stall_ms", &w->fault_stall_ms, 0, 600'000);
  m.rejectUnknownKeys();
}

void parseMembership(config::ConfigMap& m, MembershipConfig* out) {
  m.require("etcd");
  if (auto e = m.map("etcd")) {
    out->enabled = true;
    membership::parseEtcdConfig(*e, membership::EtcdRole::kRegistrant, &out->etcd);
  }
  m.get("advertise_host", &out->advertise_host);
  m.rejectUnknownKeys();
}

void parseRoot(config::ConfigMap& root, EngineConfig* c) {
  root.get("instance_id", &c->instance_id);
  root.get("served_model_name", &c->served_model_name);
  root.get("host", &c->host);
  root.get("port", &c->port, 0, 65535);
  root.require("profile");
  root.get("profile", &c->profile_path);
  root.get("max_model_len", &c->max_model_len, 0, int64_t{1} << 24);
  root.get("time_scale", &c->time_scale, 1e-3, 1e6);
  root.get("max_body_bytes", &c->max_body_bytes, 1024, int64_t{1} << 32);
  root.get("max_connections", &c->max_connections, 1, int64_t{1} << 20);
  root.get("max_connections_per_client", &c->max_connections_per_client, 0, int64_t{1} << 20);
  root.get("log_level", &c->log_level);
  root.get("io_thread_nice", &c->io_thread_nice, 0, 19);
  if (auto m = root.map("cache")) parseCache(*m, &c->cache);
  if (auto m = root.map("scheduler")) parseScheduler(*m, &c->scheduler);
  if (auto m = root.map("kv_events")) parseKvEvents(*m, &c->kv_events);
  if (auto m = root.map("worker")) parseWorker(*m, &c->worker);
  if (auto m = root.map("membership")) parseMembership(*m, &c->membership);
  if (auto m = root.map("tiers")) worker::parseTierConfig(*m, &c->tiers.emplace());
}

}  // namespace

absl::StatusOr<EngineConfig> parseEngineConfig(std::string_view text, std::string_view source,
                                               const std::string& base_dir) {
  KVF_ASSIGN_OR_RETURN(EngineConfig c, config::parseText<EngineConfig>(text, source, parseRoot));
  std::filesystem::path p(c.profile_path);
  if (p.is_relative() && !base_dir.empty()) p = std::filesystem::path(base_dir) / p;
  auto profile = loadProfile(p.string());
  if (!profile.ok()) return annotate(profile.status(), strCat(source, ": profile"));
  c.profile = std::move(*profile);
  KVF_RETURN_IF_ERROR(finalizeEngineConfig(&c));
  return c;
}

absl::StatusOr<EngineConfig> loadEngineConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(strCat("cannot read config file ", path));
  std::stringstream text;
  text << in.rdbuf();
  std::string dir = std::filesystem::path(path).parent_path().string();
  return parseEngineConfig(text.str(), path, dir);
}

absl::Status checkPayloadMemory(const EngineConfig& c) {
  if (c.cache.payload_memory != PayloadLocation::kDevice) return absl::OkStatus();
  if (c.cache.payload_bytes_per_block == 0) {
    return absl::InvalidArgumentError(
        "cache.payload_memory: device needs cache.payload_bytes_per_block > 0");
  }
  if (c.worker.port != 0) {
    // The agent registers the pool's region and reads and writes it from the host (the
    // checksums, the landing checks): a device region would need its own registration path.
    return absl::InvalidArgumentError(
        "cache.payload_memory: device cannot serve KV push (worker.port / --worker_port): use "
        "payload_memory: host on an engine with a worker port");
  }
  return absl::OkStatus();
}

absl::Status finalizeEngineConfig(EngineConfig* c) {
  const ModelShape& m = c->profile.model;
  if (c->served_model_name.empty()) c->served_model_name = m.name;
  if (c->max_model_len == 0) c->max_model_len = m.max_model_len;
  if (c->cache.num_gpu_blocks == 0) {
    c->cache.num_gpu_blocks = c->profile.kv_cache_tokens / c->cache.block_size;
  }
  c->scheduler.vocab_size = m.vocab_size;
  if (c->scheduler.eos_token_id < 0) {
    c->scheduler.eos_token_id = m.eos_token_id >= 0 ? m.eos_token_id : m.vocab_size - 1;
  }
  if (c->scheduler.eos_token_id >= m.vocab_size) {
    return absl::InvalidArgumentError(strCat("scheduler.eos_token_id ", c->scheduler.eos_token_id,
                                             " is outside the vocabulary (", m.vocab_size, ")"));
  }
  if (c->tiers) {
    // The tiers hold the pool's payload bytes (the simulator's pool has none: its accounting
    // counts the same slots).
    c->tiers->host.block_bytes = c->cache.payload_bytes_per_block;
    c->tiers->host.has_lower_tier = c->tiers->disk.has_value();
    if (c->tiers->disk) c->tiers->disk->block_bytes = c->cache.payload_bytes_per_block;
    if (!c->cache.enable_prefix_caching) {
      return absl::InvalidArgumentError(
          "tiers: needs cache.enable_prefix_caching (only cached blocks are offloaded)");
    }
  }
  if (c->cache.num_gpu_blocks < 1) {
    return absl::InvalidArgumentError("cache: the KV cache must hold at least one block");
  }
  KVF_RETURN_IF_ERROR(checkPayloadMemory(*c));
  if (!c->scheduler.enable_chunked_prefill &&
      c->scheduler.max_num_batched_tokens < c->max_model_len) {
    return absl::InvalidArgumentError(
        "scheduler.max_num_batched_tokens must be >= max_model_len without chunked prefill");
  }
  return absl::OkStatus();
}

}  // namespace kvf::engine
