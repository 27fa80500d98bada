// Publishes KV events on ZMQ in vLLM's format: a PUB socket sends [topic, seq (8-byte BE),
// msgpack EventBatch] and a ROUTER socket replays buffered batches from a requested sequence
// (then the end marker seq = -1 with an empty payload). The first batch after start (seq 0) is
// [AllBlocksCleared]. publish() only enqueues (never blocks on ZMQ) and may be called from any
// thread; one internal thread owns both sockets, encodes, sends and answers replay requests.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/kv_events.h"

namespace kvf::worker {

struct PublisherOptions {
  std::string endpoint = "tcp://*:5557";  // PUB bind address
  std::string replay_endpoint;            // ROUTER bind address; empty disables replay
  std::string topic;                      // vLLM's default: "" (KVEventsConfig.topic)
  size_t buffer_batches = 10000;          // batches kept for replay
  // Encoded bytes kept for replay: the oldest batches are trimmed past either bound (a batch
  // may reach tens of KB, so 10,000 batches alone could hold hundreds of MB).
  size_t buffer_bytes = size_t{64} << 20;
  size_t max_queued_batches = 100000;  // enqueued beyond this are dropped (and counted)
};

class KvEventPublisher {
 public:
  // Binds both sockets (so address errors surface here) and starts the publishing thread,
  // which first publishes [AllBlocksCleared] as seq 0.
  static absl::StatusOr<std::unique_ptr<KvEventPublisher>> create(PublisherOptions options);
  ~KvEventPublisher();
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Enqueues one batch (ignored when empty); timestamp_s is seconds since the Unix epoch.
  void publish(std::vector<KvEvent> events, double timestamp_s);
  // Stops the thread after sending what is queued; idempotent.
  void stop();

  // Resolved addresses (wildcard ports replaced by the bound ones).
  const std::string& endpoint() const { return bound_endpoint_; }
  const std::string& replayEndpoint() const { return bound_replay_endpoint_; }
  uint64_t publishedBatches() const { return published_.load(std::memory_order_relaxed); }
  uint64_t droppedBatches() const { return dropped_.load(std::memory_order_relaxed); }
  uint64_t replayRequests() const { return replays_.load(std::memory_order_relaxed); }
  // Batches and bytes trimmed from the replay buffer to keep it within buffer_bytes (trims by
  // buffer_batches are the normal rotation and not counted here), and the bytes it holds now.
  uint64_t replayTrimmedBatches() const { return trimmed_batches_.load(std::memory_order_relaxed); }
  uint64_t replayTrimmedBytes() const { return trimmed_bytes_.load(std::memory_order_relaxed); }
  uint64_t replayBufferBytes() const { return buffered_bytes_.load(std::memory_order_relaxed); }

 private:
  struct Pending {
    std::vector<KvEvent> events;
    double timestamp_s;
  };
  explicit KvEventPublisher(PublisherOptions options);
  absl::Status bind();
  void run();
  void sendBatch(Pending pending);
  void serveReplay();
  void wake();

  PublisherOptions options_;
  void* context_ = nullptr;
  void* pub_ = nullptr;
  void* router_ = nullptr;
  int wake_fd_ = -1;
  std::string bound_endpoint_;
  std::string bound_replay_endpoint_;

  std::mutex mu_;
  std::deque<Pending> queue_;  // guarded by mu_
  bool stopping_ = false;      // guarded by mu_
  std::thread thread_;

  // Owned by the publishing thread.
  uint64_t next_seq_ = 0;
  std::deque<std::pair<uint64_t, std::string>> replay_buffer_;

  std::atomic<uint64_t> published_{0};
  std::atomic<uint64_t> dropped_{0};
  std::atomic<uint64_t> replays_{0};
  std::atomic<uint64_t> trimmed_batches_{0};
  std::atomic<uint64_t> trimmed_bytes_{0};
  std::atomic<uint64_t> buffered_bytes_{0};  // written by the publishing thread only
};

}  // namespace kvf::worker
