// One KV-event subscriber per engine instance: a thread with a ZMQ SUB socket on the engine's
// publisher that decodes each [topic, seq, payload] batch, checks the sequence, recovers gaps
// through the engine's replay socket (DEALER -> ROUTER) and reports a reset when the engine
// restarted (sequence went back) or a gap could not be recovered. Updates go to a sink
// callback on the subscriber's thread; the sink posts them to the routing state's owner.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "router/core/config.h"
#include "router/kv_event_codec.h"

namespace zmq {
class context_t;
}  // namespace zmq

namespace kvf::router {

struct KvUpdate {
  enum class Kind { kBatch, kReset } kind = Kind::kBatch;
  uint64_t seq = 0;
  KvEventBatch batch;  // kBatch
  std::string reason;  // kReset: "restart", "unrecovered_gap"
};

struct KvSubscriberStats {
  std::atomic<uint64_t> batches{0};
  std::atomic<uint64_t> decode_errors{0};
  std::atomic<uint64_t> gaps{0};
  std::atomic<uint64_t> replayed{0};
  std::atomic<uint64_t> unrecovered_gaps{0};
  std::atomic<uint64_t> restarts{0};
};

struct KvSubscriberOptions {
  std::chrono::milliseconds replay_timeout{2000};
  size_t max_payload_bytes = 64u << 20;
  KvEventLimits limits;
};

class KvSubscriber {
 public:
  using Sink = std::function<void(KvUpdate&&)>;

  // Starts the thread; connecting is asynchronous (ZMQ reconnects on its own).
  KvSubscriber(std::shared_ptr<zmq::context_t> context, KvEventsConfig config, Sink sink,
               KvSubscriberOptions options = {});
  ~KvSubscriber();  // stops and joins
  KvSubscriber(const KvSubscriber&) = delete;
  KvSubscriber& operator=(const KvSubscriber&) = delete;

  const KvSubscriberStats& stats() const { return stats_; }

 private:
  void run();

  std::shared_ptr<zmq::context_t> context_;
  KvEventsConfig config_;
  Sink sink_;
  KvSubscriberOptions options_;
  KvSubscriberStats stats_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kvf::router
