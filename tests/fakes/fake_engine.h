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
#include <mutex>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/json.hpp>

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
  // Text prompts are "tokenized" into one token per this many bytes (a real tokenizer takes
  // 3-6 bytes of English per token).
  int text_bytes_per_token = 1;
  // Advertised worker URL in do_remote_decode answers; empty: this engine's own URL.
  std::string worker_url;
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
  // KV push contract (docs/protocols.md), simulated: a request with kv_transfer_params.source
  // gets the source's blocks (block_hashes, or the whole prompt when absent) as if pushed and
  // answers with kv_transfer_result; do_remote_decode answers with 1 token and
  // kv_transfer_params {source: workerUrl(), block_hashes, lease_id}.
  std::atomic<bool> remote_kv_fails{false};           // receiver falls back to local prefill
  std::atomic<int> remote_decode_status{200};         // != 200: P answers this error
  std::atomic<int> remote_decode_delay_ms{0};         // P answers after this delay
  std::atomic<bool> remote_decode_bad_params{false};  // P answers without block_hashes
  // Failures before the engine looks at the prompt (nothing cached, no KV event): != 0 answers
  // every completion with this HTTP status; > 0 ms opens the response stream and then sends
  // nothing for that long (a hung engine); true makes this engine refuse to push its blocks
  // to a receiver (the receiver reports a fallback).
  std::atomic<int> fail_status{0};
  std::atomic<int> stall_ms{0};
  std::atomic<bool> refuse_push{false};
  std::atomic<bool> tokenize_fails{false};  // POST /tokenize answers 500
  // > 0 ms: every completion waits this long before its answer (a long prefill), while health
  // checks are answered; a client that disconnects meanwhile ends the wait (counted below).
  std::atomic<int> first_byte_delay_ms{0};
  std::atomic<int> waiting_first_byte{0};  // completions inside that wait now
  std::atomic<int> abandoned{0};           // completions whose client left during the wait
  std::string workerUrl() const;
  bool holds(uint64_t hash) const;                        // on the engine's io thread
  size_t cachedBlocks() const { return cached_.size(); }  // on the engine's io thread
  // Every completion body received, in order (thread-safe copy).
  std::vector<std::string> receivedBodies() const;
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
  // kv_transfer_params.source: the tokens "pushed" on top of `local` cached ones, and the
  // kv_transfer_result to report.
  int64_t simulatePush(const boost::json::object& params, const std::vector<uint32_t>& tokens,
                       int64_t local, boost::json::object* result);
  std::vector<uint64_t> blockHashes(const std::vector<uint32_t>& tokens) const;

  absl::flat_hash_set<uint64_t> cached_;
  std::deque<uint64_t> fifo_;
  mutable std::mutex bodies_mutex_;
  std::vector<std::string> bodies_;
  int leases_ = 0;
};

}  // namespace kvf::fakes
