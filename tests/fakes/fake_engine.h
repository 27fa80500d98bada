// Test fake of an engine instance on common/'s HTTP server: /v1/completions and
// /v1/chat/completions (streaming SSE and non-streaming, usage.prompt_tokens_details
// .cached_tokens from its own prefix cache), /v1/models, /health, /metrics, and optionally a
// FakeKvPublisher announcing what it caches under its own hash function. Failure knobs let
// tests make it unhealthy or cut streams. Runs on the io_context given to it (one thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "absl/container/flat_hash_set.h"
#include "common/http_server.h"
#include "tests/fakes/fake_kv_publisher.h"

namespace kvf::fakes {

struct FakeEngineOptions {
  std::string id = "engine";
  uint16_t port = 0;  // 0 picks a free port
  uint32_t block_size = 16;
  size_t capacity_blocks = 1 << 20;  // FIFO eviction beyond this, announced as BlockRemoved
  bool publish_kv_events = false;
  int output_tokens = 4;  // tokens generated per request (at most max_tokens)
  std::chrono::milliseconds token_delay{1};
};

class FakeEngine {
 public:
  FakeEngine(asio::io_context& ioc, FakeEngineOptions options);
  ~FakeEngine();

  uint16_t port() const { return server_->port(); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port()); }
  FakeKvPublisher* publisher() { return publisher_.get(); }
  const FakeEngineOptions& options() const { return options_; }

  // Failure knobs (atomic: set from the test thread).
  std::atomic<bool> healthy{true};
  std::atomic<int> cut_stream_after_chunks{-1};  // >= 0: close the connection mid-stream
  std::atomic<int> requests{0};
  std::atomic<int> running{0};
  // Evicts every cached block and announces it (as vLLM does on reset_prefix_cache).
  void clearCache();
  void stop();

 private:
  asio::awaitable<void> completion(bool chat, const http::Request& r, http::ResponseWriter& w);
  // Looks up and inserts the prompt's blocks; returns the cached prefix length in tokens.
  int64_t cacheLookupAndInsert(const std::vector<uint32_t>& tokens);

  FakeEngineOptions options_;
  std::unique_ptr<http::HttpServer> server_;
  std::unique_ptr<FakeKvPublisher> publisher_;
  absl::flat_hash_set<uint64_t> cached_;
  std::deque<uint64_t> fifo_;
};

}  // namespace kvf::fakes
