// kvf-engine: one emulated vLLM-compatible engine instance. Wires config, flags, signals and
// the EngineServer together.
#include <csignal>
#include <iostream>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include "absl/flags/flag.h"
#include "common/cli.h"
#include "common/log.h"
#include "common/ready_file.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/engine_config.h"
#include "engine/engine_server.h"
#include "membership/lease_registration.h"

ABSL_FLAG(std::string, config, "",
          "Engine YAML config (engine/configs/engine.yaml is the default cluster's; see "
          "docs/engine.md). Required.");
ABSL_FLAG(int, port, -1, "HTTP port; overrides the config (0 picks a free port)");
ABSL_FLAG(std::string, host, "", "HTTP bind address; overrides the config");
ABSL_FLAG(std::string, instance_id, "", "Instance name in logs and request ids; overrides config");
ABSL_FLAG(std::string, kv_events_endpoint, "",
          "ZMQ PUB bind address for KV events, e.g. tcp://*:5557; overrides the config");
ABSL_FLAG(std::string, kv_replay_endpoint, "",
          "ZMQ ROUTER bind address for KV-event replay; overrides the config");
ABSL_FLAG(int, worker_port, -1,
          "Worker control server port for KV push (POST /kv/push); overrides the config; "
          "0 disables it");
ABSL_FLAG(double, time_scale, 0,
          "Modelled seconds per wall second (8: the modelled clock runs 8x faster, so every "
          "modelled latency takes 1/8 of its wall time); overrides the config if > 0. Replay "
          "with the same kvf-replay --time_scale to keep the modelled load.");
ABSL_FLAG(std::string, log_level, "", "trace, debug, info, warn, error; overrides the config");
ABSL_FLAG(std::string, ready_file, "",
          "Once listening, write the HTTP port and a newline to this file (atomically; removed "
          "at start and on exit), so a script can wait for it: until [ -s FILE ]; do sleep "
          "0.1; done. GET /health answers 200 from then on.");

