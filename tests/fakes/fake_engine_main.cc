// kvf-fake-engine: the test fake engine as a process, for multi-process router tests that
// kill -9 an engine. Prints one line "fake-engine port=P pub=EP replay=EP" when ready.
#include <iostream>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "tests/fakes/fake_engine.h"

ABSL_FLAG(std::string, id, "engine", "Instance id reported in responses.");
ABSL_FLAG(int, port, 0, "HTTP port (0 picks a free one).");
ABSL_FLAG(bool, kv_events, true, "Publish KV events (ZMQ PUB + replay ROUTER on free ports).");
ABSL_FLAG(int, output_tokens, 4, "Tokens generated per request.");
ABSL_FLAG(int, token_delay_ms, 1, "Delay before each generated token.");
ABSL_FLAG(int64_t, capacity_blocks, 1 << 20, "Prefix-cache capacity in blocks (FIFO eviction).");

int main(int argc, char** argv) {
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view f) {
    return f.find("fake_engine_main.cc") != absl::string_view::npos;
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage("Fake engine instance for router tests.");
  absl::ParseCommandLine(argc, argv);
  boost::asio::io_context ioc(1);
  kvf::fakes::FakeEngineOptions options;
  options.id = absl::GetFlag(FLAGS_id);
  options.port = static_cast<uint16_t>(absl::GetFlag(FLAGS_port));
  options.publish_kv_events = absl::GetFlag(FLAGS_kv_events);
  options.output_tokens = absl::GetFlag(FLAGS_output_tokens);
  options.token_delay = std::chrono::milliseconds(absl::GetFlag(FLAGS_token_delay_ms));
  options.capacity_blocks = static_cast<size_t>(absl::GetFlag(FLAGS_capacity_blocks));
  kvf::fakes::FakeEngine engine(ioc, options);
  std::cout << "fake-engine port=" << engine.port();
  if (engine.publisher()) {
    std::cout << " pub=" << engine.publisher()->endpoint()
              << " replay=" << engine.publisher()->replayEndpoint();
  }
  std::cout << std::endl;
  boost::asio::signal_set signals(ioc, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code&, int) {
    engine.stop();
    ioc.stop();
  });
  ioc.run();
  return 0;
}
