// The live emulated engine: an OpenAI-compatible HTTP server (completions, chat, streaming,
// /health, /v1/models, /tokenize, /metrics with vLLM names) in front of an EngineCore that a
// coroutine steps on absolute deadlines (modelled step time / time_scale, so time does not drift
// under load), plus the worker's KV-event publisher. HTTP runs on the io_context given to
// create() (run it from exactly one thread); the core and its step loop run on an internal
// thread started by start(); the publisher has its own thread. Call stop() on the HTTP thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>

#include "absl/status/statusor.h"
#include "common/http.h"
#include "engine/engine_config.h"
#include "engine/engine_core.h"

namespace kvf::engine {

class EngineServer {
 public:
  // Binds the HTTP port and the KV-event sockets; nothing runs until start().
  static absl::StatusOr<std::unique_ptr<EngineServer>> create(asio::io_context& ioc,
                                                              EngineConfig config);
  ~EngineServer();
  EngineServer(const EngineServer&) = delete;
  EngineServer& operator=(const EngineServer&) = delete;

  void start();
  // Stops accepting and stepping (call on the io thread or before it runs).
  void stop();

  uint16_t port() const;
  // The worker control server (KV push); 0 / empty when worker.port is 0.
  uint16_t workerPort() const;
  std::string workerUrl() const;
  std::string kvEventsEndpoint() const;
  std::string kvReplayEndpoint() const;
  const EngineConfig& config() const;

 private:
  struct Impl;
  explicit EngineServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvf::engine
