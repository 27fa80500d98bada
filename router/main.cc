// kvf-router: the cache-aware OpenAI-compatible router. Wires config, io_context and signals.
#include <malloc.h>

#include <csignal>
#include <cstdlib>
#include <iostream>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include "absl/flags/flag.h"
#include "common/cli.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/ready_file.h"
#include "router/core/config.h"
#include "router/event_loop.h"
#include "router/router.h"

ABSL_FLAG(std::string, config, "",
          "Router YAML config (instances, policy, index, health, admin; see docs/router.md). "
          "Required.");
ABSL_FLAG(std::string, log_level, "info", "Log level: trace, debug, info, warn, error, off.");
ABSL_FLAG(int, port, -1,
          "Overrides listen.port of the config (default 8000) when >= 0; 0 picks a free port.");
ABSL_FLAG(std::string, ready_file, "",
          "Once listening, write the HTTP port and a newline to this file (atomically; removed "
          "at start and on exit), so a script can wait for it: until [ -s FILE ]; do sleep "
          "0.1; done. The router then answers GET /health with 200 as soon as one instance "
          "is admitted.");

int main(int argc, char** argv) {
  auto args = kvf::cli::parseFlags(
      argc, argv,
      "kvf-router: cache-aware OpenAI-compatible router in front of LLM engine instances\n"
      "(docs/router.md, docs/policies.md).\n\n"
      "Usage: kvf-router --config router.yaml [--port N] [--ready_file FILE]\n\n"
      "Prints \"kvf-router listening on port N\" on stdout once it listens; SIGINT or SIGTERM\n"
      "stop it. Exit status: 0 stopped by a signal, 1 could not start, 2 a bad command line or\n"
      "config.");
  if (!args.empty()) kvf::cli::failUsage("kvf-router", "unexpected argument '" + args[0] + "'");
  if (absl::GetFlag(FLAGS_port) > 65535) {
    kvf::cli::failUsage("kvf-router", "--port must be in [0, 65535]");
  }
  kvf::ReadyFile ready(absl::GetFlag(FLAGS_ready_file));
  kvf::log::init("kvf-router", absl::GetFlag(FLAGS_log_level));
  // A 100k-token prompt is a ~700 KB body and a few MB of parsed JSON and hashes. Keep freed
  // memory in the heap rather than mmap/munmap (and page-fault) it per request: that was
  // the largest cost in the router's profile at 50 req/s.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  // No fastbins: the per-request coroutine frames above ~1 KB are "large" allocations, and
  // each one first merged every small block freed since (malloc_consolidate, ~2% of the
  // router's CPU at 1k tokens); small blocks are still cached per thread (tcache).
  mallopt(M_MXFAST, 0);
  std::string path = absl::GetFlag(FLAGS_config);
  if (path.empty()) kvf::cli::failUsage("kvf-router", "--config is required");
  auto config = kvf::router::loadRouterConfig(path);
  if (!config.ok()) {
    std::cerr << "kvf-router: " << config.status().message() << "\n";
    return kvf::cli::kExitUsage;
  }
  if (absl::GetFlag(FLAGS_port) >= 0) {
    config->port = static_cast<uint16_t>(absl::GetFlag(FLAGS_port));
  }
  kvf::Nanos busy_poll = config->busy_poll;
  boost::asio::io_context ioc(1);
  kvf::SteadyClock clock;
  auto router = kvf::router::Router::create(ioc, std::move(*config), clock);
  if (!router.ok()) {
    std::cerr << "kvf-router: " << router.status().message() << "\n";
    return kvf::cli::kExitFailure;
  }
  // Machine-readable line for harnesses that start the router on port 0.
  std::cout << "kvf-router listening on port " << (*router)->port() << std::endl;
  if (absl::Status s = ready.publish((*router)->port()); !s.ok()) {
    std::cerr << "kvf-router: " << s.message() << "\n";
    return kvf::cli::kExitFailure;
  }
  boost::asio::signal_set signals(ioc, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code&, int) {
    (*router)->stop();
    ioc.stop();
  });
  // Busy-polling only while a request is in flight: an idle router sleeps at once.
  std::shared_ptr<kvf::router::Router> running = *router;
  kvf::router::runEventLoop(ioc, std::chrono::nanoseconds(busy_poll),
                            [&running] { return running->requestsInFlight() > 0; });
  router->reset();
  return 0;
}
