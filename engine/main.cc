// kvf-engine: one emulated vLLM-compatible engine instance. Wires config, flags, signals and
// the EngineServer together.
#include <csignal>
#include <iostream>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include "absl/flags/flag.h"
#include "common/cli.h"
#include "common/log.h"
#include "common/ready_file.h"
#include "engine/engine_config.h"
#include "engine/engine_server.h"

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
  boost::asio::signal_set signals(ioc, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code&, int) {
    kvf::log::info("shutting down");
    (*server)->stop();
    ioc.stop();
  });
  (*server)->start();
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
