// Test fake of an engine's KV-event publisher in vLLM's wire format: ZMQ PUB of
// [topic, seq (8B BE), msgpack batch] and a ROUTER replay socket answering
// ["", start_seq] with every buffered batch from start_seq and the end marker. Lets tests drop
// a batch (gap), restart the sequence, and encode events as arrays or maps, hashes as
// integers or bytes. Thread-safe: publish from the test thread; replay runs on its own thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

namespace kvf::fakes {

struct FakeKvEvent {
  enum class Kind { kStored, kRemoved, kCleared } kind = Kind::kStored;
  std::vector<uint64_t> hashes;
  std::optional<uint64_t> parent;
  std::vector<uint32_t> token_ids;
  uint32_t block_size = 16;
};

struct EncodeOptions {
  bool map_events = false;    // newer vLLM: {"type": ..., ...}
  bool bytes_hashes = false;  // hashes as 32-byte bin (the uint64 big-endian, zero-padded)
};

// A msgpack [ts, [events...], null] batch.
std::string encodeBatch(const std::vector<FakeKvEvent>& events, const EncodeOptions& options,
                        double ts);

class FakeKvPublisher {
 public:
  FakeKvPublisher(std::string topic = "");  // vLLM's default topic
  ~FakeKvPublisher();

  std::string endpoint() const { return pub_endpoint_; }
  std::string replayEndpoint() const { return replay_endpoint_; }

  // Publishes (or with `drop`, only buffers for replay) the next batch; returns its seq.
  uint64_t publish(const std::vector<FakeKvEvent>& events, bool drop = false);
  // Engine restart: the buffer empties and the next batch is seq 0.
  void restart();
  EncodeOptions options;

 private:
  void serveReplay();

  std::string topic_;
  zmq::context_t context_{1};
  zmq::socket_t pub_;
  std::string pub_endpoint_;
  std::string replay_endpoint_;
  std::mutex mu_;
  uint64_t next_seq_ = 0;
  std::map<uint64_t, std::string> buffer_;
  std::atomic<bool> stop_{false};
  std::thread replay_thread_;
  zmq::socket_t router_;
};

}  // namespace kvf::fakes