namespace {

namespace km = kvf::membership;

bool isWildcard(std::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "*";
}

std::string hostForUrl(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

// Registers the running engine in etcd: {id, url, kv_events, worker_url} as routers reach it.
absl::StatusOr<std::shared_ptr<km::LeaseRegistration>> startRegistration(
    boost::asio::io_context& ioc, const kvf::engine::EngineServer& server) {
  const auto& c = server.config();
  KVF_RETURN_IF_ERROR(km::validateInstanceId(c.instance_id));
  std::string host = c.membership.advertise_host.empty() ? c.host : c.membership.advertise_host;
  if (isWildcard(host)) {
    return absl::InvalidArgumentError(
        "membership.advertise_host is required when the engine listens on a wildcard host");
  }
  km::InstanceRecord record;
  record.id = c.instance_id;
  record.url = kvf::strCat("http://", hostForUrl(host), ":", server.port());
  record.kv_events_endpoint = km::connectableEndpoint(server.kvEventsEndpoint(), hostForUrl(host));
  record.kv_replay_endpoint = km::connectableEndpoint(server.kvReplayEndpoint(), hostForUrl(host));
  if (!record.kv_events_endpoint.empty()) record.kv_topic = c.kv_events.topic;
  if (server.workerPort() != 0) {
    std::string worker_host = isWildcard(c.worker.host) ? host : c.worker.host;
    record.worker_url = kvf::strCat("http://", hostForUrl(worker_host), ":", server.workerPort());
  }
  KVF_ASSIGN_OR_RETURN(
      auto etcd, km::EtcdClient::create(ioc.get_executor(), km::clientOptions(c.membership.etcd)));
  km::RegistrationOptions options;
  options.key = km::instanceKey(c.membership.etcd.prefix, record.id);
  options.value = km::encodeInstanceRecord(record);
  options.lease_ttl_s = c.membership.etcd.lease_ttl_s;
  auto registration = km::LeaseRegistration::create(ioc.get_executor(), etcd, std::move(options));
  registration->start();
  return registration;
}

}  // namespace

int main(int argc, char** argv) {
  auto args = kvf::cli::parseFlags(
      argc, argv,
      "kvf-engine: one emulated vLLM-compatible engine instance: OpenAI API, paged prefix\n"
      "cache, a timing model calibrated from a hardware/model profile, vLLM's KV events and\n"
      "metrics (docs/engine.md).\n\n"
      "Usage: kvf-engine --config engine.yaml [--port N] [--instance_id ID]\n"
      "                  [--kv_events_endpoint tcp://*:P] [--kv_replay_endpoint tcp://*:P]\n"
      "                  [--worker_port N] [--time_scale S] [--ready_file FILE]\n\n"
      "SIGINT or SIGTERM stop it. Exit status: 0 stopped by a signal, 1 could not start, 2 a\n"
      "bad command line or config.");
  if (!args.empty()) kvf::cli::failUsage("kvf-engine", "unexpected argument '" + args[0] + "'");
  kvf::ReadyFile ready(absl::GetFlag(FLAGS_ready_file));
  std::string path = absl::GetFlag(FLAGS_config);
  if (path.empty()) kvf::cli::failUsage("kvf-engine", "--config is required");
  auto config = kvf::engine::loadEngineConfig(path);
  if (!config.ok()) {
    std::cerr << "kvf-engine: " << config.status().message() << "\n";
    return kvf::cli::kExitUsage;
  }
  if (absl::GetFlag(FLAGS_port) >= 0) config->port = absl::GetFlag(FLAGS_port);
  if (!absl::GetFlag(FLAGS_host).empty()) config->host = absl::GetFlag(FLAGS_host);
  if (!absl::GetFlag(FLAGS_instance_id).empty())
    config->instance_id = absl::GetFlag(FLAGS_instance_id);
  if (!absl::GetFlag(FLAGS_kv_events_endpoint).empty()) {
    config->kv_events.endpoint = absl::GetFlag(FLAGS_kv_events_endpoint);
  }
  if (!absl::GetFlag(FLAGS_kv_replay_endpoint).empty()) {
    config->kv_events.replay_endpoint = absl::GetFlag(FLAGS_kv_replay_endpoint);
  }
  if (absl::GetFlag(FLAGS_worker_port) >= 0) config->worker.port = absl::GetFlag(FLAGS_worker_port);
  if (absl::GetFlag(FLAGS_time_scale) > 0) config->time_scale = absl::GetFlag(FLAGS_time_scale);
  if (!absl::GetFlag(FLAGS_log_level).empty()) config->log_level = absl::GetFlag(FLAGS_log_level);
  if (config->port > 65535) kvf::cli::failUsage("kvf-engine", "--port must be in [0, 65535]");
  if (config->worker.port > 65535) {
    kvf::cli::failUsage("kvf-engine", "--worker_port must be in [0, 65535]");
  }
  kvf::log::init(config->instance_id, config->log_level);

  boost::asio::io_context ioc(1);
  auto server = kvf::engine::EngineServer::create(ioc, *config);
  if (!server.ok()) {
    kvf::log::error("cannot start engine", "error", std::string(server.status().message()));
    return kvf::cli::kExitFailure;
  }
  std::shared_ptr<km::LeaseRegistration> registration;
  boost::asio::signal_set signals(ioc, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code&, int) {
    kvf::log::info("shutting down");
    (*server)->stop();
    if (!registration) {
      ioc.stop();
      return;
    }
    // Routers drop the instance as soon as its lease is revoked, not a TTL later.
    boost::asio::co_spawn(
        ioc,
        [&ioc, registration]() -> boost::asio::awaitable<void> {
          co_await registration->stop();
          ioc.stop();
        },
        boost::asio::detached);
  });
  (*server)->start();
  if (config->membership.enabled) {
    auto started = startRegistration(ioc, **server);
    if (!started.ok()) {
      kvf::log::error("cannot register in etcd", "error", std::string(started.status().message()));
      return kvf::cli::kExitFailure;
    }
    registration = *started;
  }
  const auto& c = (*server)->config();
  kvf::log::info("kvf-engine ready", "instance", c.instance_id, "port", (*server)->port(), "model",
                 c.served_model_name, "profile", c.profile.name, "blocks", c.cache.num_gpu_blocks,
                 "block_size", c.cache.block_size, "kv_events", (*server)->kvEventsEndpoint(),
                 "kv_replay", (*server)->kvReplayEndpoint(), "worker", (*server)->workerUrl(),
                 "time_scale", c.time_scale);
  if (absl::Status s = ready.publish((*server)->port()); !s.ok()) {
    kvf::log::error("cannot signal readiness", "error", std::string(s.message()));
    return kvf::cli::kExitFailure;
  }
  ioc.run();
  return 0;
}
